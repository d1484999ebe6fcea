"""Request -> harmony conversation -> prompt tokens; completion tokens -> parser steps.

Rendering is a pure function of the request and the run options: the conversation
date comes from the request's `metadata.conversation_date` or `--conversation-date`,
never the wall clock, so the same request always renders the same tokens.
"""

from __future__ import annotations

import codecs
import enum
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyError,
    Message,
    ReasoningEffort,
    Role,
    StreamableParser,
    SystemContent,
)

from batch.request import ResponsesRequest
from batch.vocab import harmony_encoding
from tools.registry import ToolRegistry

KNOWLEDGE_CUTOFF = "2024-06"
RETURN_TOKEN = 200002
CALL_TOKEN = 200012
STOP_TOKEN_IDS = (RETURN_TOKEN, CALL_TOKEN)
_EFFORT = {
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}

__all__ = ["HarmonyError", "RenderError", "PromptOptions", "render_prompt", "TokenParser", "Boundary",
           "ParsedMessage"]


class RenderError(ValueError):
    """The request cannot be rendered (names the body field at fault)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class PromptOptions:
    """Run-level rendering options; a request's own fields take precedence."""

    conversation_date: str | None = None
    reasoning_effort: str = "medium"
    knowledge_cutoff: str = KNOWLEDGE_CUTOFF


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


def _system_message(request: ResponsesRequest, registry: ToolRegistry, options: PromptOptions) -> Message:
    effort = (request.reasoning and request.reasoning.effort) or options.reasoning_effort
    date = (request.metadata or {}).get("conversation_date") or options.conversation_date
    content = SystemContent.new().with_reasoning_effort(_EFFORT[effort]).with_knowledge_cutoff(
        options.knowledge_cutoff)
    if date:
        content = content.with_conversation_start_date(date)
    return Message.from_role_and_content(Role.SYSTEM, registry.add_to_system(content))


def _developer_message(request: ResponsesRequest, registry: ToolRegistry) -> Message | None:
    instructions = request.instructions
    if not instructions and not registry.has_developer_tools:
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions(instructions)
    return Message.from_role_and_content(Role.DEVELOPER, registry.add_to_developer(content))


def _assistant(text: str, channel: str, recipient: str | None = None,
               content_type: str | None = None) -> Message:
    message = Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)
    if recipient:
        message = message.with_recipient(recipient)
    if content_type:
        message = message.with_content_type(content_type)
    return message


def _tool(author: str, text: str) -> Message:
    return (Message.from_author_and_content(Author.new(Role.TOOL, author), text)
            .with_channel("commentary").with_recipient("assistant"))


def _item_messages(index: int, item: dict, call_names: dict[str, str]) -> list[Message]:
    """Harmony messages for one input item (an empty list for items with no text)."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item["role"]
        text = _text_of(item.get("content"))
        if role == "assistant":
            return [_assistant(text, "final")]
        return [Message.from_role_and_content(Role.USER if role == "user" else Role.DEVELOPER, text)]
    if kind == "reasoning":
        text = _text_of(item.get("content")) or _text_of(item.get("summary"))
        return [_assistant(text, "analysis")] if text else []
    if kind == "function_call":
        call_names[item["call_id"]] = item["name"]
        return [_assistant(item["arguments"], "commentary", f"functions.{item['name']}",
                           "<|constrain|>json")]
    if kind == "function_call_output":
        name = call_names.get(item["call_id"])
        if name is None:
            raise RenderError(f"input[{index}].call_id",
                              f"no function_call with call_id {item['call_id']!r} comes before this output")
        return [_tool(f"functions.{name}", _text_of(item["output"]))]
    if kind == "code_interpreter_call":
        outputs = item.get("outputs") or []
        if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
            raise RenderError(f"input[{index}].outputs", "expected a list of output objects")
        logs = "".join(str(o.get("logs") or "") for o in outputs)
        code = _string_field(item, index, "code")
        return [_assistant(code, "analysis", "python", "code"), _tool("python", logs)]
    if kind == "mcp_call":
        recipient = f"{item['server_label']}.{item['name']}"
        output = _string_field(item, index, "output") or _error_text(item.get("error"))
        arguments = _string_field(item, index, "arguments")
        return [_assistant(arguments, "commentary", recipient, "<|constrain|>json"), _tool(recipient, output)]
    return []  # web_search_call, mcp_list_tools: nothing the model needs to re-read


def _string_field(item: dict, index: int, key: str) -> str:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise RenderError(f"input[{index}].{key}", f"expected a string, got {type(value).__name__}")
    return value or ""


def _error_text(error: object) -> str:
    """The text of an mcp_call error: a string, or an SDK error object (as events.py stores them)."""
    if not error:
        return ""
    if isinstance(error, dict):
        content = error.get("content")
        if isinstance(content, list):
            return _text_of([part for part in content if isinstance(part, dict)])
        return str(error.get("message") or json.dumps(error))
    return str(error)


def input_messages(items: str | list[dict]) -> list[Message]:
    """The request's `input` as harmony messages."""
    if isinstance(items, str):
        return [Message.from_role_and_content(Role.USER, items)]
    call_names: dict[str, str] = {}
    messages: list[Message] = []
    for index, item in enumerate(items):
        messages.extend(_item_messages(index, item, call_names))
    return messages


