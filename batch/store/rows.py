"""One typed row shape per table of the batchrun database, and its Arrow schema.

Each table is a dataclass; its Arrow schema is derived from the field types, so a
column is declared once. `Int32`, `Json` (a python value, dumped on write) and
`JsonText` (JSON already serialised, as event payloads are on the hot path) say
what a plain python type cannot. Rows are built by `batch.run.results` (and the
evals/bench modules) and written only by `batch.store.store`, column by column.

Events are the one table written per token, so a response's events are kept as
columns from the start (`EventColumns`): the hot path appends to lists and the
store hands them to Arrow without building a row object per event.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import pyarrow as pa

from batch.responses.events import EventColumns, json_text

# Columns stored with DuckDB's JSON type travel through Arrow as strings;
# this field metadata marks them.
JSON_METADATA = {b"duckdb_type": b"JSON"}


class _JsonValue:
    """Marks a python value that the store dumps to JSON."""


class _JsonText:
    """Marks a string that already holds JSON."""


Int32 = Annotated[int, pa.int32()]
Json = Annotated[Any, _JsonValue]
JsonText = Annotated[str, _JsonText]

_ARROW_TYPES: dict[Any, pa.DataType] = {
    str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(),
    datetime: pa.timestamp("us", tz="UTC"),
}


# -- the tables -----------------------------------------------------------------

@dataclass(slots=True)
class RunRow:
    run_id: str
    started_at: datetime | None = None
    finished_at: datetime | None = None
    input_path: str | None = None
    input_sha256: str | None = None
    model: str | None = None
    engine_config: Json = None
    options: Json = None
    status: str | None = None  # a RunStatus
    n_requests: int | None = None
    notes: Json = None
    batchrun_version: str | None = None


@dataclass(slots=True)
class RequestRow:
    run_id: str
    custom_id: str
    line_no: int
    request_hash: str | None = None
    body: Json = None
    status: str | None = None  # a RequestStatus
    error: str | None = None
    response_id: str | None = None
    written_at: datetime | None = None
    worker: str | None = None  # the shard or Ray worker that decoded it (None: a one-process run)


@dataclass(slots=True)
class ResponseRow:
    run_id: str
    custom_id: str
    response_id: str
    status: str
    response: Json
    input_items: Json = None
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    tool_output_tokens: int = 0
    total_tokens: int = 0
    num_turns: Int32 = 0
    latency_s: float | None = None
    ttft_s: float | None = None
    created_at: datetime | None = None


@dataclass(slots=True)
class EventRow:
    run_id: str
    response_id: str
    sequence_number: Int32
    type: str
    output_index: Int32 | None
    content_index: Int32 | None
    item_id: str | None
    payload: JsonText
    turn: Int32 = 0     # the model turn during (or right after) which it was emitted
    t_ms: float = 0.0   # milliseconds since the response started


@dataclass(slots=True)
class TurnRow:
    run_id: str
    response_id: str
    turn: Int32
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    tool_output_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str | None = None
    kind: str = "model"  # "sampling": decoded for an MCP server's sampling request


@dataclass(slots=True)
class ToolCallRow:
    run_id: str
    response_id: str
    call_id: str | None
    tool_type: str | None
    server_label: str | None
    name: str | None
    arguments: str | None
    output: str | None
    status: str
    error: str | None
    started_at: datetime | None
    duration_s: float
    error_kind: str | None = None  # a ToolErrorKind
    output_bytes: int | None = None  # of the output before it was cut for the model
    output_truncated: bool = False
    attempts: Int32 = 1  # 2: retried after its MCP server crashed
    result: Json = None  # the MCP result as the server sent it (every content block), secrets masked


@dataclass(slots=True)
class TokenRow:
    run_id: str
    response_id: str
    turn: Int32
    prompt_token_ids: list[Int32]
    completion_token_ids: list[Int32]


@dataclass(slots=True, kw_only=True)
class GradeRow:
    run_id: str
    custom_id: str
    response_id: str | None = None  # None: the line has no response (invalid)
    grader: str
    score: float | None = None
    passed: bool | None = None
    explanation: str | None = None
    tags: list[str] | None = None
    options: Json = None  # the grader's options, `expected` included
    suite: str | None = None
    graded_at: datetime | None = None


@dataclass(slots=True)
class BenchRow:
    bench_id: str
    started_at: datetime | None
    model: str | None
    workload: str
    system: str
    num_requests: int
    prompt_tokens: int | None
    prefill_tokens: int | None
    output_tokens: int
    wall_s: float
    ttft_s: float | None
    output_tok_s: float | None
    total_tok_s: float | None
    peak_rss_mb: float | None
    stats: Json = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p99_s: float | None = None


ROW_TYPES: dict[str, type] = {
    "runs": RunRow, "requests": RequestRow, "responses": ResponseRow, "events": EventRow,
    "turns": TurnRow, "tool_calls": ToolCallRow, "tokens": TokenRow, "grades": GradeRow,
    "bench": BenchRow,
}


# -- Arrow schemas, derived -------------------------------------------------------

def _arrow_field(name: str, hint: Any) -> pa.Field:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in args if arg is not type(None))
        args = typing.get_args(hint)
    if typing.get_origin(hint) is Annotated:
        mark = args[1]
        if mark in (_JsonValue, _JsonText):
            return pa.field(name, pa.string(), metadata=JSON_METADATA)
        return pa.field(name, mark)
    if typing.get_origin(hint) is list:
        return pa.field(name, pa.list_(_arrow_field("item", args[0]).type))
    return pa.field(name, _ARROW_TYPES[hint])


def schema_of(row_type: type) -> pa.Schema:
    """The Arrow schema of a row dataclass, in field order."""
    hints = typing.get_type_hints(row_type, include_extras=True)
    return pa.schema([_arrow_field(f.name, hints[f.name]) for f in dataclasses.fields(row_type)])


SCHEMAS: dict[str, pa.Schema] = {table: schema_of(row_type) for table, row_type in ROW_TYPES.items()}
_DUMPED = {table: {f.name for f, hint in zip(dataclasses.fields(row_type),
                                              typing.get_type_hints(row_type, include_extras=True).values())
                   if _JsonValue in typing.get_args(hint)}
           for table, row_type in ROW_TYPES.items()}


R = typing.TypeVar("R")


def row_from(row_type: type[R], record: object, **fields: Any) -> R:
    """A `row_type` row: ``fields`` as given, every other field read by name from ``record``
    (rows are built by name, so a field added or reordered on either side cannot shift)."""
    names = [f.name for f in dataclasses.fields(row_type)]  # type: ignore[arg-type]
    return row_type(**{name: fields[name] if name in fields else getattr(record, name) for name in names})


def is_json(arrow_field: pa.Field) -> bool:
    """True when the field is stored in a DuckDB JSON column."""
    return (arrow_field.metadata or {}).get(b"duckdb_type") == b"JSON"


def dumps(value: Any) -> str | None:
    """Like `json_text`, but None stays NULL."""
    return None if value is None else json_text(value)


def to_arrow(table: str, rows: list) -> pa.Table:
    """Arrow table of ``rows`` (dataclass instances of the table's row type)."""
    row_type, schema = ROW_TYPES[table], SCHEMAS[table]
    for row in rows:
        if type(row) is not row_type:
            raise TypeError(f"{table} rows must be {row_type.__name__}, got {type(row).__name__}")
    dumped = _DUMPED[table]
    columns = {}
    for name in schema.names:
        values = [getattr(row, name) for row in rows]
        columns[name] = [dumps(v) for v in values] if name in dumped else values
    return pa.table(columns, schema=schema)


def json_columns(table: str) -> set[str]:
    """Columns of ``table`` whose python values are dumped to JSON on write."""
    return _DUMPED[table]


# -- events, column by column ------------------------------------------------------

EVENT_COLUMNS = tuple(name for name in SCHEMAS["events"].names if name not in ("run_id", "response_id"))


# EventColumns (the event machine's own) must name every events column but the owners, so a
# column added to EventRow and not there fails at import.
if set(EventColumns.__slots__) != set(EVENT_COLUMNS):
    raise TypeError(f"EventColumns must hold exactly the events columns: {EVENT_COLUMNS}")


def events_to_arrow(owners: list[tuple[str, str | None]], columns: list[EventColumns]) -> pa.Table:
    """One Arrow table of the events of several responses: (run_id, response_id) each."""
    data: dict[str, list] = {"run_id": [], "response_id": []}
    data.update({name: [] for name in EVENT_COLUMNS})
    for (run_id, response_id), events in zip(owners, columns):
        count = len(events)
        data["run_id"].extend([run_id] * count)
        data["response_id"].extend([response_id] * count)
        for name in EVENT_COLUMNS:
            data[name].extend(getattr(events, name))
    return pa.table(data, schema=SCHEMAS["events"])



@dataclass
class RequestResult:
    """Everything one input line produced, written together by ``Store.write_results``."""

    request: RequestRow
    response: ResponseRow | None = None
    events: EventColumns | None = None
    turns: list[TurnRow] = dataclasses.field(default_factory=list)
    tool_calls: list[ToolCallRow] = dataclasses.field(default_factory=list)
    tokens: list[TokenRow] = dataclasses.field(default_factory=list)
