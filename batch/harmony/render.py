"""Request -> harmony conversation -> prompt tokens (completions are parsed in batch/harmony/token_parser.py).

Rendering is a pure function of the request and the run options: the conversation
date comes from the request's `metadata.conversation_date` or `--conversation-date`,
never the wall clock, so the same request always renders the same tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeAlias

from openai_harmony import Author, Conversation, DeveloperContent, Message, Role, TextContent

from batch.responses.request import ResponsesRequest, TextFormatJsonSchema
from batch.harmony.attempt import read_attempt
from batch.harmony.call_header import CallHeaders, header_ids, read_header
from batch.harmony.head import HEADS, HeadSpec, system_content
from batch.harmony.sections import response_format_section
from batch.harmony.output_parser import CODE_ARGUMENTS_OPEN
from batch.harmony.token_parser import CALL_TOKEN, MESSAGE_TOKEN, assistant_start_ids
from batch.harmony.tool_sections import ToolSections
from batch.harmony.vocab import harmony_encoding, ordinary_tokens
from tools.registry import ToolRegistry
from tools.servers import builtin_kind

KNOWLEDGE_CUTOFF = "2024-06"

__all__ = ["RenderError", "PromptOptions", "head_spec", "render_prompt", "render_tool_output", "input_messages",
           "render_sampling", "error_answer", "browser_call", "with_browser_calls"]


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


def is_instruction(item: dict) -> bool:
    """A system or developer message: rendered into the developer message's instructions, not the conversation."""
    return item.get("type", "message") == "message" and item.get("role") in ("system", "developer")


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])


def _instructions(request: ResponsesRequest, items: str | list[dict] | None) -> str | None:
    """The developer message's `# Instructions`: the request's `instructions`, then the text of each
    system/developer input message, in order, as paragraphs.

    The guide has one developer message, and the "system prompt" is its `# Instructions`; a
    Responses input message with role system or developer is such a prompt (vLLM puts it there
    too). A bare second developer message has no header and would follow the `# Tools` section.
    """
    parts = [request.instructions] if request.instructions else []
    if isinstance(items, list):
        parts += [_text_of(item.get("content")) for item in items if is_instruction(item)]
    parts = [part for part in parts if part]
    return "\n\n".join(parts) if parts else None


def _response_format(request: ResponsesRequest) -> str | None:
    """The guide's `# Response Formats` section for a json_schema `text.format` (None otherwise).

    `json_object` has no name or schema to show and the guide has no form for it: only the
    grammar holds such an answer to JSON.
    """
    text_format = request.text and request.text.format
    if not isinstance(text_format, TextFormatJsonSchema):
        return None
    return response_format_section(text_format.name, text_format.json_schema, text_format.description)


def head_spec(request: ResponsesRequest, items: str | list[dict], registry: ToolRegistry,
              options: PromptOptions) -> HeadSpec:
    """What the request's head shows: its effort and date (the run's when it names none), the
    instructions, the tools the registry enabled (MCP servers as listed), the text format."""
    return HeadSpec(effort=(request.reasoning and request.reasoning.effort) or options.reasoning_effort,
                    date=(request.metadata or {}).get("conversation_date") or options.conversation_date,
                    knowledge_cutoff=options.knowledge_cutoff, instructions=_instructions(request, items),
                    tools=ToolSections.of(registry), commentary=tuple(registry.commentary_namespaces()),
                    response_format=_response_format(request))


def _assistant(text: str, channel: str | None, recipient: str | None = None,
               content_type: str | None = None) -> Message:
    message = Message.from_role_and_content(Role.ASSISTANT, text)
    if channel:  # a call the model wrote with no channel has none
        message = message.with_channel(channel)
    if recipient:
        message = message.with_recipient(recipient)
    if content_type:
        message = message.with_content_type(content_type)
    return message


def _tool(author: str, text: str, channel: str | None) -> Message:
    """A tool's answer, on the channel of the call it answers: gpt-oss's tools answer so (its `Tool.process`
    sets an answer's channel to the call's), so python and browser answers are on `analysis`, and harmony's
    `auto_drop_analysis` drops them with their calls once a final answer follows."""
    message = Message.from_author_and_content(Author.new(Role.TOOL, author), text).with_recipient("assistant")
    return message.with_channel(channel) if channel else message


