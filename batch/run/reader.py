"""JSONL/Parquet input -> a stream of `InputLine`s, one per request line.

Bad lines never stop the read: each becomes an `InputLine` whose `error`
names the line and the field; an empty or whitespace-only line is one too
(every line is one row). Only a file batchrun cannot read at all (an
unknown extension, a missing file, a Parquet file it cannot open) raises
`InputFormatError`, at once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias

import pyarrow.parquet as pq

from batch.responses.request import ResponsesRequest, parse_request
from batch.responses.request_errors import RequestError, json_type, wrong_shape
from batch.responses.standard_json import NonFiniteError, find_non_finite

DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_CHUNK_BYTES = 1 << 16
_INFINITIES = (math.inf, -math.inf)
_SCAN_CHUNK_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"
_MAX_REASONS, _MAX_EXAMPLES = 100, 5  # what check_input keeps of an input whose lines are all invalid
_ENVELOPE_KEYS = ("custom_id", "method", "url", "body")
_ROUTE = {"method": "POST", "url": "/v1/responses"}
# A binary stream read line by line: an open file, a GzipFile, a BufferedReader.
ByteStream: TypeAlias = BinaryIO | io.BufferedIOBase


class InputFormatError(ValueError):
    """The input file as a whole cannot be read (a usage error, not a bad line)."""


class LineError(Exception):
    """One line that is not a request (the message leaves out the line number)."""


@dataclass
class InputLine:
    """One input line (JSONL) or row (Parquet): a validated request or an error."""

    line_no: int
    custom_id: str
    body: dict | None
    request: ResponsesRequest | None
    ignored_fields: list[str] = field(default_factory=list)
    error: str | None = None
    epoch: int = 0  # which of the run's --epochs samples of this line (each is its own requests row)

    @property
    def is_valid(self) -> bool:
        return self.error is None and self.request is not None


def read_requests(path: str | Path, *,
                  max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[InputLine]:
    """Stream the requests of a `.jsonl`/`.ndjson`/`.json` (optionally `.gz`) or `.parquet` file.

    Raises InputFormatError at once for a file that cannot be read at all.
    """
    path = Path(path)
    if max_line_bytes < 1:
        raise InputFormatError(f"max_line_bytes must be at least 1, got {max_line_bytes}")
    if not path.exists():
        raise InputFormatError(f"{path}: no such file")
    if not path.is_file():
        raise InputFormatError(f"{path}: not a regular file (a pipe or a device): batchrun reads the input more "
                               "than once (it hashes it, to resume a run, then decodes it); write it to a file "
                               "first (zcat f.jsonl.gz > f.jsonl, or pass f.jsonl.gz itself)")
    name = path.name.lower()
    if name.endswith(".parquet"):
        return _read_parquet(path)
    compressed = name.endswith(".gz")
    if not name.removesuffix(".gz").endswith(JSONL_SUFFIXES):
        raise InputFormatError(f"{path}: unknown input format (expected .jsonl, .ndjson, .json, "
                               f"one of those with .gz, or .parquet)")
    return _read_jsonl_file(path, compressed, max_line_bytes)


@dataclass
class InputCheck:
    """What reading the input up to its first valid line found (the whole input when none is)."""

    num_read: int = 0
    first_valid: int | None = None  # its line number
    # Why lines are invalid (the error without its line number) -> how many, and the first few of them.
    reasons: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[int]] = field(default_factory=dict)

    @property
    def has_valid_line(self) -> bool:
        return self.first_valid is not None

    def add_invalid(self, line: InputLine) -> None:
        reason = (line.error or "").removeprefix(f"line {line.line_no}: ")
        if reason not in self.reasons and len(self.reasons) >= _MAX_REASONS:
            reason = "(other reasons)"
        self.reasons[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < _MAX_EXAMPLES:
            shown.append(line.line_no)


def check_input(path: str | Path, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                limit: int | None = None) -> InputCheck:
    """Read `path` until a line is a valid request (at most `limit` lines): cheap for a usable
    input, the whole file's verdict for one where no line is. Raises InputFormatError as
    `read_requests` does."""
    check = InputCheck()
    for line in read_requests(path, max_line_bytes=max_line_bytes):
        if limit is not None and check.num_read >= limit:
            break
        check.num_read += 1
        if line.is_valid:
            check.first_valid = line.line_no
            break
        check.add_invalid(line)
    return check


@dataclass(frozen=True)
class InputScan:
    """What one pass over the input file's bytes tells before decoding starts."""

    sha256: str          # of the file as stored (compressed, for .gz)
    num_requests: int    # JSONL lines (empty ones too: each is a row), or Parquet rows


