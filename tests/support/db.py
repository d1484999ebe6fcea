"""Reading a finished run's DuckDB file in tests, as a user's own duckdb client would."""

import json
import math

import duckdb


def rows(db, query):
    """The rows of `query` on the database file `db`, opened read-only."""
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(query).fetchall()


def strict_json(text: str):
    """JSON as the standard has it: NaN and Infinity, which Python's json writes and reads, are not JSON,
    nor is a number past a double (1e999, which Python reads as inf)."""
    def refuse(constant: str):
        raise AssertionError(f"{constant} in stored JSON")

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise AssertionError(f"{text} in stored JSON")
        return value
    return json.loads(text, parse_constant=refuse, parse_float=number)


def json_values(db) -> list[tuple[str, str, str]]:
    """(table, column, text) of every non-null value of every JSON column of the file's tables."""
    columns = rows(db, "SELECT table_name, column_name FROM information_schema.columns "
                       "WHERE data_type = 'JSON' AND table_name IN (SELECT table_name FROM information_schema.tables "
                       "WHERE table_type = 'BASE TABLE') ORDER BY ALL")
    return [(table, column, text) for table, column in columns
            for (text,) in rows(db, f'SELECT CAST("{column}" AS VARCHAR) FROM "{table}" WHERE "{column}" IS NOT NULL')]


def assert_standard_json(db) -> int:
    """Every stored JSON value parses as standard JSON (AssertionError naming the table and column);
    how many there are."""
    values = json_values(db)
    for table, column, text in values:
        try:
            strict_json(text)
        except (AssertionError, ValueError) as exc:
            raise AssertionError(f"{table}.{column}: {exc}: {text[:200]}") from None
    return len(values)