@dataclass(frozen=True)
class _WrittenCall:
    """A past call rendered with its header as the model wrote it (batch/harmony/call_header.py)."""

    header: str
    text: str
    channel: str | None  # as harmony reads the header (the answer's too)

    def tokens(self) -> list[int]:
        # A past call ends in <|call|>, as harmony renders one.
        return [*assistant_start_ids(), *header_ids(self.header), MESSAGE_TOKEN, *ordinary_tokens(self.text),
                CALL_TOKEN]


_Rendered: TypeAlias = Message | _WrittenCall  # a message as harmony renders it, or a call as written


def _call(item: dict, headers: CallHeaders, text: str, recipient: str, channel: str | None,
          content_type: str | None) -> tuple[_Rendered, str, str | None]:
    """A past call's message, and the author and channel of its answer: its header as the model wrote it, where
    `headers` keeps one by the item's id (the loop answered from the recipient and on the channel it names);
    else harmony's layout of `recipient`, `channel` and `content_type`, the item kind's own."""
    header = headers.get(item["id"]) if headers and isinstance(item.get("id"), str) else None
    fields = read_header(header) if header is not None else None
    if header is None or fields is None:
        return _assistant(text, channel, recipient, content_type), recipient, channel
    return _WrittenCall(header, text, fields.channel), fields.recipient, fields.channel


def _item_messages(index: int, item: dict, calls: dict[str, tuple[str, str | None]],
                   headers: CallHeaders) -> list[_Rendered]:
    """Harmony messages for one input item (an empty list for items with no text). `calls`: the author and
    channel of each function call's answer so far, by call_id."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item["role"]
        text = _text_of(item.get("content"))
        if role == "assistant":  # a `commentary` phase is a preamble the model wrote on that channel
            return [_assistant(text, "commentary" if item.get("phase") == "commentary" else "final")]
        if role in ("system", "developer"):
            return []  # in the developer message's `# Instructions` (_instructions)
        return [Message.from_role_and_content(Role.USER, text)]
    if kind == "reasoning":
        # The analysis channel holds the model's raw chain of thought (the guide's Reasoning
        # section); a summary is not that text, so an item with only a summary renders nothing
        # (as vLLM). Content parts are pieces of one chain of thought: joined by a newline, as
        # vLLM does, so the last word of one part and the first of the next stay apart.
        text = "\n".join(part.get("text", "") for part in item.get("content") or [])
        attempt = read_attempt(item.get("encrypted_content"))
        if attempt is not None:  # a call no tool served, and the error that answered it (batch/harmony/attempt.py)
            call, author, channel = _call(item, headers, text, attempt.recipient, attempt.channel,
                                          attempt.content_type)
            return [call, _tool(author, attempt.answer, channel)]
        return [_assistant(text, "analysis")] if text else []
    if kind == "function_call":
        call, author, channel = _call(item, headers, item["arguments"], f"functions.{item['name']}", "commentary",
                                      "<|constrain|>json")
        calls[item["call_id"]] = (author, channel)
        return [call]
    if kind == "function_call_output":
        answered = calls.get(item["call_id"])
        if answered is None:
            raise RenderError(f"input[{index}].call_id",
                              f"no function_call with call_id {item['call_id']!r} comes before this output")
        author, channel = answered
        return [_tool(author, _text_of(item["output"]), channel)]
    if kind == "code_interpreter_call":
        outputs = item.get("outputs") or []
        if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
            raise RenderError(f"input[{index}].outputs", "expected a list of output objects")
        logs = "".join(str(o.get("logs") or "") for o in outputs)
        if item.get("status") == "failed":  # its logs are the error, which the model read as the session wrote it
            logs = error_answer(logs)
        call, author, channel = _call(item, headers, _string_field(item, index, "code"), "python", "analysis", "code")
        return [call, _tool(author, logs, channel)]
    if kind == "mcp_call":
        error = item.get("error")
        output = error_answer(_error_text(error)) if error else _string_field(item, index, "output")
        arguments = _string_field(item, index, "arguments")
        builtin = builtin_kind(item["server_label"])
        if builtin == "python":  # served by the built-in's section: the call was `to=python`, as the guide's
            call, author, channel = _call(item, headers, _python_code(arguments), "python", "analysis", "code")
        elif builtin == "browser":  # ... and `to=browser.<action>`, never `web_search.search` nor on commentary
            call, author, channel = _call(item, headers, arguments, f"browser.{item['name']}", "analysis",
                                          "<|constrain|>json")
        else:
            call, author, channel = _call(item, headers, arguments, f"{item['server_label']}.{item['name']}",
                                          "commentary", "<|constrain|>json")
        return [call, _tool(author, output, channel)]
    return []  # web_search_call, mcp_list_tools: nothing the model needs to re-read


def _python_code(arguments: str) -> str:
    """The code of an mcp_call the built-in python served: its arguments `{"code": ...}` (the model wrote the code
    raw, batch/harmony/output_parser.py), those of a call the response ended in (no closing `"}`: each token's text
    is escaped whole, so the rest decodes as a string), or raw code itself (an item written so by hand, or by
    batchrun before)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        if not arguments.startswith(CODE_ARGUMENTS_OPEN):
            return arguments
        try:
            value = {"code": json.loads(f'"{arguments.removeprefix(CODE_ARGUMENTS_OPEN)}"')}
        except ValueError:
            return arguments
    code = value.get("code") if isinstance(value, dict) and len(value) == 1 else None
    return code if isinstance(code, str) else arguments


