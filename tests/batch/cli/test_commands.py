"""The thin commands of batch/cli/commands.py (sql), through `batchrun` (CliRunner)."""

import pytest
from click.testing import CliRunner

from batch.cli.main import main
from batch.store.store import Store

QUERY = "-- how many migrations ran\nSELECT count(*) > 0 AS ok FROM schema_migrations"


@pytest.fixture
def empty_db(tmp_path):
    """A database batchrun made (every migration applied), with no run in it."""
    db = tmp_path / "run.duckdb"
    with Store(db):
        pass
    return str(db)


@pytest.mark.parametrize("order", ["query first", "options first", "after --", "no space"])
def test_sql_takes_a_query_that_starts_with_a_comment(empty_db, order):
    # The README's example blocks start with `-- what it shows`; click read such a query as an
    # unknown option ("No such option: -- how many ...") and exited 2.
    args = {"query first": [QUERY, "--db", empty_db], "options first": ["--db", empty_db, QUERY],
            "after --": ["--db", empty_db, "--", QUERY],
            "no space": ["--db", empty_db, QUERY.replace("-- ", "--")]}[order]
    result = CliRunner().invoke(main, ["sql", *args])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["ok", "----", "True"]


def test_sql_still_refuses_an_unknown_option(empty_db):
    result = CliRunner().invoke(main, ["sql", "SELECT 1", "--db", empty_db, "--formt", "json"])
    assert result.exit_code == 2 and "No such option '--formt'" in result.output


def test_sql_reads_an_option_with_a_space_in_its_value_as_the_option(tmp_path):
    spaced = tmp_path / "a folder" / "run.duckdb"
    spaced.parent.mkdir()
    with Store(spaced):
        pass
    result = CliRunner().invoke(main, ["sql", f"--db={spaced}", QUERY])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "True"
