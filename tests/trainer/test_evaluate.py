"""The held-out evaluation through `batchrun submit`, on the shipped model: a small sample
here (the README's 200-task figure is `make eval-model`)."""

import dataclasses

import pytest

from trainer.evaluate import DEFAULT_MODEL, HELD_OUT_SEED, evaluate, grade, main
from trainer.tasks import generate

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "model.safetensors").exists(),
                                reason="no shipped checkpoint in data/models/batchrun-tiny")
N = 15  # three tasks per family


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval")
    evaluate(DEFAULT_MODEL, N, HELD_OUT_SEED, path)
    return path


def test_shipped_model_passes_held_out_tasks(workdir):
    rows = grade(generate(HELD_OUT_SEED, N, prefix="heldout"), workdir / "heldout.duckdb", "heldout")
    assert {row["family"] for row in rows} == {"python", "function_call", "function_output", "browser", "no_tool"}
    assert all(row["harmony_ok"] for row in rows)
    assert sum(row["correct"] for row in rows) >= N - 2, [r for r in rows if not r["correct"]]


def test_grading_rejects_a_wrong_answer_or_call(workdir):
    tasks = generate(HELD_OUT_SEED, N, prefix="heldout")
    wrong = [dataclasses.replace(t, answer="no such answer") if t.answer else
             dataclasses.replace(t, calls=[(recipient, {"other": 1}) for recipient, _ in t.calls]) for t in tasks]
    rows = grade(wrong, workdir / "heldout.duckdb", "heldout")
    assert not any(row["correct"] for row in rows)
    assert all(row["harmony_ok"] for row in rows)


def test_command_prints_the_table(capsys, tmp_path):
    main(["--n", "5", "--workdir", str(tmp_path)])
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["family", "n", "correct", "harmony", "tool", "calls", "ok"]
    assert table.splitlines()[-1].split()[:2] == ["all", "5"]
