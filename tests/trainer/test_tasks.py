"""The task generator is deterministic and renders exactly what `batchrun submit` renders."""

import json
import re

from batch.harmony.vocab import harmony_encoding, ordinary_tokens
from trainer.render import completion_ids, request_prompt, render_sequence
from trainer.tasks import DECLINE, FAMILIES, generate, long_product_tasks


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
    from batch.store.store import Store
    from trainer.evaluate import submit, write_requests

    tasks = generate(11, 10)
    write_requests(tasks, tmp_path / "in.jsonl")
    submit(tmp_path / "in.jsonl", tmp_path / "t.duckdb", tiny_model_dir, "r", ["--keep-tokens",
                                                                             "--max-output-tokens", "1"])
    with Store(tmp_path / "t.duckdb", read_only=True) as store:
        rows = store.db.rows("""SELECT q.custom_id, t.prompt_token_ids FROM tokens t JOIN requests q
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
        # a structured task's own format is in its developer message: they share the system message
        while group[0].family != "structured" and "user" not in harmony_encoding().decode(prompts[0][user:user + 2]):
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
    for task in tasks:
        words = task.body["input"].split(": ", 1)[1].split()
        assert "everse" in task.body["input"] and task.answer == " ".join(reversed(words))


def test_python_results_come_in_every_length_up_to_13_digits():
    tasks = generate(1, 1500, mix={"python": 1}, group=8)
    lengths = {len(task.answer.lstrip("-")) for task in tasks}
    assert set(range(1, 14)) <= lengths
    for task in tasks[:200]:
        assert str(eval(task.calls[0][1].removeprefix("print(").removesuffix(")"))) == task.answer  # noqa: S307


def test_every_three_digit_group_is_live():
    from trainer.train import live_vocabulary

    live = set(live_vocabulary([]))
    assert all(set(ordinary_tokens(f"{n:03d}")) <= live and set(ordinary_tokens(str(n))) <= live for n in range(1000))
    assert ordinary_tokens("007") == harmony_encoding().encode("007")  # digits: no special token to check for


def test_long_product_tasks_use_the_seed_phrasing_and_long_operands():
    tasks = long_product_tasks(3, 40)
    for task in tasks:
        a, b = re.fullmatch(r"Multiply (\d+)\*(\d+) using the code_interpreter tool\.", task.body["input"]).groups()
        assert len(a) >= 4 and len(b) >= 3 and task.answer == str(int(a) * int(b))
        assert task.body["tools"][0]["server_label"] == "code_interpreter"
    assert max(len(task.answer) for task in tasks) >= 11


def _accepted(task, first_turn: bool = True) -> bool:
    """Whether the task's first completion is a completion batchrun's grammar accepts for its request."""
    from batch.harmony.constraint import GrammarConstraint
    from batch.responses.request import parse_request
    from batch.harmony.turn_grammar import turn_grammar
    from tools.registry import ToolRegistry

    request, _ = parse_request(task.body)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    constraint = GrammarConstraint(turn_grammar(registry, request.text_format_json(), first_turn))
    for token in completion_ids(task.steps[0].messages):
        constraint.accept(token)
    return constraint.error is None and constraint.is_accepting


def test_forced_calls_render_like_auto_and_match_the_grammar():
    tasks = [task for task in generate(4, 200, mix={"function_call": 1}, group=8) if "tool_choice" in task.body]
    choices = [json.dumps(task.body["tool_choice"]) for task in tasks]
    assert '"required"' in choices and any('"name"' in c for c in choices)
    for task in tasks:
        choice = task.body["tool_choice"]
        assert choice == "required" or task.calls[0][0] == f"functions.{choice['name']}"
        auto = {key: value for key, value in task.body.items() if key != "tool_choice"}
        assert request_prompt(task.body) == request_prompt(auto)  # tool_choice is not in the prompt
        assert _accepted(task)


def test_structured_answers_fill_their_schema_and_match_the_grammar():
    import jsonschema

    tasks = generate(6, 120, mix={"structured": 1}, group=4)
    schemas = [task.body["text"]["format"].get("schema") for task in tasks]
    assert len({json.dumps(s) for s in schemas}) >= 8 and None in schemas  # a family of shapes, and json_object
    for task in tasks:
        answer = json.loads(task.answer)
        jsonschema.validate(answer, task.body["text"]["format"].get("schema", {"type": "object"}))
        assert json.loads(task.steps[-1].messages[-1].content[0].text) == answer
        assert all(str(v) in task.body["input"] for v in _leaves(answer))  # the request says every value
        assert _accepted(task)
        plain = {key: value for key, value in task.body.items() if key != "text"}
        text = harmony_encoding().decode(request_prompt(task.body))
        text_format = task.body["text"]["format"]
        if text_format["type"] == "json_object":  # the guide has no form for it: not in the prompt
            assert request_prompt(task.body) == request_prompt(plain)
        else:  # the training prompt shows the schema as the guide's # Response Formats
            assert f"# Response Formats\n\n## {text_format['name']}\n\n{{" in text


def _leaves(value):
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def test_a_question_with_no_tool_enabled_is_declined():
    tasks = [task for task in generate(2, 300, mix={"no_tool": 1}, group=4) if task.answer == DECLINE]
    assert tasks
    for task in tasks:
        assert task.body.get("tool_choice") == "none" or not task.body["tools"]
