"""Tool answers are cut before tokenizing, never inside a character, with a note the model reads."""

from batch.run.tool_policy import cap_output
from tools.outcomes import CallOutcome


def test_short_outputs_pass_unchanged_with_their_size():
    capped = cap_output(CallOutcome(output="caf\u00e9"), max_bytes=16)
    assert (capped.outcome.output, capped.num_bytes, capped.is_truncated) == ("caf\u00e9", 5, False)


def test_long_outputs_are_cut_at_a_character_boundary_and_say_so():
    text = "\u00e9" * 10  # 2 bytes each
    capped = cap_output(CallOutcome(output=text), max_bytes=5)
    assert capped.outcome.output == "\u00e9\u00e9\n[output truncated: 5 of 20 bytes shown]"
    assert (capped.num_bytes, capped.is_truncated) == (20, True)


def test_errors_are_cut_too_and_other_fields_kept():
    outcome = CallOutcome(error="x" * 100, error_kind="tool_error", duration_s=1.5)
    capped = cap_output(outcome, max_bytes=10)
    assert capped.outcome.error.startswith("x" * 10 + "\n[output truncated: 10 of 100")
    assert (capped.outcome.error_kind, capped.outcome.duration_s, capped.outcome.output) == ("tool_error", 1.5, None)
