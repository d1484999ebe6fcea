"""The task generator is deterministic and renders exactly what `batchrun submit` renders."""

import json

from batch.vocab import harmony_encoding
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
    tasks = generate(0, 12, mix={"browser": 2, "python": 1})
    assert [t.family for t in tasks] == ["browser", "browser", "python"] * 4


def test_tasks_of_a_group_share_the_prompt_up_to_the_user_message():
    tasks = generate(5, 60, group=6)
    assert [t.group for t in tasks] == [i // 6 for i in range(60)]
    for start in range(0, 60, 6):
        group = tasks[start:start + 6]
        assert len({t.family for t in group}) == 1
        prompts = [request_prompt(t.body) for t in group]
        user = prompts[0].index(200006, 1)  # <|start|> of the message after the system message's
        while "user" not in harmony_encoding().decode(prompts[0][user:user + 2]):
            user = prompts[0].index(200006, user + 1)
        assert all(p[:user] == prompts[0][:user] for p in prompts), group[0].family
    assert len({json.dumps(t.body.get("metadata")) for t in tasks}) > 5  # groups differ


def test_function_tasks_call_one_of_the_offered_functions():
    for task in generate(2, 40, mix={"function_call": 1}, group=8):
        offered = {tool["name"] for tool in task.body["tools"]}
        assert task.calls[0][0].removeprefix("functions.") in offered


def test_mix_can_ask_for_one_no_tool_kind():
    tasks = generate(3, 16, mix={"no_tool/reverse": 1}, group=8)
    assert {t.family for t in tasks} == {"no_tool"}
    assert all(t.body["input"].startswith("Reverse the order") for t in tasks)
