"""The store's responses: one response by id or custom_id, a run's lines with their responses, events."""

from __future__ import annotations

from collections.abc import Iterator

from batch.store.database import Database, loads
from batch.store.errors import raising_store_errors


@raising_store_errors
class Responses:
    """The responses and events of one database."""

    def __init__(self, db: Database):
        self.db = db

    def get(self, response_id: str) -> dict | None:
        """{run_id, custom_id, response, input_items, status} of one response, or None."""
        rows = self.db.rows("""
            SELECT run_id, custom_id, response, input_items, status
            FROM responses WHERE response_id = ?""", [response_id])
        return decode_response(rows[0]) if rows else None

    def find(self, run_id: str, custom_id: str) -> dict | None:
        """Like ``get``, by run and custom_id (the newest if several)."""
        rows = self.db.rows("""
            SELECT run_id, custom_id, response, input_items, status
            FROM responses WHERE run_id = ? AND custom_id = ?
            ORDER BY created_at DESC LIMIT 1""", [run_id, custom_id])
        return decode_response(rows[0]) if rows else None

    def find_request(self, run_id: str, custom_id: str) -> dict | None:
        """{run_id, line_no, custom_id, status, error, body} of a run's line by custom_id, or None."""
        rows = self.db.rows("""SELECT run_id, line_no, custom_id, status, error, body FROM requests
                               WHERE run_id = ? AND custom_id = ? ORDER BY line_no LIMIT 1""", [run_id, custom_id])
        return {**rows[0], "body": loads(rows[0]["body"])} if rows else None

    def tool_calls(self, response_id: str) -> list[dict]:
        """A response's tool_calls rows, in the order they started."""
        return self.db.rows("SELECT * FROM tool_calls WHERE response_id = ? ORDER BY started_at", [response_id])

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


def decode_response(row: dict) -> dict:
    row["response"] = loads(row["response"])
    row["input_items"] = loads(row["input_items"])
    return row