class _HeadCache:
    """Rendered system (+ developer) messages by their JSON: requests of a run mostly share them.

    Harmony renders a conversation message by message. Only the system message
    depends on the rest (its tool-routing line appears when a developer message
    declares functions), and both sit in the head; the analysis messages a
    conversation drops are assistant ones, all in the tail. So head + tail equals
    the whole conversation's rendering (tests/batch/test_harmony.py checks it),
    and the head, most of a prompt's rendering time, is rendered once.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._tokens: OrderedDict[str, list[int]] = OrderedDict()

    def tokens(self, head: list[Message]) -> list[int]:
        key = json.dumps([message.to_dict() for message in head])
        tokens = self._tokens.get(key)
        if tokens is None:
            tokens = harmony_encoding().render_conversation(Conversation.from_messages(head))
            self._tokens[key] = tokens
            if len(self._tokens) > self.size:
                self._tokens.popitem(last=False)
        else:
            self._tokens.move_to_end(key)
        return tokens


_HEADS = _HeadCache(256)


def render_prompt(request: ResponsesRequest, items: str | list[dict], registry: ToolRegistry,
                  options: PromptOptions) -> list[int]:
    """Prompt tokens for a request whose conversation input is `items`."""
    head = [_system_message(request, registry, options)]
    developer = _developer_message(request, registry)
    if developer is not None:
        head.append(developer)
    tail = Conversation.from_messages(input_messages(items))
    return [*_HEADS.tokens(head),
            *harmony_encoding().render_conversation_for_completion(tail, Role.ASSISTANT)]


def render_tool_output(author: str, text: str) -> list[int]:
    """Tokens of a tool's answer followed by the header of the assistant's next message."""
    encoding = harmony_encoding()
    return encoding.render(_tool(author, text)) + encoding.encode(
        "<|start|>assistant", allowed_special="all")


FIRST_SPECIAL_TOKEN = 199998  # o200k_harmony's special tokens are the ids from here on
START_TOKEN = 200006
MESSAGE_TOKEN = 200008
END_TOKEN = 200007
# Tokens that end a message's content; any other token inside content is text.
CONTENT_END_TOKENS = frozenset((END_TOKEN, CALL_TOKEN, RETURN_TOKEN))


class Boundary(enum.Enum):
    """A token that starts or ends a message's content."""

    OPENED = "opened"
    CLOSED = "closed"


@dataclass(frozen=True)
class ParsedMessage:
    """A complete harmony message of the completion: its header and its text."""

    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str
    end_token: int


class _ContentDecoder:
    """A message's content tokens -> text, incrementally (a character split over tokens waits).

    Harmony's parser would do the same at ~1 us a token; the text of most tokens is
    cached, and only a token that leaves a character incomplete goes through the
    UTF-8 decoder. Bytes still pending when the message ends are dropped (as harmony's
    deltas drop them). Invalid bytes become U+FFFD where the decoder meets them; on such
    output harmony's deltas could place them a token later, or lose the text after them.
    """

    __slots__ = ("_decoder", "_pending")

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = False

    def decode(self, token_id: int) -> str:
        try:
            text = _TOKEN_TEXTS[token_id]
        except KeyError:
            text = _TOKEN_TEXTS[token_id] = _whole_text(token_id)
        if text is not None and not self._pending:
            return text
        delta = self._decoder.decode(_token_bytes(token_id))
        self._pending = bool(self._decoder.getstate()[0])
        return delta


_TOKEN_TEXTS: dict[int, str | None] = {}  # token id -> its text; None when it is not whole UTF-8


def _token_bytes(token_id: int) -> bytes:
    return bytes(harmony_encoding()._inner.decode_bytes([token_id]))


def _whole_text(token_id: int) -> str | None:
    try:
        return _token_bytes(token_id).decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class _HeaderFields:
    channel: str | None
    recipient: str | None
    content_type: str | None


