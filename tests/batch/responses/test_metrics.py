"""Per-turn metrics of one response."""

from batch.responses.metrics import ResponseMetrics, TurnMetrics


def test_sampling_turns_are_numbered_after_the_model_turns_without_changing_them():
    metrics = ResponseMetrics()
    metrics.begin_turn(prompt_tokens=10)
    sampled = TurnMetrics(turn=0, prompt_tokens=4, kind="sampling")
    metrics.sampled.append(sampled)
    assert [(t.turn, t.kind) for t in metrics.all_turns()] == [(0, "model"), (1, "sampling")]
    metrics.begin_turn(prompt_tokens=30, tool_output_tokens=20)  # the model goes on after the sampling request
    assert [(t.turn, t.kind) for t in metrics.all_turns()] == [(0, "model"), (1, "model"), (2, "sampling")]
    assert sampled.turn == 0  # what was recorded stays as it was
    assert metrics.turns[1].tool_output_tokens == 20
