"""Reading a finished run's DuckDB file in tests, as a user's own duckdb client would."""

import duckdb


def rows(db, query):
    """The rows of `query` on the database file `db`, opened read-only."""
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(query).fetchall()
