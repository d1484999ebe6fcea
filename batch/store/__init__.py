"""The DuckDB file: schema, migrations, typed rows, the writer, reports and live snapshots.

The only code that speaks SQL to a batchrun database.
"""