def scan_input(path: str | Path) -> InputScan:
    """The input's sha256 and request count in one read of its bytes (Parquet: rows from the footer)."""
    path = Path(path)
    digest = hashlib.sha256()
    name = path.name.lower()
    if name.endswith(".parquet"):
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(_SCAN_CHUNK_BYTES), b""):
                digest.update(chunk)
        try:
            return InputScan(digest.hexdigest(), pq.ParquetFile(path).metadata.num_rows)
        except Exception as exc:  # pyarrow raises several types for "not Parquet"
            raise InputFormatError(f"{path}: cannot read as Parquet: {exc}") from None
    counter = _LineCounter(gzipped=name.endswith(".gz"))
    try:
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(_SCAN_CHUNK_BYTES), b""):
                digest.update(chunk)
                counter.feed(chunk)
        return InputScan(digest.hexdigest(), counter.finish())
    except zlib.error as exc:
        raise InputFormatError(f"{path}: cannot read as gzip: {exc}") from None


class _LineCounter:
    """Counts the lines of a byte stream fed in chunks (gunzipping it on the way), as
    `_physical_lines` reads them: every newline ends one, and bytes after the last one
    are one more."""

    def __init__(self, gzipped: bool):
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        self.count = 0
        self._fed = False
        self._open_line = False  # bytes since the last newline

    def feed(self, chunk: bytes) -> None:
        self._fed = True
        while self._inflate is not None:
            data = self._inflate.decompress(chunk)
            self._count(data)
            if not (self._inflate.eof and self._inflate.unused_data.strip(b"\0")):
                return  # (zero padding after the last member is allowed, as gzip.open does)
            chunk = self._inflate.unused_data  # a gzip file may hold several members
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._count(chunk)

    def _count(self, data: bytes) -> None:
        if not data:
            return
        self.count += data.count(b"\n")
        self._open_line = not data.endswith(b"\n")

    def finish(self) -> int:
        if self._inflate is not None and self._fed and not self._inflate.eof:
            raise zlib.error("the compressed stream ends early")
        return self.count + self._open_line


def _read_jsonl_file(path: Path, compressed: bool, max_line_bytes: int) -> Iterator[InputLine]:
    if not compressed:
        with path.open("rb") as handle:
            yield from iter_jsonl(handle, max_line_bytes=max_line_bytes)
        return
    # A file that is not gzip (BadGzipFile, an OSError), or one cut or corrupt before the first
    # valid line (EOFError, zlib.error), ended `submit`'s input check in a traceback.
    try:
        with gzip.open(path, "rb") as handle:
            yield from iter_jsonl(handle, max_line_bytes=max_line_bytes)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputFormatError(f"{path}: cannot read as gzip: {exc}") from None


