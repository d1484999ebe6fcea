"""One typed row shape per table of the batchrun database, and its Arrow schema.

Each table is a dataclass; its Arrow schema is derived from the field types, so a
column is declared once. `Int32`, `Json` (a python value, dumped on write as standard JSON,
no NaN or Infinity: batch/responses/standard_json.py) and `JsonText` (JSON already serialised,
as event payloads are on the hot path) say what a plain python type cannot
(batch/responses/columns.py). Rows are built by `batch.run.results` (and the evals/bench
modules) and written only by the store, column by column.

The tables that hang off a response store the session's own records as they are: a
`turns` row is a `TurnMetrics`, a `tool_calls` row a `ToolCallRecord`, each under its
response's (run_id, response_id) (`OWNED_TYPES`), so a fact has one type, not a record
and a row copied field by field.

Events are the one table written per token, so a response's events are kept as
columns from the start (`EventColumns`): the hot path appends to lists and the
store hands them to Arrow without building a row object per event.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import pyarrow as pa

from batch.responses.columns import Int32, Json, JsonText, JsonTextValue, JsonValue
from batch.responses.events import EventColumns
from batch.responses.standard_json import NonFiniteError, json_text
from batch.responses.metrics import TurnMetrics
from batch.responses.status import RequestStatus, ResponseStatus, RunStatus
from batch.responses.tool_calls import ToolCallRecord

# Columns stored with DuckDB's JSON type travel through Arrow as strings;
# this field metadata marks them.
JSON_METADATA = {b"duckdb_type": b"JSON"}

_ARROW_TYPES: dict[Any, pa.DataType] = {
    str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(),
    datetime: pa.timestamp("us", tz="UTC"),
}


# -- the tables -----------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class RunRow:
    """A runs row: written by the ledger and merge, read back by `store.runs` (JSON columns decoded)."""

    run_id: str
    started_at: datetime | None = None
    finished_at: datetime | None = None
    input_path: str | None = None
    input_sha256: str | None = None
    model: str | None = None
    engine_config: Json = None
    options: Json = None
    status: RunStatus | None = None
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
    status: RequestStatus | None = None
    error: str | None = None
    response_id: str | None = None
    written_at: datetime | None = None
    worker: str | None = None  # the shard or Ray worker that decoded it (None: a one-process run)
    epoch: Int32 = 0  # which of the line's --epochs samples (0..K-1): K rows share one line and custom_id
    conversation: str | None = None  # the conversation the line names (batch/run/conversations.py), if any


@dataclass(slots=True)
class ResponseRow:
    run_id: str
    custom_id: str
    response_id: str
    status: ResponseStatus
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
    # By item id, the header of each call among the input and output items as the model wrote it, which no item
    # keeps (batch/harmony/call_header.py): a continuation renders the calls so. None: no call has one.
    call_headers: Json = None


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
    epoch: Int32 = 0  # the sample of the case it grades (requests.epoch)


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
    "tokens": TokenRow, "grades": GradeRow, "bench": BenchRow,
}
# Tables whose rows are a session's records, each under the (run_id, response_id) of its response.
OWNED_TYPES: dict[str, type] = {"turns": TurnMetrics, "tool_calls": ToolCallRecord}
OWNER_FIELDS = [pa.field("run_id", pa.string()), pa.field("response_id", pa.string())]


# -- Arrow schemas, derived -------------------------------------------------------

def _arrow_field(name: str, hint: Any) -> pa.Field:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in args if arg is not type(None))
        args = typing.get_args(hint)
    if typing.get_origin(hint) is Annotated:
        mark = args[1]
        if mark in (JsonValue, JsonTextValue):
            return pa.field(name, pa.string(), metadata=JSON_METADATA)
        return pa.field(name, mark)
    if typing.get_origin(hint) is list:
        return pa.field(name, pa.list_(_arrow_field("item", args[0]).type))
    if isinstance(hint, type) and issubclass(hint, enum.StrEnum):  # a status: stored as its string
        return pa.field(name, pa.string())
    return pa.field(name, _ARROW_TYPES[hint])


def schema_of(row_type: type) -> pa.Schema:
    """The Arrow schema of a row dataclass, in field order."""
    hints = typing.get_type_hints(row_type, include_extras=True)
    return pa.schema([_arrow_field(f.name, hints[f.name]) for f in dataclasses.fields(row_type)])


SCHEMAS: dict[str, pa.Schema] = {
    **{table: schema_of(row_type) for table, row_type in ROW_TYPES.items()},
    **{table: pa.schema([*OWNER_FIELDS, *schema_of(record_type)]) for table, record_type in OWNED_TYPES.items()},
}
_DUMPED = {table: {f.name for f, hint in zip(dataclasses.fields(row_type),
                                              typing.get_type_hints(row_type, include_extras=True).values())
                   if JsonValue in typing.get_args(hint)}
           for table, row_type in {**ROW_TYPES, **OWNED_TYPES}.items()}


def is_json(arrow_field: pa.Field) -> bool:
    """True when the field is stored in a DuckDB JSON column."""
    return (arrow_field.metadata or {}).get(b"duckdb_type") == b"JSON"


def dumps(value: Any) -> str | None:
    """Like `json_text` (standard JSON: NonFiniteError for NaN or an infinity), but None stays NULL."""
    return None if value is None else json_text(value)


def _check_types(table: str, row_type: type, rows: list) -> None:
    for row in rows:
        if type(row) is not row_type:
            raise TypeError(f"{table} rows must be {row_type.__name__}, got {type(row).__name__}")


def _columns(table: str, names: list[str], rows: list) -> dict[str, list]:
    dumped = _DUMPED[table]
    columns = {}
    for name in names:
        values = [getattr(row, name) for row in rows]
        if name not in dumped:
            columns[name] = values
            continue
        try:
            columns[name] = [dumps(v) for v in values]
        except NonFiniteError as exc:
            raise exc.within(f"{table}.{name}") from None
    return columns


def to_arrow(table: str, rows: list) -> pa.Table:
    """Arrow table of ``rows`` (dataclass instances of the table's row type)."""
    _check_types(table, ROW_TYPES[table], rows)
    return pa.table(_columns(table, SCHEMAS[table].names, rows), schema=SCHEMAS[table])


def owned_to_arrow(table: str, owners: list[tuple[str, str | None]], records: list[list]) -> pa.Table:
    """Arrow table of a turns or tool_calls batch: each response's records under its (run_id, response_id)."""
    flat = [record for group in records for record in group]
    _check_types(table, OWNED_TYPES[table], flat)
    columns = {**_owner_columns(owners, [len(group) for group in records]),
               **_columns(table, SCHEMAS[table].names[len(OWNER_FIELDS):], flat)}
    return pa.table(columns, schema=SCHEMAS[table])


def _owner_columns(owners: list[tuple[str, str | None]], counts: list[int]) -> dict[str, list]:
    """run_id and response_id columns: each owner's ids repeated once per row it owns."""
    run_ids: list = []
    response_ids: list = []
    for (run_id, response_id), count in zip(owners, counts):
        run_ids.extend([run_id] * count)
        response_ids.extend([response_id] * count)
    return {"run_id": run_ids, "response_id": response_ids}


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
    data = _owner_columns(owners, [len(events) for events in columns])
    data.update({name: [] for name in EVENT_COLUMNS})
    for events in columns:
        for name in EVENT_COLUMNS:
            data[name].extend(getattr(events, name))
    return pa.table(data, schema=SCHEMAS["events"])



@dataclass
class RequestResult:
    """Everything one input line produced, written together by ``Store.write_results``."""

    request: RequestRow
    response: ResponseRow | None = None
    events: EventColumns | None = None
    turns: list[TurnMetrics] = dataclasses.field(default_factory=list)  # stored under the response's ids
    tool_calls: list[ToolCallRecord] = dataclasses.field(default_factory=list)
    tokens: list[TokenRow] = dataclasses.field(default_factory=list)
