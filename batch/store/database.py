"""What the store's parts share: one connection, the file's path, and the lock every commit takes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

_register_ids = count()


@dataclass
class Database:
    """An open connection; `write_lock` is taken by every commit of this process (a live snapshot
    copies the file between commits)."""

    con: duckdb.DuckDBPyConnection
    path: Path
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    def rows(self, query: str, params: list | dict | None = None) -> list[dict]:
        """The query's rows as dicts (through Arrow: TIMESTAMPTZ needs no pytz)."""
        return self.con.sql(query, params=params).to_arrow_table().to_pylist()

    @contextmanager
    def registered(self, data: pa.Table) -> Iterator[str]:
        """``data`` under a unique name for the statements in the block (replacement scans of
        locals depend on the caller's frame, registration does not)."""
        name = f"_batchrun_arrow_{next(_register_ids)}"
        self.con.register(name, data)
        try:
            yield name
        finally:
            self.con.unregister(name)

    def insert(self, table: str, data: pa.Table) -> None:
        with self.registered(data) as name, self.write_lock:
            self.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {name}")


def loads(value: str | None) -> Any:
    """A stored JSON text decoded (NULL stays None)."""
    return None if value is None else json.loads(value)


def now() -> datetime:
    return datetime.now(UTC)
