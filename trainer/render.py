"""A generated task -> the exact tokens batchrun decodes, with a mask of what the model must say.

The prompt of each turn is what `batchrun submit` renders for the request (batch/harmony/render.py
and tool_sections.py, the same code path); the model's turns are harmony messages; tool
answers are rendered as the session feeds them back (`render_tool_output`). So a training
sequence is token for token what the model sees and emits under `batchrun submit`.
"""

from __future__ import annotations

from dataclasses import dataclass

from openai_harmony import Message, Role

from batch.harmony.render import PromptOptions, render_prompt, render_tool_output
from batch.harmony.token_parser import RETURN_TOKEN
from batch.responses.request import parse_request
from batch.harmony.vocab import harmony_encoding
from tools.registry import ToolRegistry

ASSISTANT_HEADER = 2  # `<|start|>assistant`: the prompt already ends with it
RENDER_OPTIONS = PromptOptions()  # tasks carry their date in metadata.conversation_date


@dataclass(frozen=True)
class Step:
    """One model turn: its messages, then (unless it is the last) the tool's answer."""

    messages: tuple[Message, ...]
    tool_author: str | None = None
    tool_output: str | None = None


@dataclass(frozen=True)
class Sequence:
    token_ids: list[int]
    is_target: list[bool]  # loss on this position's token (the model emitted it)


def analysis(text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")


def final(text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final")


def python_call(code: str) -> Message:
    return analysis(code).with_recipient("python").with_content_type("code")


def browser_call(action: str, arguments: str) -> Message:
    return analysis(arguments).with_recipient(f"browser.{action}").with_content_type("<|constrain|>json")


def function_call(name: str, arguments: str) -> Message:
    return (Message.from_role_and_content(Role.ASSISTANT, arguments).with_channel("commentary")
            .with_recipient(f"functions.{name}").with_content_type("<|constrain|>json"))


def request_prompt(body: dict) -> list[int]:
    """The first prompt batchrun renders for `body` (built-in and function tools need no listing)."""
    request, _ = parse_request({key: value for key, value in body.items() if key != "custom_id"})
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    return render_prompt(request, request.input_items(), registry, RENDER_OPTIONS)


def completion_ids(messages: tuple[Message, ...]) -> list[int]:
    """A turn's completion: the messages after the prompt's `<|start|>assistant`; a final
    answer ends the response with `<|return|>`."""
    encoding = harmony_encoding()
    ids: list[int] = []
    for message in messages:
        ids += encoding.render(message)
    ids = ids[ASSISTANT_HEADER:]
    if messages[-1].channel == "final":
        ids[-1] = RETURN_TOKEN
    return ids


def render_sequence(body: dict, steps: list[Step]) -> Sequence:
    token_ids = request_prompt(body)
    is_target = [False] * len(token_ids)
    for step in steps:
        completion = completion_ids(step.messages)
        token_ids += completion
        is_target += [True] * len(completion)
        if step.tool_author is not None:
            answer = render_tool_output(step.tool_author, step.tool_output or "", step.messages[-1].channel)
            token_ids += answer
            is_target += [False] * len(answer)
    return Sequence(token_ids, is_target)
