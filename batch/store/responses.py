"""The store's responses: one response by id or custom_id, a run's lines with their responses, events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from batch.responses.status import RequestStatus, ResponseStatus
from batch.store.database import Database, loads
from batch.store.errors import raising_store_errors


@dataclass(frozen=True)
class StoredResponse:
    """A response as stored: the Response object and the input it answered (what a
    `previous_response_id` continues)."""

    run_id: str
    custom_id: str
    response: dict
    input_items: list[dict] | None
    status: ResponseStatus
    call_headers: dict[str, str] = field(default_factory=dict)  # by item id, as written (responses.call_headers)


@dataclass(frozen=True)
class ConversationTurn:
    """A run's line that named a conversation, as stored: what the conversation's next line continues."""

    line_no: int
    status: RequestStatus | None
    response: dict | None  # None when the line has no response (invalid, or failed before decoding)
    input_items: list[dict] | None
    call_headers: dict[str, str] = field(default_factory=dict)  # by item id, as written (responses.call_headers)


@dataclass(frozen=True)
class StoredRequest:
    """A run's input line as its requests row stores it (secrets redacted)."""

    run_id: str
    line_no: int
    custom_id: str
    status: RequestStatus | None
    error: str | None
    body: Any  # the request body; None when the line was not a JSON object
    epoch: int = 0  # which of the line's samples (a run made with --epochs K holds K)


_RESPONSE_COLUMNS = "run_id, custom_id, response, input_items, status, call_headers"
_RESPONSE_COLUMNS_OF_S = ", ".join("s." + c for c in _RESPONSE_COLUMNS.split(", "))  # responses aliased `s`


