"""Plain fixed-width text tables, for the CLI and the eval summaries."""

from __future__ import annotations


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width text table."""
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*columns), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*row) for row in cells])
