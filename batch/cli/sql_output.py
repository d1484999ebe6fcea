"""What `batchrun sql` prints: a table that fits the terminal, CSV, or JSON lines.

Several statements' results are printed in turn: tables and CSV blocks apart by a blank line;
in JSON, one line per result holding the list of its rows (so the output stays JSON lines and
says where each result ends).
"""

from __future__ import annotations

import csv
import decimal
import io
import json
import shutil
import sys
from typing import Any

import pyarrow as pa

from batch.responses.standard_json import nulling_non_finite
from batch.store.statements import QueryResult

FORMATS = ("table", "csv", "json")
MIN_COLUMN_WIDTH = 6
FLOAT_DECIMALS = 4
GAP = "  "


def terminal_width() -> int | None:
    """The terminal's width when stdout is one, else None (a pipe or a file gets whole rows)."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def render_results(results: list[QueryResult], fmt: str, width: int | None) -> str:
    """Each result as `fmt`, in turn; one result exactly as `render` prints it."""
    if len(results) == 1:
        return render(results[0].columns, results[0].rows, fmt, width)
    if fmt == "json":
        return "\n".join(_json([_json_row(r.columns, row) for row in _plain(r.rows)]) for r in results)
    return "\n\n".join(render(r.columns, r.rows, fmt, width) for r in results)


def render(columns: list[str], rows: list[dict], fmt: str, width: int | None) -> str:
    """`rows` as `fmt`; a table's columns are cut to fit `width` characters (None: no limit)."""
    rows = _plain(rows)
    if fmt == "csv":
        return _csv(columns, rows)
    if fmt == "json":
        return "\n".join(_json(_json_row(columns, row)) for row in rows)
    return _table(columns, rows, width)


def _plain(rows: list[dict]) -> list[dict]:
    # Rows come through Arrow, whose INTERVAL values are MonthDayNano tuples: printed as such,
    # the README's `now() - started_at AS elapsed` read "MonthDayNano(months=0, days=0, ...)".
    return [{c: _interval_text(v) if isinstance(v, pa.MonthDayNano) else v for c, v in row.items()}
            for row in rows]


def _json_row(columns: list[str], row: dict) -> dict:
    # a DOUBLE can hold NaN and inf, which are not JSON: null, as the store writes an undefined number
    return {c: nulling_non_finite(row[c]) for c in columns}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_json_value)


def _interval_text(value: pa.MonthDayNano) -> str:
    """An interval as DuckDB writes one: `1 year 2 months 3 days 04:05:06.5`."""
    years, months = divmod(abs(value.months), 12)
    direction = -1 if value.months < 0 else 1
    parts = [f"{n} {unit}{'' if abs(n) == 1 else 's'}"
             for n, unit in ((direction * years, "year"), (direction * months, "month"), (value.days, "day")) if n]
    if value.nanoseconds or not parts:
        micros = abs(value.nanoseconds) // 1000
        hours, micros = divmod(micros, 3_600_000_000)
        minutes, micros = divmod(micros, 60_000_000)
        seconds, micros = divmod(micros, 1_000_000)
        fraction = f".{micros:06d}".rstrip("0") if micros else ""
        sign = "-" if value.nanoseconds < 0 else ""
        parts.append(f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}{fraction}")
    return " ".join(parts)


def _json_value(value: Any) -> Any:
    """A value json cannot write: DuckDB's DECIMAL and HUGEINT results (sum() of an integer
    column, a literal 1.5) as numbers, not strings; timestamps, UUIDs and the rest as text."""
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)


def _csv(columns: list[str], rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row[c] is None else json.dumps(row[c], default=str)
                         if isinstance(row[c], (dict, list)) else row[c] for c in columns])
    return out.getvalue().rstrip("\n")


def _cell(value: Any) -> str:
    """One table cell on one line: floats rounded, containers as compact JSON, newlines escaped."""
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.{FLOAT_DECIMALS}f}".rstrip("0").rstrip(".")
        if text in ("-0", "0", ""):  # a small value is not zero (a logprob of -6.9e-06, a p-value)
            return f"{value:.3g}" if value else "0"
        return text
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    return str(value).replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")


def _fit(widths: list[int], width: int) -> list[int]:
    """Column widths whose table fits `width`: the widest columns give way first."""
    widths = list(widths)
    while sum(widths) + len(GAP) * (len(widths) - 1) > width:
        widest = max(range(len(widths)), key=widths.__getitem__)
        if widths[widest] <= MIN_COLUMN_WIDTH:
            break  # too many columns for the terminal: rows wrap
        widths[widest] -= 1
    return widths


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _table(columns: list[str], rows: list[dict], width: int | None) -> str:
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    if width is not None:
        widths = _fit(widths, width)
    lines = [[_clip(c, w) for c, w in zip(columns, widths)], ["-" * w for w in widths]]
    lines += [[_clip(c, w) for c, w in zip(row, widths)] for row in cells]
    return "\n".join(GAP.join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