class _HeaderOutcomes:
    """What harmony's parser made of each header prefix it has seen: accepted so far (None),
    the header's fields (at `<|message|>`), or its error message.

    Harmony checks a header on its own (after a message's end token it expects the next
    `<|start|>`, and a turn's first header follows the prompt's `<|start|>assistant`), and
    it costs ~25-100 us a header token; a run's models write the same few headers over and
    over, so each prefix is parsed once per process. Cleared when full (garbage headers
    of a random model must not grow it without bound).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._outcomes: dict[tuple[bool, tuple[int, ...]], _HeaderFields | str | None] = {}

    def get(self, key: tuple[bool, tuple[int, ...]]) -> _HeaderFields | str | None | bool:
        """The outcome, or False when this prefix was never parsed."""
        return self._outcomes.get(key, False)

    def put(self, key: tuple[bool, tuple[int, ...]], outcome: _HeaderFields | str | None) -> None:
        if len(self._outcomes) >= self.size:
            self._outcomes.clear()
        self._outcomes[key] = outcome


_HEADERS = _HeaderOutcomes(1 << 16)


class TokenParser:
    """Incremental harmony parsing of one turn's completion tokens, O(1) per token.

    openai-harmony's `StreamableParser` validates the message structure, but its
    `state` and `messages` serialise everything parsed so far to JSON on each read,
    and each header token costs it tens of microseconds. This class reads neither per
    token: the token ids say when content starts (`<|message|>` in a header) and ends
    (`<|end|>`, `<|call|>`, `<|return|>` in content). Headers go through harmony's
    parser once per distinct header (`_HeaderOutcomes` remembers what it said, errors
    included, so a cached header fails at the same token with the same message); content
    tokens never reach it: `_ContentDecoder` turns them into text.
    """

    __slots__ = ("in_content", "channel", "recipient", "content_type", "_parts", "last_message",
                 "_content", "_header", "_first", "_live")

    def __init__(self) -> None:
        self.in_content = False
        self.channel: str | None = None  # of the open message (or the last one, once closed)
        self.recipient: str | None = None
        self.content_type: str | None = None
        self._parts: list[str] = []
        self.last_message: ParsedMessage | None = None
        self._content = _ContentDecoder()
        self._header: list[int] = []  # the current header's tokens so far
        self._first = True  # the turn's first header (it follows the prompt's <|start|>assistant)
        self._live: Any = None  # harmony's parser, on a header it has not seen before

    def feed(self, token_id: int) -> str | Boundary | None:
        """Parse one token; raises HarmonyError on malformed harmony.

        Returns the content text the token added ("" while a character is still
        incomplete), `Boundary.OPENED` when a message's content starts (the header
        fields are set), `Boundary.CLOSED` when it ends (`last_message` is set), or
        None for any other header token.
        """
        if self.in_content:
            if token_id in CONTENT_END_TOKENS:
                self.in_content = False
                self._header, self._first = [], False
                self.last_message = ParsedMessage(self.channel, self.recipient, self.content_type,
                                                  "".join(self._parts), token_id)
                return Boundary.CLOSED
            if token_id >= FIRST_SPECIAL_TOKEN:  # harmony would keep `<|channel|>` etc. as text
                raise HarmonyError(f"control token {harmony_encoding().decode([token_id])} inside a message")
            delta = self._content.decode(token_id)
            if delta:
                self._parts.append(delta)
            return delta
        self._header.append(token_id)
        key = (self._first, tuple(self._header))
        outcome = _HEADERS.get(key) if self._live is None else False
        if outcome is False:
            outcome = self._parse(token_id, key)
        if isinstance(outcome, str):
            raise HarmonyError(outcome)
        if isinstance(outcome, _HeaderFields):
            self.in_content, self._live = True, None
            self.channel, self.recipient, self.content_type = outcome.channel, outcome.recipient, outcome.content_type
            self._parts = []
            self._content = _ContentDecoder()
            return Boundary.OPENED
        return None

    def _parse(self, token_id: int, key: tuple[bool, tuple[int, ...]]) -> _HeaderFields | str | None:
        """Harmony's verdict on a header prefix not seen before (remembered for the next time)."""
        if self._live is None:
            parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT if self._first else None)
            # The Rust object behind the wrapper has the same methods, two Python frames nearer.
            self._live = getattr(parser, "_inner", parser)
            for earlier in self._header[:-1]:  # accepted before: they were remembered so
                self._live.process(earlier)
        outcome: _HeaderFields | str | None = None
        try:
            self._live.process(token_id)
        except HarmonyError as exc:
            outcome = str(exc)
        else:
            if token_id == MESSAGE_TOKEN:
                live = self._live
                outcome = _HeaderFields(live.current_channel, live.current_recipient, live.current_content_type)
        _HEADERS.put(key, outcome)
        return outcome

    @property
    def text(self) -> str:
        """The text of the open message so far."""
        return "".join(self._parts)
