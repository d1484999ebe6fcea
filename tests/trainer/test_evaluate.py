"""The held-out evaluation through `batchrun submit`, on the shipped model: a small sample
here (the README's figures are `make eval-model`)."""

import dataclasses
import json

import pytest

from trainer.evaluate import DEFAULT_MODEL, HELD_OUT_SEED, _answer_ok, evaluate, grade, main, set_tasks
from trainer.tasks import FAMILIES, generate

# one worker for the module: its decoded sample (the module fixture, ~20 s) is then decoded once, not once a worker
pytestmark = [pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(),
                                 reason="no shipped checkpoint in data/models/batchrun-tiny"),
              pytest.mark.xdist_group("trainer-evaluate")]
N = 18  # three tasks per family


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval")
    evaluate(DEFAULT_MODEL, N, HELD_OUT_SEED, path, "values")
    return path


def test_shipped_model_passes_held_out_tasks(workdir):
    rows = grade(generate(HELD_OUT_SEED, N, prefix="heldout"), workdir / "values.duckdb", "values")
    assert {row["family"] for row in rows} == set(FAMILIES)
    assert all(row["harmony_ok"] for row in rows)
    assert sum(row["correct"] for row in rows) >= N - 2, [r for r in rows if not r["correct"]]


def test_grading_rejects_a_wrong_answer_or_call(workdir):
    tasks = generate(HELD_OUT_SEED, N, prefix="heldout")
    wrong = [dataclasses.replace(t, answer=json.dumps({"name": "nobody"}) if "text" in t.body else "no such answer")
             if t.answer else dataclasses.replace(t, calls=[(recipient, {"other": 1}) for recipient, _ in t.calls])
             for t in tasks]
    rows = grade(wrong, workdir / "values.duckdb", "values")
    assert not any(row["correct"] for row in rows)
    assert all(row["harmony_ok"] for row in rows)


def test_a_json_answer_is_graded_by_value_not_by_spelling():
    task = next(t for t in generate(HELD_OUT_SEED, 12) if t.family == "structured")
    answer = json.loads(task.answer)
    assert _answer_ok(task, json.dumps(answer, separators=(",", ":")))
    assert not _answer_ok(task, json.dumps({**answer, "extra": 1}))
    assert not _answer_ok(task, task.answer[:-1])  # not JSON


def test_the_sets_are_fresh_values_held_out_phrasings_and_long_products():
    values, phrasings, long = (set_tasks(name, 12, HELD_OUT_SEED) for name in ("values", "templates", "long"))
    assert [t.body for t in values] == [t.body for t in generate(HELD_OUT_SEED, 12, prefix="heldout")]
    assert [t.body for t in phrasings] == [t.body for t in generate(HELD_OUT_SEED + 1, 12, prefix="phrasing",
                                                                    split="held_out")]
    assert len(long) == 40 and all(len(t.answer) >= 6 for t in long)
    with pytest.raises(ValueError, match="unknown evaluation set"):
        set_tasks("other", 1, 0)


@pytest.mark.slow  # ~15 s; the held-out and long-product tests run the same path through batchrun submit
def test_command_prints_the_table(capsys, tmp_path):
    main(["--n", "6", "--sets", "values", "--workdir", str(tmp_path)])
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("## values")
    assert table.splitlines()[1].split() == ["family", "n", "correct", "harmony", "tool", "calls", "ok"]
    assert table.splitlines()[-1].split()[:2] == ["all", "6"]


@pytest.mark.slow  # ~37-41 s; the default run keeps test_shipped_model_passes_held_out_tasks
def test_shipped_model_copies_long_products_and_answers_phrasings_it_never_saw(tmp_path):
    """#19: 6-13 digit products copied from the python tool; wording held out of training."""
    long = evaluate(DEFAULT_MODEL, 0, HELD_OUT_SEED, tmp_path, "long")
    assert len(long) == 40 and all(row["harmony_ok"] for row in long)
    assert sum(row["correct"] for row in long) >= 38, [r for r in long if not r["correct"]]
    phrasings = evaluate(DEFAULT_MODEL, 12, HELD_OUT_SEED, tmp_path, "templates")
    assert all(row["harmony_ok"] for row in phrasings)
    assert sum(row["correct"] for row in phrasings) >= 10, [r for r in phrasings if not r["correct"]]
