"""The store's grades: a run's grades rows, replaced as a whole when the run is graded again."""

from __future__ import annotations

from batch.store.database import Database, loads, now
from batch.store.errors import raising_store_errors
from batch.store.rows import GradeRow, to_arrow
from batch.store.writes import transaction


@raising_store_errors
class Grades:
    """The grades table of one database."""

    def __init__(self, db: Database):
        self.db = db

    def write(self, run_id: str, rows: list[dict]) -> None:
        """Replace every grades row of ``run_id`` with ``rows``, in one transaction.

        Each row has the `GradeRow` fields but ``run_id`` and ``graded_at``, which are
        filled in; ``options`` is a python object.
        """
        graded_at = now()
        data = to_arrow("grades", [GradeRow(**{"graded_at": graded_at, **row, "run_id": run_id}) for row in rows])
        with self.db.registered(data) as name, self.db.write_lock, transaction(self.db.con):
            self.db.con.execute("DELETE FROM grades WHERE run_id = ?", [run_id])
            self.db.con.execute(f"INSERT INTO grades BY NAME SELECT * FROM {name}")

    def read(self, run_id: str) -> list[dict]:
        """The grades rows of a run (``options`` decoded), in the order they were written."""
        rows = self.db.rows("SELECT * FROM grades WHERE run_id = ? ORDER BY rowid", [run_id])
        for row in rows:
            row["options"] = loads(row["options"])
        return rows
