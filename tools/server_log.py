"""A stdio server's stderr on its way to the tools log: secrets masked, known noise dropped; and
the mcp package's own log records (`ClientLog`).

A server that prints its environment (or a token it was given) to stderr would put the
secret into `DB.tools.log`: its stderr goes into a pipe instead, and a thread copies each
line to the log through `ServerSpec.mask`.

Noise: the mcp 2.x client first probes a server with the 2026 `server/discover` request
and falls back to the initialize handshake when the server rejects it. Servers built on
mcp 1.x log that rejection as a ~30-line pydantic warning ("Failed to validate request:
31 validation errors for ClientRequest ...") on every connection; that block is dropped
(#28 item 9). A block about anything else is kept whole.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import IO

NOISE_START = "Failed to validate request"
NOISE_MARK = "server/discover"
MAX_REPEATS = 20  # records of one kind the mcp package logs that reach the tools log (ClientLog)
MAX_BLOCK_LINES = 500  # a block longer than any probe warning is kept: it is not that warning
# A pydantic error's continuation: indented (rich's wrapped columns, the messages), or a bare
# location such as `InitializeRequest.params.capabilities` (plain logging's format).
_CONTINUATION = re.compile(r"^(\s+\S|[A-Za-z_][\w.\[\]-]*\s*$)")


class ServerStderr:
    """The write end (`writer`) is the server's stderr; `close()` our copy once it has started."""

    def __init__(self, log: IO[str], mask: Callable[[str], str | None]):
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w", encoding="utf-8")
        reader = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self._thread = threading.Thread(target=_copy, args=(reader, log, mask), name="batchrun-stderr", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Close our copy of the write end: the copy thread ends when the server's copy closes too."""
        self.writer.close()


class ProbeNoiseFilter:
    """Lines in, lines out, less the blocks that reject the `server/discover` probe.

    A block starts at a line naming NOISE_START and runs while lines continue it; it is
    held back until it ends, then dropped if it names NOISE_MARK, else passed on.
    """

    def __init__(self) -> None:
        self._block: list[str] | None = None

    def feed(self, line: str) -> Iterator[str]:
        if self._block is not None:
            if _CONTINUATION.match(line) and len(self._block) < MAX_BLOCK_LINES:
                self._block.append(line)
                return
            yield from self.flush()
        if NOISE_START in line:
            self._block = [line]
        else:
            yield line

    def flush(self) -> Iterator[str]:
        """The end of the stream: a block still held back ends here."""
        block, self._block = self._block, None
        if block is not None and not any(NOISE_MARK in held for held in block):
            yield from block


class ClientLog(logging.Handler):
    """The mcp package's log records in the tools log, one masked line each, while it is attached.

    The package logs a traceback for every line a stdio server prints on stdout that is not
    JSON-RPC (a banner, a stray print), and with no handler of its own logging's last resort
    printed each on batchrun's stderr, under --quiet too. A server that prints without end
    (`yes`) logs ~5 MB a second: past MAX_REPEATS records of one kind the rest are dropped."""

    def __init__(self, log: IO[str], mask: Callable[[str], str | None]):
        super().__init__(logging.WARNING)
        self._log, self._mask = log, mask
        self._seen: Counter[str] = Counter()
        logging.getLogger("mcp").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self._seen[str(record.msg)] += 1
        if self._seen[str(record.msg)] > MAX_REPEATS:
            return
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f": {record.exc_info[1]}"
        if self._seen[str(record.msg)] == MAX_REPEATS:
            text += f" (the {MAX_REPEATS}th such record: later ones are not logged)"
        _write(self._log, iter([f"{record.name}: {' '.join(text.split())}\n"]), self._mask)

    def close(self) -> None:
        logging.getLogger("mcp").removeHandler(self)
        super().close()


def _copy(reader: IO[str], log: IO[str], mask: Callable[[str], str | None]) -> None:
    noise = ProbeNoiseFilter()
    with reader:
        for line in reader:
            if not _write(log, noise.feed(line), mask):
                return
        _write(log, noise.flush(), mask)


def _write(log: IO[str], lines: Iterator[str], mask: Callable[[str], str | None]) -> bool:
    try:
        for line in lines:
            log.write(mask(line) or line)
        log.flush()
        return True
    except ValueError:  # the log was closed at the run's end: the rest is dropped
        return False