def _string_field(item: dict, index: int, key: str) -> str:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise RenderError(f"input[{index}].{key}", f"expected a string, got {type(value).__name__}")
    return value or ""


def error_answer(text: str) -> str:
    """A failed tool call's answer as the model read it (the session's words for any tool's error)."""
    return f"Error: {text}"


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


def browser_call(name: str, arguments: str, answer: str) -> dict:
    """The item a `web_search_call` of batchrun's own renders as: the built-in browser's call the model made and
    the page it read (an mcp_call of the `browser` label renders so). The API's item holds neither."""
    return {"type": "mcp_call", "server_label": "browser", "name": name, "arguments": arguments, "output": answer}


def with_browser_calls(items: list[dict], browser_calls: dict[str, dict]) -> list[dict]:
    """`items`, each web_search_call that `browser_calls` knows (by item id) as its `browser_call`, under the
    item's id (a header kept for the call is kept by it: batch/harmony/call_header.py)."""
    if not browser_calls:
        return items
    return [{**browser_calls[item["id"]], "id": item["id"]}
            if item.get("type") == "web_search_call" and item.get("id") in browser_calls else item
            for item in items]


def input_messages(items: str | list[dict], headers: CallHeaders | None = None) -> list[_Rendered]:
    """The request's `input` as harmony messages; a call whose header `headers` keeps (by its item's id) as the
    model wrote it."""
    if isinstance(items, str):
        return [Message.from_role_and_content(Role.USER, items)]
    calls: dict[str, tuple[str, str | None]] = {}
    messages: list[_Rendered] = []
    for index, item in enumerate(items):
        messages.extend(_item_messages(index, item, calls, headers or {}))
    return messages


_PROBE = "Probe 123, <|start|> déjà vu."  # any text: a frame must wrap it as harmony does


class _MessageFrames:
    """The tokens harmony puts around a message's text, per header (author, channel, recipient,
    content type): a message is its frame's head, its text as ordinary tokens, its frame's tail.

    Harmony spends ~80 us a message on its formatting tokens; a frame costs that once. Each
    frame is checked once against harmony's rendering of a probe text, and a header whose
    check fails is left to harmony.
    """

    def __init__(self) -> None:
        self._frames: dict[tuple, tuple[list[int], list[int]] | None] = {}

    def tokens(self, message: Message) -> list[int] | None:
        """The message's tokens, or None when only harmony can render it."""
        if len(message.content) != 1 or not isinstance(message.content[0], TextContent):
            return None
        author = message.author
        key = (author.role, author.name, message.channel, message.recipient, message.content_type)
        if key not in self._frames:
            self._frames[key] = _frame(message)
        frame = self._frames[key]
        if frame is None:
            return None
        head, tail = frame
        return [*head, *ordinary_tokens(message.content[0].text), *tail]


