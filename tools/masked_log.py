"""A stdio server's stderr on its way to the tools log, with the run's secrets masked.

A server that prints its environment (or a token it was given) to stderr would put the
secret into `DB.tools.log`: its stderr goes into a pipe instead, and a thread copies each
line to the log through `ServerSpec.mask`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import IO


class MaskedStderr:
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


def _copy(reader: IO[str], log: IO[str], mask: Callable[[str], str | None]) -> None:
    with reader:
        for line in reader:
            try:
                log.write(mask(line) or line)
                log.flush()
            except ValueError:  # the log was closed at the run's end: the rest is dropped
                return