@raising_store_errors
class Responses:
    """The responses and events of one database."""

    def __init__(self, db: Database):
        self.db = db

    def get(self, response_id: str) -> StoredResponse | None:
        """One response by id, or None."""
        rows = self.db.rows(f"SELECT {_RESPONSE_COLUMNS} FROM responses WHERE response_id = ?", [response_id])
        return stored_response(rows[0]) if rows else None

    def item(self, item_id: str) -> dict | None:
        """An input or output item of any stored response, by its id (the newest response's, if several
        hold it), or None. Each call scans every stored response's text for the id (quoted), and unnests only
        the items of those that hold it."""
        quoted = json.dumps(item_id)
        rows = self.db.rows("""
            SELECT item FROM (
                SELECT unnest(CAST(response->'$.output' AS JSON[])) AS item, created_at FROM responses
                WHERE contains(CAST(response AS VARCHAR), ?)
                UNION ALL
                SELECT unnest(CAST(input_items AS JSON[])), created_at FROM responses
                WHERE contains(CAST(input_items AS VARCHAR), ?))
            WHERE item->>'id' = ? ORDER BY created_at DESC LIMIT 1""", [quoted, quoted, item_id])
        return loads(rows[0]["item"]) if rows else None

    def find(self, run_id: str, custom_id: str, epoch: int | None = None) -> StoredResponse | None:
        """Like ``get``, by run and custom_id: the first sample (lowest epoch) of a run made with --epochs, the
        newest if several otherwise; with ``epoch``, that sample's."""
        if epoch is None:  # not the newest sample: which one the batch finished last is not reproducible
            rows = self.db.rows(f"""
                SELECT {_RESPONSE_COLUMNS_OF_S}
                FROM responses s LEFT JOIN requests q ON q.run_id = s.run_id AND q.response_id = s.response_id
                WHERE s.run_id = ? AND s.custom_id = ?
                ORDER BY q.epoch NULLS LAST, s.created_at DESC LIMIT 1""", [run_id, custom_id])
        else:
            rows = self.db.rows(f"""
                SELECT {_RESPONSE_COLUMNS_OF_S}
                FROM requests q JOIN responses s ON s.run_id = q.run_id AND s.response_id = q.response_id
                WHERE q.run_id = ? AND q.custom_id = ? AND q.epoch = ?
                ORDER BY q.line_no LIMIT 1""", [run_id, custom_id, epoch])
        return stored_response(rows[0]) if rows else None

    def find_request(self, run_id: str, custom_id: str, epoch: int | None = None) -> StoredRequest | None:
        """A run's line by custom_id (the first if several; with ``epoch``, that sample), or None."""
        rows = self.db.rows("""SELECT run_id, line_no, custom_id, status, error, body, epoch FROM requests
                               WHERE run_id = ? AND custom_id = ? AND (? IS NULL OR epoch = ?)
                               ORDER BY line_no, epoch LIMIT 1""", [run_id, custom_id, epoch, epoch])
        if not rows:
            return None
        row = rows[0]
        return StoredRequest(row["run_id"], row["line_no"], row["custom_id"],
                             None if row["status"] is None else RequestStatus(row["status"]),
                             row["error"], loads(row["body"]), row["epoch"])

    def conversation_turn(self, run_id: str, conversation_id: str, epoch: int,
                          before_line: int) -> ConversationTurn | None:
        """The last line before ``before_line`` of run ``run_id`` (sample ``epoch``) that names conversation
        ``conversation_id`` (requests.conversation), or None."""
        rows = self.db.rows("""
            SELECT q.line_no, q.status, s.response, s.input_items, s.call_headers
            FROM requests q LEFT JOIN responses s ON s.run_id = q.run_id AND s.response_id = q.response_id
            WHERE q.run_id = ? AND q.epoch = ? AND q.line_no < ? AND q.conversation = ?
            ORDER BY q.line_no DESC LIMIT 1""", [run_id, epoch, before_line, conversation_id])
        if not rows:
            return None
        row = rows[0]
        return ConversationTurn(row["line_no"], None if row["status"] is None else RequestStatus(row["status"]),
                                loads(row["response"]), loads(row["input_items"]), loads(row["call_headers"]) or {})

    def epochs(self, run_id: str, custom_id: str) -> list[int]:
        """The epochs (samples) run ``run_id`` holds of ``custom_id``, ascending; [] when none."""
        rows = self.db.rows("SELECT DISTINCT epoch FROM requests WHERE run_id = ? AND custom_id = ? ORDER BY 1",
                            [run_id, custom_id])
        return [row["epoch"] for row in rows]

    def epoch_of(self, response_id: str) -> int | None:
        """The epoch of the requests row a response answers, or None when no row names it."""
        rows = self.db.rows("SELECT epoch FROM requests WHERE response_id = ? LIMIT 1", [response_id])
        return rows[0]["epoch"] if rows else None

    def tool_calls(self, response_id: str) -> list[dict]:
        """A response's tool_calls rows, in the order they started."""
        return self.db.rows("SELECT * FROM tool_calls WHERE response_id = ? ORDER BY started_at", [response_id])

    def web_search_calls(self, item_ids: list[str]) -> list[dict]:
        """The tool_calls rows of the web_search_call items `item_ids` names (call_id, name, arguments, output,
        error): the browser calls the model made and the pages it read, which the items do not hold."""
        if not item_ids:
            return []
        return self.db.rows("SELECT call_id, name, arguments, output, error FROM tool_calls "
                            "WHERE tool_type = 'web_search' AND list_contains(?, call_id)", [item_ids])

    def iter_lines(self, run_id: str) -> Iterator[dict]:
        """Yield every request line of a run in line order, with its response or None.

        Each dict has line_no, epoch, custom_id, status, error, response_id and response.
        Streams in Arrow batches on a separate cursor, so the caller may query
        the store while iterating.
        """
        cursor = self.db.con.cursor()
        try:
            reader = cursor.sql("""
                SELECT q.line_no, q.epoch, q.custom_id, q.status, q.error, q.response_id,
                       s.response
                FROM requests q LEFT JOIN responses s
                  ON s.run_id = q.run_id AND s.response_id = q.response_id
                WHERE q.run_id = ? ORDER BY q.line_no, q.epoch""", params=[run_id]).arrow()
            for batch in reader:
                for row in batch.to_pylist():
                    row["response"] = loads(row["response"])
                    yield row
        finally:
            cursor.close()

    def events(self, response_id: str) -> list[dict]:
        """The events rows of one response by sequence_number, payload decoded."""
        rows = self.db.rows("""
            SELECT * FROM events WHERE response_id = ?
            ORDER BY sequence_number""", [response_id])
        for row in rows:
            row["payload"] = loads(row["payload"])
        return rows

    def outcomes(self, run_id: str) -> list[dict]:
        """Every request line of a run in line order, for comparing runs.

        Each dict has custom_id, epoch, status, and its response's response (decoded),
        output_tokens and latency_s (all None for a line without a response).
        """
        rows = self.db.rows("""
            SELECT q.custom_id, q.epoch, q.status, s.response, s.output_tokens, s.latency_s
            FROM requests q LEFT JOIN responses s
              ON s.run_id = q.run_id AND s.response_id = q.response_id
            WHERE q.run_id = ? ORDER BY q.line_no, q.epoch""", [run_id])
        for row in rows:
            row["response"] = loads(row["response"])
        return rows

    def iter_events(self, run_id: str) -> Iterator[tuple[str, list[dict]]]:
        """Yield (response_id, event payloads in order) for every response of a run.

        Streams in Arrow batches on a separate cursor, one response at a time.
        """
        cursor = self.db.con.cursor()
        try:
            reader = cursor.sql("""
                SELECT response_id, payload FROM events WHERE run_id = ?
                ORDER BY response_id, sequence_number""", params=[run_id]).arrow()
            current, payloads = None, []
            for batch in reader:
                for row in batch.to_pylist():
                    if row["response_id"] != current and current is not None:
                        yield current, payloads
                        payloads = []
                    current = row["response_id"]
                    payloads.append(loads(row["payload"]))
            if current is not None:
                yield current, payloads
        finally:
            cursor.close()


def stored_response(row: dict) -> StoredResponse:
    return StoredResponse(row["run_id"], row["custom_id"], loads(row["response"]), loads(row["input_items"]),
                          ResponseStatus(row["status"]), loads(row["call_headers"]) or {})
