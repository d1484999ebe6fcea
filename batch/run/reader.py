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

import pyarrow as pa
import pyarrow.parquet as pq

from batch.run.input_line import ENVELOPE_KEYS, InputLine, LineError, LineParser

DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_CHUNK_BYTES = 1 << 16
_INFINITIES = (math.inf, -math.inf)
_SCAN_CHUNK_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"
_MAX_REASONS, _MAX_EXAMPLES = 100, 5  # what check_input keeps of an input whose lines are all invalid
# A binary stream read line by line: an open file, a GzipFile, a BufferedReader.
ByteStream: TypeAlias = BinaryIO | io.BufferedIOBase


class InputFormatError(ValueError):
    """The input file as a whole cannot be read (a usage error, not a bad line)."""


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
        schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises several types for "not Parquet"
        raise InputFormatError(f"{path}: cannot read as Parquet: {exc}") from None
    names = schema.names
    for where, fields in [("", names), *(found for f in schema for found in _struct_fields(f.type, f.name))]:
        repeated = [name for name, count in Counter(fields).items() if count > 1]  # a row's dict keeps one
        if repeated:
            what = f"fields of {where} are" if where else "columns are"
            raise InputFormatError(f"{path}: {fields.count(repeated[0])} {what} named {repeated[0]!r}: "
                                   "rename or drop all but one")
    if "body" in names:
        extra = sorted(set(names) - set(ENVELOPE_KEYS))
        if extra:
            raise InputFormatError(f"{path}: a Parquet file with a 'body' column may only have "
                                   f"{', '.join(ENVELOPE_KEYS)} columns, also has {extra}")
    return _parquet_lines(path, wrapped="body" in names)


def _struct_fields(kind: pa.DataType, where: str) -> Iterator[tuple[str, list[str]]]:
    """(path, field names) of every struct inside a column's type, lists' and maps' items included."""
    if isinstance(kind, pa.StructType):
        yield where, [field.name for field in kind]
        children = [(field.type, f"{where}.{field.name}") for field in kind]
    elif isinstance(kind, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)):
        children = [(kind.value_type, f"{where}[]")]
    elif isinstance(kind, pa.MapType):
        children = [(kind.item_type, f"{where}[]")]
    else:
        children = []
    for child, path in children:
        yield from _struct_fields(child, path)


def _parquet_lines(path: Path, wrapped: bool) -> Iterator[InputLine]:
    lines = LineParser()
    line_no = 0
    with pq.ParquetFile(path) as parquet:
        for batch in parquet.iter_batches():
            for row, unreadable in _batch_rows(batch):
                line_no += 1
                try:
                    if unreadable is not None:
                        raise LineError(unreadable)
                    record = _row_record(row, wrapped)
                except LineError as exc:
                    yield lines.failed(line_no, str(exc), _given_id(row))
                    continue
                yield lines.parse(line_no, record, wrapped=wrapped)


# What pyarrow raises for a value Python cannot hold: a nanosecond timestamp (ValueError), a map with a key twice
# (KeyError), a value past its type's range
_UNREADABLE = (ValueError, KeyError, TypeError, OverflowError, pa.ArrowException)


def _batch_rows(batch: pa.RecordBatch) -> Iterator[tuple[dict, str | None]]:
    """The batch's rows as Python values, each with why one of its values cannot be read (None when all can):
    converted whole, else column by column and, in a column that fails, value by value, so one row's value
    is that row's error, not the batch's."""
    try:
        rows = batch.to_pylist(maps_as_pydicts="strict")
    except _UNREADABLE:
        pass
    else:
        yield from ((row, None) for row in rows)
        return
    columns: dict[str, list] = {}
    errors: dict[int, str] = {}
    for name, column in zip(batch.schema.names, batch.columns):
        try:
            columns[name] = column.to_pylist(maps_as_pydicts="strict")
            continue
        except _UNREADABLE:
            values = columns[name] = []
        for index in range(len(column)):
            try:
                values.append(column[index].as_py(maps_as_pydicts="strict"))
            except _UNREADABLE as exc:
                values.append(None)
                errors.setdefault(index, f"{name}: Parquet value of type {column.type} cannot be read as JSON "
                                         f"(store it as a string or number): {exc}")
    for index in range(batch.num_rows):
        yield {name: values[index] for name, values in columns.items()}, errors.get(index)


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
