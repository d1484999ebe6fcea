"""engine.host_costs: the host's work in a decode step, counted and timed without a GPU."""

import pytest

from engine import proxies
from engine.host_costs import CALLS_PER_ROW_GOAL, decoding_engine, python_calls_per_row


def test_the_measured_engine_decodes_every_sequence_every_step():
    with decoding_engine(12, 40, max_steps=5) as llm:
        for _ in range(5):
            assert len(llm.step()) == 12  # no sequence finished or waiting: each step is a full decode
        assert llm.runner.counts.stats()["decode_tokens"] == 0  # its forward is stubbed: nothing ran the model


def test_a_decode_step_calls_few_python_functions_per_row_whatever_the_context():
    # a count, not a time: the same on a loaded machine. ~39 at batch 64 (66 before a decode row that needs no
    # new block skipped the block manager's free-block counts and one that fills no block its hashing, 45 before
    # the scheduler's per-row loops read fields instead of properties and rows became tuples)
    short, long = python_calls_per_row(64, 64), python_calls_per_row(64, 1024)
    assert short <= CALLS_PER_ROW_GOAL
    assert long == pytest.approx(short, abs=1)  # the host's work per row does not grow with the context


def test_the_engine_step_proxy_is_registered_with_the_calls_goal(monkeypatch):
    monkeypatch.setattr("engine.host_costs.engine_step_ms", lambda batch, context: batch / 100)
    monkeypatch.setattr("engine.host_costs.python_calls_per_row", lambda batch, context: context / 64)
    figures = dict(proxies.MEASURES)["engine host ms/step"]()
    assert [(f.name, f.value, f.ok) for f in figures] == [
        ("engine host ms/step, B=64 ctx=1k", 0.64, True), ("  Python calls a decode row", 16, True),
        ("engine host ms/step, B=256 ctx=1k", 2.56, True), ("  Python calls a decode row", 16, True),
        ("engine host ms/step, B=256 ctx=4k", 2.56, True), ("  Python calls a decode row", 64, False)]
