"""The task generator is deterministic and renders exactly what `batchrun submit` renders."""

import json

from trainer.render import request_prompt, render_sequence
from trainer.tasks import FAMILIES, generate


def test_generator_is_deterministic_by_seed():
    first, again, other = generate(3, 20), generate(3, 20), generate(4, 20)
    assert [t.body for t in first] == [t.body for t in again]
    assert [render_sequence(t.body, t.steps).token_ids for t in first] == [
        render_sequence(t.body, t.steps).token_ids for t in again]
    assert [t.body for t in first] != [t.body for t in other]


def test_every_family_is_generated_with_an_answer_or_a_call():
    tasks = generate(0, 50)
    assert {t.family for t in tasks} == set(FAMILIES)
    for task in tasks:
        assert task.answer or task.calls


def test_loss_covers_only_the_model_tokens():
    task = next(t for t in generate(0, 10) if t.family == "python")
    sequence = render_sequence(task.body, task.steps)
    prompt = request_prompt(task.body)
    assert not any(sequence.is_target[:len(prompt)])
    assert sequence.token_ids[:len(prompt)] == prompt
    assert sequence.is_target[-1] and sequence.token_ids[-1] == 200002  # <|return|>


def test_prompts_equal_what_batchrun_submit_renders(tmp_path, tiny_model_dir):
    """Every turn batchrun decodes starts from the training sequence's prefix, token for token."""
    from batch.store import Store
    from trainer.evaluate import submit, write_requests

    tasks = generate(11, 10)
    write_requests(tasks, tmp_path / "in.jsonl")
    submit(tmp_path / "in.jsonl", tmp_path / "t.duckdb", tiny_model_dir, "r", ["--keep-tokens",
                                                                             "--max-output-tokens", "1"])
    with Store(tmp_path / "t.duckdb", read_only=True) as store:
        rows = store._rows("""SELECT q.custom_id, t.prompt_token_ids FROM tokens t JOIN requests q
                              ON q.run_id = t.run_id AND q.response_id = t.response_id WHERE t.turn = 0""")
    prompts = {row["custom_id"]: list(row["prompt_token_ids"]) for row in rows}
    assert len(prompts) == len(tasks)
    for task in tasks:
        assert prompts[task.custom_id] == request_prompt(task.body), json.dumps(task.body)


def test_mix_sets_how_often_each_family_comes():
    tasks = generate(0, 12, mix={"copy_drill": 2, "python": 1})
    assert [t.family for t in tasks] == ["copy_drill", "copy_drill", "python"] * 4


def test_copy_drill_answer_repeats_the_request():
    for task in generate(1, 20, mix={"copy_drill": 1}):
        assert task.body["input"] == f"Repeat exactly: {task.answer}"
        sequence = render_sequence(task.body, task.steps)
        assert sequence.is_target[-1] and sum(sequence.is_target) < len(sequence.token_ids)