def iter_jsonl(handle: ByteStream, *,
               max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[InputLine]:
    """InputLines from a binary JSONL stream, read one line at a time."""
    lines = LineParser()
    for line_no, data, size in _physical_lines(handle, max_line_bytes):
        if data is None:
            yield lines.failed(line_no, f"line is {size:,} bytes, over the {max_line_bytes:,}-byte "
                                        f"limit (--max-line-bytes)")
            continue
        if line_no == 1 and data.startswith(_BOM):
            data = data[len(_BOM):]
        if not data.strip():  # every line is one row: an empty line is an invalid one
            yield lines.failed(line_no, "empty line" if not data else "empty line (whitespace only)")
            continue
        numbers: list[str] = []
        try:
            value = _decode(data, numbers)
        except LineError as exc:
            yield lines.failed(line_no, str(exc))
            continue
        yield lines.parse(line_no, value, finite=not numbers)


def _physical_lines(handle: ByteStream,
                    max_line_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """(line_no, bytes without the newline, size); bytes is None past the limit.

    An oversized line is skipped in chunks, so no more than the limit (plus
    one chunk) of it is ever held.
    """
    line_no = 0
    while True:
        data = handle.readline(max_line_bytes + 1)
        if not data:
            return
        line_no += 1
        if data.endswith(b"\n"):
            yield line_no, data[:-1], len(data) - 1
        elif len(data) <= max_line_bytes:
            yield line_no, data, len(data)  # the last line, with no newline
        else:
            yield line_no, None, _skip_rest(handle, len(data))


def _skip_rest(handle: ByteStream, size: int) -> int:
    """Read to the end of the current line; its total size without the newline."""
    while True:
        chunk = handle.readline(_CHUNK_BYTES)
        if not chunk:
            return size
        if chunk.endswith(b"\n"):
            return size + len(chunk) - 1
        size += len(chunk)


def _decode(data: bytes, not_json: list[str] | None = None) -> Any:
    """A line's JSON value. NaN, Infinity and numbers past a double (1e999) decode as floats, each noted
    in `not_json`: LineParser.parse names the field that holds one (not JSON, so the line is invalid)."""
    noted = [] if not_json is None else not_json

    def constant(name: str) -> float:
        noted.append(name)
        return float(name)

    def number(text: str) -> float:
        value = float(text)
        if value in _INFINITIES:
            noted.append(text)
        return value

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LineError(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_constant=constant, parse_float=number)
    except json.JSONDecodeError as exc:
        # json's messages end where the column goes ("Unterminated string starting at")
        raise LineError(f"invalid JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}") from None
    except RecursionError:
        raise LineError("invalid JSON: nested too deeply") from None
    except ValueError:  # Python refuses to read an integer of more than sys.get_int_max_str_digits() digits
        raise LineError(f"invalid JSON: an integer longer than {sys.get_int_max_str_digits():,} digits") from None
    if "\\u" in text:  # an escape may be half a surrogate pair: not Unicode, and no store can hold it
        _reject_lone_surrogates(value)
    return value


def _reject_lone_surrogates(value: Any) -> None:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LineError(f"invalid JSON: {exc.object[exc.start:exc.end]!a} is half of a surrogate pair "
                        "(not valid Unicode)") from None


# --- Parquet -------------------------------------------------------------

def _read_parquet(path: Path) -> Iterator[InputLine]:
    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # pyarrow raises several types for "not Parquet"
        raise InputFormatError(f"{path}: cannot read as Parquet: {exc}") from None
    repeated = [name for name, count in Counter(names).items() if count > 1]  # a row's dict keeps one of them
    if repeated:
        raise InputFormatError(f"{path}: {names.count(repeated[0])} columns are named {repeated[0]!r}: "
                               "rename or drop all but one")
    if "body" in names:
        extra = sorted(set(names) - set(_ENVELOPE_KEYS))
        if extra:
            raise InputFormatError(f"{path}: a Parquet file with a 'body' column may only have "
                                   f"{', '.join(_ENVELOPE_KEYS)} columns, also has {extra}")
    return _parquet_lines(path, wrapped="body" in names)


def _parquet_lines(path: Path, wrapped: bool) -> Iterator[InputLine]:
    lines = LineParser()
    line_no = 0
    with pq.ParquetFile(path) as parquet:
        for batch in parquet.iter_batches():
            for row in batch.to_pylist(maps_as_pydicts="strict"):
                line_no += 1
                try:
                    record = _row_record(row, wrapped)
                except LineError as exc:
                    yield lines.failed(line_no, str(exc), _given_id(row))
                    continue
                yield lines.parse(line_no, record, wrapped=wrapped)


def _row_record(row: dict, wrapped: bool) -> dict:
    """A row as the JSON object a JSONL line would hold.

    A null in Parquet means "not given" (columns and struct fields are shared
    by every row), so null values are dropped, except in a JSON `body` string.
    """
    if not wrapped:
        return _drop_nulls(row)
    record = {key: value for key, value in row.items() if key != "body" and value is not None}
    body = row.get("body")
    if isinstance(body, (str, bytes)):
        record["body"] = _decode(body.encode("utf-8") if isinstance(body, str) else body)
    elif body is not None:
        record["body"] = _drop_nulls(body)
    return record


_JSON_SCALARS = (str, int, float, bool)


def _drop_nulls(value: Any, where: str = "") -> Any:
    """Drop nulls; a value JSON cannot hold (timestamp, bytes, decimal) is a line error."""
    if isinstance(value, dict):
        return {key: _drop_nulls(item, f"{where}.{key}" if where else key)
                for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_drop_nulls(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, _JSON_SCALARS):
        raise LineError(f"{where or 'value'}: Parquet value of type {type(value).__name__} "
                        "is not JSON (store it as a string or number)")
    return value


def _given_id(row: dict) -> str | None:
    custom_id = row.get("custom_id")
    return custom_id if isinstance(custom_id, str) and custom_id else None


# --- one record -> InputLine ---------------------------------------------

class LineParser:
    """Turns decoded lines into InputLines, remembering custom_ids to catch duplicates."""

    def __init__(self) -> None:
        self.first_seen: dict[str, int] = {}

    def failed(self, line_no: int, message: str, custom_id: str | None = None) -> InputLine:
        """An InputLine for a line that could not be decoded at all."""
        custom_id = custom_id or f"line-{line_no}"
        self._claim(line_no, custom_id)
        return InputLine(line_no, custom_id, None, None, error=f"line {line_no}: {message}")

    def parse(self, line_no: int, value: Any, *, wrapped: bool = False, finite: bool = False) -> InputLine:
        """An InputLine for a decoded JSON value: a bare body, a batch envelope or,
        if `wrapped`, a Parquet `{custom_id, body}` row (method, url optional). `finite`: the
        decoder saw no NaN or infinity in it (else every number is looked at)."""
        if not isinstance(value, dict):
            return self.failed(line_no, f"expected a JSON object, got {json_type(value)}")
        # A Responses body has no url or method: a line with either is an envelope, its body missing or not
        envelope = wrapped or "url" in value or "method" in value
        custom_id, body, problem = _split(line_no, value, envelope, id_required=not wrapped)
        duplicate = self._claim(line_no, custom_id)
        not_json = None if finite else _non_finite(value, body, envelope)
        problem = problem or duplicate or not_json
        if problem is None and envelope:
            problem = _envelope_problem(value, route_required=not wrapped)
        request: ResponsesRequest | None = None
        ignored: list[str] = []
        if problem is None and isinstance(body, dict):
            problem = wrong_shape(body)
        if problem is None:
            try:
                request, ignored = parse_request(body)
            except RequestError as exc:
                problem = str(exc)
        if not_json is not None:
            body = None  # not JSON (as a line that does not parse): no body to store
        return InputLine(line_no, custom_id, body if isinstance(body, dict) else None, request,
                         ignored_fields=ignored,
                         error=None if problem is None else f"line {line_no}: {problem}")

    def _claim(self, line_no: int, custom_id: str) -> str | None:
        first = self.first_seen.setdefault(custom_id, line_no)
        if first != line_no:
            return f"custom_id: duplicate {custom_id!r} (first seen on line {first})"
        return None


def _split(line_no: int, value: dict, envelope: bool,
           id_required: bool) -> tuple[str, Any, str | None]:
    """(custom_id, body, problem with the custom_id or None)."""
    if envelope:
        body = value.get("body")
    else:
        body = {key: item for key, item in value.items() if key != "custom_id"}
    default = f"line-{line_no}"
    if "custom_id" not in value:
        return default, body, "custom_id: required" if envelope and id_required else None
    custom_id = value["custom_id"]
    if isinstance(custom_id, str) and custom_id:
        return custom_id, body, None
    return default, body, f"custom_id: expected a non-empty string, got {_shown(custom_id)}"


def _non_finite(value: dict, body: Any, envelope: bool) -> str | None:
    """Where the line holds NaN, an infinity or a number past a double (1e999, which reads as
    Infinity), none of them JSON (the Responses API refuses such a body as invalid JSON): a field
    of the body named as in the body, another key of an envelope as in the line."""
    found = find_non_finite(body) if isinstance(body, dict) else None
    if found is None and envelope:
        found = find_non_finite({key: item for key, item in value.items() if key != "body"})
    if found is None:
        return None
    where, number = found
    beyond = " (a number too large for a double, such as 1e999, reads as one)" if math.isinf(number) else ""
    return f"{NonFiniteError(where, number)}{beyond}"


def _envelope_problem(value: dict, route_required: bool) -> str | None:
    for key in value:
        if key not in _ENVELOPE_KEYS:
            return f"{key}: unknown field {key!r} in a batch envelope"
    for key, expected in _ROUTE.items():
        if key not in value and route_required:
            return f"{key}: required in a batch envelope"
        if key in value and value[key] != expected:
            hint = (" (a Chat Completions batch: set url to /v1/responses and rename body.messages to "
                    "body.input)" if value[key] == "/v1/chat/completions" else "")
            return f"{key}: expected {expected!r}, got {_shown(value[key])}{hint}"
    if "body" not in value:
        return "body: required in a batch envelope"
    if not isinstance(value["body"], dict):
        return f"body: expected a JSON object, got {json_type(value['body'])}"
    return None


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else json_type(value)