def _frame(message: Message) -> tuple[list[int], list[int]] | None:
    encoding = harmony_encoding()
    empty = encoding.render(message.model_copy(update={"content": [TextContent(text="")]}))
    if MESSAGE_TOKEN not in empty:
        return None
    cut = empty.index(MESSAGE_TOKEN) + 1
    head, tail = empty[:cut], empty[cut:]
    probe = encoding.render(message.model_copy(update={"content": [TextContent(text=_PROBE)]}))
    return (head, tail) if probe == [*head, *ordinary_tokens(_PROBE), *tail] else None


_FRAMES = _MessageFrames()


def _answered_reasoning_dropped(messages: list[_Rendered]) -> list[_Rendered]:
    """The messages without the analysis before the conversation's first final answer.

    Harmony drops those when the conversation ends with a final answer (the turn after an answered exchange
    reads none of its reasoning), and keeps them when it ends otherwise. A conversation that went on past its
    first answer and ends in a call (a later turn's tool loop, a function call continued with its output) was
    read, on every turn since that answer, without them: they stay dropped, so a re-render is what the model
    read (the guide: drop previous reasoning once a response ended in a final message)."""
    first_final = next((index for index, message in enumerate(messages) if message.channel == "final"), None)
    if first_final is None:
        return messages
    return [message for index, message in enumerate(messages)
            if index >= first_final or message.channel != "analysis"]


def _message_tokens(message: _Rendered) -> list[int]:
    if isinstance(message, _WrittenCall):
        return message.tokens()
    rendered = _FRAMES.tokens(message)
    return rendered if rendered is not None else harmony_encoding().render(message)


def _tail_tokens(messages: list[_Rendered]) -> list[int]:
    """The input messages' tokens and the assistant's header, as harmony renders them for completion (but a
    call's header as the model wrote it). Harmony renders a conversation message by message, and the only
    messages it would drop (analysis before the first final answer) are dropped here already."""
    tail = [token for message in _answered_reasoning_dropped(messages) for token in _message_tokens(message)]
    return [*tail, *assistant_start_ids()]


def render_prompt(request: ResponsesRequest, items: str | list[dict], registry: ToolRegistry,
                  options: PromptOptions, headers: CallHeaders | None = None) -> list[int]:
    """Prompt tokens for a request whose conversation input is `items` (`headers`: the calls' headers as the
    model wrote them, by item id: batch/harmony/call_header.py)."""
    return [*HEADS.tokens(head_spec(request, items, registry, options)),
            *_tail_tokens(input_messages(items, headers))]


def render_tool_output(author: str, text: str, channel: str | None) -> list[int]:
    """Tokens of a tool's answer (on `channel`, the call's) followed by the header of the assistant's next
    message."""
    return _tail_tokens([_tool(author, text, channel)])


def render_sampling(system_prompt: str | None, messages: list[tuple[str, str]], options: PromptOptions) -> list[int]:
    """Prompt tokens for an MCP server's sampling request: harmony's system message (the run's
    effort and date, no tools), the server's system prompt as the developer's instructions, then
    its `(role, text)` turns: a user's as user messages, an assistant's as final answers."""
    content = system_content(options.reasoning_effort, options.conversation_date, options.knowledge_cutoff)
    conversation = [Message.from_role_and_content(Role.SYSTEM, content)]
    if system_prompt:
        conversation.append(Message.from_role_and_content(
            Role.DEVELOPER, DeveloperContent.new().with_instructions(system_prompt)))
    conversation += [_assistant(text, "final") if role == "assistant"
                     else Message.from_role_and_content(Role.USER, text) for role, text in messages]
    return harmony_encoding().render_conversation_for_completion(Conversation.from_messages(conversation),
                                                                  Role.ASSISTANT)
