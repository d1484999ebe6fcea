"""The user's SQL (`batchrun sql`): any number of statements, run one after another.

DuckDB splits the text (`extract_statements`), so a ';' inside a string literal, a quoted
name or a comment never splits a statement. Each statement's result is fetched before the
next statement runs: a later `DROP` or `INSERT` cannot change what an earlier `SELECT` shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from batch.store.errors import StoreError

EXCERPT_CHARS = 60  # of a failed statement, in the error of a several-statement query


class StatementError(StoreError):
    """A statement of several failed; `results` are those of the statements before it (as psql, shown first)."""

    def __init__(self, message: str, results: list[QueryResult]):
        super().__init__(message)
        self.results = results


@dataclass(frozen=True)
class QueryResult:
    """One statement's result: column names, and rows as dicts keyed by them."""

    columns: list[str]
    rows: list[dict]


def run_statements(con: duckdb.DuckDBPyConnection, sql: str) -> list[QueryResult]:
    """The result of each statement of ``sql`` that returns one, in order.

    Statements that return nothing (SET, BEGIN, DROP, ATTACH, ...) add no result; neither does
    text with no statement (a comment). A statement that fails stops the rest; when ``sql`` has
    several statements, the StatementError names which one (number and start of its text) and holds
    the results of the statements before it.
    """
    statements = con.extract_statements(sql)
    results: list[QueryResult] = []
    for number, statement in enumerate(statements, 1):
        try:
            relation = con.sql(statement)
            if relation is None:
                continue
            data = relation.to_arrow_table()  # now, before the next statement runs
        except duckdb.Error as error:
            if len(statements) == 1:
                raise  # the store's caller translates it; one statement needs no number
            raise StatementError(f"statement {number} of {len(statements)} ({_excerpt(statement.query)}): "
                                 f"{error}", results) from error
        # DuckDB answers a statement that returns nothing with an empty 'Success' table
        if statement.expected_result_type != [duckdb.ExpectedResultType.NOTHING]:
            results.append(QueryResult(data.column_names, data.to_pylist()))
    return results


def _excerpt(query: str) -> str:
    """A statement's text on one line, cut to EXCERPT_CHARS."""
    text = " ".join(query.split()).rstrip(";").rstrip()
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS - 1] + "…"
