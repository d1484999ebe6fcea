"""The store's reads for the browsable report: a run's case table and every sample's transcript.

Each read is one query over a whole run (views case_summary, sample_summary, event_runs and the
tables), grouped here by sample, so a 10,000-case run costs a handful of scans, not one per case.
"""

from __future__ import annotations

from collections import defaultdict

from batch.store.database import Database, loads
from batch.store.errors import raising_store_errors


@raising_store_errors
class Transcripts:
    """Per-case rows and per-sample transcripts of one run."""

    def __init__(self, db: Database):
        self.db = db

    def cases(self, run_id: str) -> list[dict]:
        """The case_summary rows of a run (one per custom_id, epochs averaged), in line order."""
        return self.db.rows("SELECT * EXCLUDE (run_id) FROM case_summary WHERE run_id = ? "
                            "ORDER BY line_no, custom_id", [run_id])

    def samples(self, run_id: str) -> dict[str, list[dict]]:
        """custom_id -> its samples (epochs) in order, each a sample_summary row with ``body`` (the
        request), ``response``, ``turns``, ``tool_calls``, ``events`` (event_runs rows) and ``grades``."""
        samples: dict[str, list[dict]] = defaultdict(list)
        by_response: dict[str, dict] = {}
        by_sample: dict[tuple[str, int], dict] = {}
        for row in self.db.rows("""
                SELECT m.* EXCLUDE (run_id), q.body, s.response FROM sample_summary m
                JOIN requests q ON q.run_id = m.run_id AND q.line_no = m.line_no AND q.epoch = m.epoch
                LEFT JOIN responses s ON s.run_id = m.run_id AND s.response_id = m.response_id
                WHERE m.run_id = ? ORDER BY m.line_no, m.epoch""", [run_id]):
            row.update(body=loads(row["body"]), response=loads(row["response"]), turns=[], tool_calls=[],
                       events=[], grades=[])
            samples[row["custom_id"]].append(row)
            by_sample[row["custom_id"], row["epoch"]] = row
            if row["response_id"] is not None:
                by_response[row["response_id"]] = row
        self._attach(by_response, "turns", """
            SELECT response_id, turn, prompt_tokens, cached_tokens, output_tokens, tool_output_tokens,
                   prefill_s, decode_s, finish_reason
            FROM turns WHERE run_id = ? ORDER BY response_id, turn""", run_id)
        self._attach(by_response, "tool_calls", """
            SELECT response_id, call_id, tool_type, server_label, name, arguments, output, status, error,
                   error_kind, duration_s, attempts, output_truncated
            FROM tool_calls WHERE run_id = ? ORDER BY response_id, started_at""", run_id)
        self._attach(by_response, "events", """
            SELECT response_id, sequence_number, type, n_events, turn, first_ms, last_ms
            FROM event_runs WHERE run_id = ? ORDER BY response_id, sequence_number""", run_id)
        for grade in self.db.rows("""SELECT custom_id, epoch, grader, passed, score, explanation FROM grades
                                     WHERE run_id = ? ORDER BY rowid""", [run_id]):
            sample = by_sample.get((grade.pop("custom_id"), grade.pop("epoch")))
            if sample is not None:
                sample["grades"].append(grade)
        return dict(samples)

    def _attach(self, by_response: dict[str, dict], key: str, sql: str, run_id: str) -> None:
        for row in self.db.rows(sql, [run_id]):
            sample = by_response.get(row.pop("response_id"))
            if sample is not None:
                sample[key].append(row)
