"""End to end through `batchrun show`: a run made with --epochs holds K samples of a line, and
`--epoch K` picks one of them."""

import json

import duckdb
import pytest
from click.testing import CliRunner, Result

from batch.cli.main import main
from tests.support.db import rows


def batchrun(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def epochs_db(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("show-epochs")
    source, db = root / "in.jsonl", root / "e.duckdb"
    # "b" is invalid (no input): its three epochs are requests rows without a response.
    source.write_text(json.dumps({"custom_id": "a", "input": "Say hi."}) + "\n"
                      + json.dumps({"custom_id": "b"}) + "\n")
    result = batchrun("submit", source, "--db", db, "--model", tiny_model_dir, "--run-id", "e1", "--epochs", 3,
                      "--temperature", 1, "--max-output-tokens", 4, "--quiet")
    assert result.exit_code == 0, result.output
    return db


def test_epoch_picks_each_sample_of_a_custom_id(epochs_db):
    ids = dict(rows(epochs_db, "SELECT epoch, response_id FROM requests WHERE custom_id = 'a'"))
    for epoch, response_id in ids.items():
        shown = batchrun("show", "a", "--db", epochs_db, "--epoch", epoch)
        assert shown.exit_code == 0, shown.output
        assert shown.output.splitlines()[0] == f"response {response_id}  custom_id=a  run=e1  epoch={epoch} of 0-2"


def test_without_epoch_show_picks_the_first_sample_and_says_so(epochs_db):
    # the newest response (what it showed before) was whichever sample the batch finished last
    [(response_id,)] = rows(epochs_db, "SELECT response_id FROM requests WHERE custom_id = 'a' AND epoch = 0")
    with duckdb.connect(str(epochs_db)) as con:  # epoch 2 the newest, however this run's batch ended
        con.execute("""UPDATE responses SET created_at = created_at + INTERVAL 1 HOUR WHERE response_id =
                       (SELECT response_id FROM requests WHERE custom_id = 'a' AND epoch = 2)""")
    shown = batchrun("show", "a", "--db", epochs_db)
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[0] == f"response {response_id}  custom_id=a  run=e1  epoch=0 of 0-2"


def test_epoch_of_a_line_without_a_response(epochs_db):
    shown = batchrun("show", "b", "--db", epochs_db, "--epoch", 2)
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[0] == "request line 2  custom_id=b  run=e1  epoch=2 of 0-2  (no response)"


@pytest.mark.parametrize("key", ["a", "b"])
def test_an_epoch_the_run_does_not_have_is_one_clear_error(epochs_db, key):
    shown = batchrun("show", key, "--db", epochs_db, "--epoch", 3)
    assert shown.exit_code == 1
    assert shown.output.strip() == (f"error: run e1 has no epoch 3 of custom_id {key!r}: "
                                    "its epochs are 0-2 (--epoch counts from 0)")


def test_a_response_id_with_another_epoch_is_refused(epochs_db):
    response_id = rows(epochs_db, "SELECT response_id FROM requests WHERE custom_id = 'a' AND epoch = 1")[0][0]
    assert batchrun("show", response_id, "--db", epochs_db, "--epoch", 1).exit_code == 0
    shown = batchrun("show", response_id, "--db", epochs_db, "--epoch", 0)
    assert shown.exit_code == 1
    assert shown.output.strip() == (f"error: response {response_id} is epoch 1 of custom_id 'a' in run e1, "
                                    "not epoch 0")


def test_epoch_is_a_non_negative_count():
    assert batchrun("show", "a", "--epoch", -1).exit_code == 2
