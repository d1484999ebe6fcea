"""The Responses request body batchrun accepts, as pydantic models.

`parse_request` is the one entry: it sets aside the fields the runner cannot
honour, validates the rest, and turns pydantic's errors into one readable
`RequestError` naming the field (`tools[0].name`, `input[2].call_id`).
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, ValidationError)

from batch.responses.request_errors import RequestError, json_type, readable_error
from batch.responses.request_shapes import Strict, str_or, tag_of, tagged
from batch.responses.request_tools import FunctionTool, Tool, ToolChoice
from batch.responses.strict_schema import strict_schema_problem

# Accepted so that requests written for the API run unchanged, but with no
# effect here: there is no streaming to a client, no server-side store, etc.
IGNORED_FIELDS = frozenset({
    "background", "stream", "stream_options", "store", "service_tier",
    "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
})
# Of those, the ones the Response object echoes as sent: validated and kept in the request for that alone.
ECHOED_IGNORED_FIELDS = frozenset({"store", "prompt_cache_key", "safety_identifier"})
# Fields whose meaning lives on OpenAI's servers: ignored, the line would decode another request.
_SERVER_SIDE = {"prompt": "a reusable prompt is kept on OpenAI's servers, which batchrun cannot read: write its "
                          "instructions and input into the line"}
# openai.types.responses.ResponseIncludable (a test holds them equal): importing openai's types takes 0.6 s.
Includable = Literal["file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                     "message.input_image.image_url", "computer_call_output.output.image_url",
                     "code_interpreter_call.outputs", "reasoning.encrypted_content", "message.output_text.logprobs"]
# The one `include` value that changes what is decoded: every output_text part and text event carries its
# tokens' logprobs. The others name outputs that are always kept here, or that nothing here makes.
INCLUDE_LOGPROBS = "message.output_text.logprobs"


# The unions below are built at runtime (`tagged`, `str_or`) for pydantic, which a
# type checker cannot read as types: under TYPE_CHECKING each is spelt as the plain
# union it validates to. Keep the two spellings of each alias in step.

# --- content parts ---------------------------------------------------------

class InputText(Strict):
    type: Literal["input_text"]
    text: str


class OutputText(Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class PlainText(Strict):
    type: Literal["text"]
    text: str


class SummaryText(Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(Strict):
    type: Literal["reasoning_text"]
    text: str


if TYPE_CHECKING:
    MessagePart: TypeAlias = InputText | OutputText | PlainText
    MessageContent: TypeAlias = str | list[MessagePart]
    CallOutput: TypeAlias = str | list[InputText]
else:
    MessagePart = tagged(("input_text", InputText), ("output_text", OutputText), ("text", PlainText),
                          tag=tag_of())
    MessageContent = str_or(list[MessagePart], "expected a string or a list of content parts")
    CallOutput = str_or(list[InputText], "expected a string or a list of input_text parts")
ItemStatus = Literal["in_progress", "completed", "incomplete"]


# --- input items -----------------------------------------------------------

class MessageItem(Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: MessageContent
    id: str | None = None
    status: ItemStatus | None = None
    # An assistant message's: `commentary` (said before a tool call, harmony's commentary channel) or the answer.
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: CallOutput
    id: str | None = None
    status: ItemStatus | None = None


class ReasoningItem(Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None


class _Hosted(BaseModel):
    # The fields of HostedItem and McpCallItem; each narrows `type` to its own tags.
    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    id: str | None = None


class HostedItem(_Hosted):
    """An output item of a previous response pasted back; the renderer decides."""

    type: Literal["mcp_list_tools", "code_interpreter_call", "web_search_call"]


class McpCallItem(_Hosted):
    type: Literal["mcp_call"]
    # The renderer addresses the call as `<server_label>.<name>`.
    server_label: str
    name: str


class ItemReference(Strict):
    """An item of a stored response, by its id: admission puts the item itself in its place."""

    type: Literal["item_reference"]
    id: str


def _item_tag(value: Any) -> str | None:
    # A message may leave out `type`: `{"role": "user", "content": "..."}`.
    if (isinstance(value, dict) and "type" not in value) or isinstance(value, MessageItem):
        return "message"
    return tag_of()(value)


if TYPE_CHECKING:
    InputItem: TypeAlias = (MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
                            | McpCallItem | HostedItem | ItemReference)
    RequestInput: TypeAlias = str | list[InputItem]
else:
    InputItem = tagged(
        ("message", MessageItem), ("function_call", FunctionCallItem),
        ("function_call_output", FunctionCallOutputItem), ("reasoning", ReasoningItem),
        ("mcp_call", McpCallItem), ("mcp_list_tools", HostedItem),
        ("code_interpreter_call", HostedItem), ("web_search_call", HostedItem),
        ("item_reference", ItemReference), tag=_item_tag)
    RequestInput = str_or(list[InputItem], "expected a string or a list of input items")


# --- text.format -----------------------------------------------------------

class TextFormatText(Strict):
    type: Literal["text"]


class TextFormatJsonObject(Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["json_schema"]
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    # `schema` would shadow a BaseModel attribute: stored as json_schema, read and written as "schema".
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


if TYPE_CHECKING:
    TextFormat: TypeAlias = TextFormatText | TextFormatJsonObject | TextFormatJsonSchema
else:
    TextFormat = tagged(("text", TextFormatText), ("json_object", TextFormatJsonObject),
                         ("json_schema", TextFormatJsonSchema), tag=tag_of())


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


# --- the request -----------------------------------------------------------

# The reasoning efforts a request (`reasoning.effort`) and a run (`--reasoning-effort`) may name:
# the one list of them (the CLI's choices and the harmony rendering derive from it).
ReasoningEffortName: TypeAlias = Literal["minimal", "low", "medium", "high"]
REASONING_EFFORTS: tuple[str, ...] = typing.get_args(ReasoningEffortName)


ReasoningSummary: TypeAlias = Literal["auto", "concise", "detailed"]


class Reasoning(Strict):
    effort: ReasoningEffortName | None = None
    summary: ReasoningSummary | None = None  # echoed in the response; gpt-oss writes no summaries
    generate_summary: ReasoningSummary | None = None  # (the API's older name of summary)


Metadata = Annotated[
    dict[Annotated[str, StringConstraints(max_length=64)],
         Annotated[str, StringConstraints(max_length=512)]],
    Field(max_length=16)]


ConversationId = Annotated[str, StringConstraints(min_length=1)]


class ConversationRef(Strict):
    id: ConversationId


if TYPE_CHECKING:
    Conversation: TypeAlias = str | ConversationRef
else:
    Conversation = str_or(ConversationRef, 'expected a conversation id (a non-empty string) or {"id": ...}',
                           "dict", text=ConversationId)


class ResponsesRequest(Strict):
    """The supported part of a Responses API request body (ignored fields removed)."""

    input: RequestInput
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice = "auto"
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    reasoning: Reasoning | None = None
    text: TextConfig | None = None  # text.format constrains the final answer (batch.harmony.turn_grammar)
    metadata: Metadata | None = None
    parallel_tool_calls: bool | None = None
    model: str | None = None
    previous_response_id: str | None = None
    # the run's lines naming one conversation decode in order, each continuing the one before (batch.run.conversations)
    conversation: Conversation | None = None
    include: list[Includable] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # auto: a prompt longer than the context drops conversation items from its start (batch.run.admission)
    truncation: Literal["auto", "disabled"] | None = None
    # Not honoured either, but echoed in the Response object as the API does (the last three reported as ignored).
    user: str | None = None
    store: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @property
    def conversation_id(self) -> str | None:
        """`conversation` as its id (the API takes the id or `{"id": ...}`)."""
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    def input_items(self) -> list[dict]:
        """`input` as a list of JSON items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return [item.model_dump(mode="json", exclude_none=True) for item in self.input]

    def tool_dicts(self) -> list[dict]:
        """`tools` as JSON objects (as the registry reads and the response echoes them)."""
        return [tool.model_dump(mode="json", exclude_none=True) for tool in self.tools or []]

    def tool_choice_json(self) -> str | dict:
        """`tool_choice` as JSON: a mode string or a choice object."""
        choice = self.tool_choice
        return choice if isinstance(choice, str) else choice.model_dump(mode="json", exclude_none=True)

    def text_format_json(self) -> dict:
        """`text.format` as JSON (`{"type": "text"}` when absent), as the response echoes it."""
        text_format = self.text and self.text.format
        if text_format is None:
            return {"type": "text"}
        echoed = text_format.model_dump(mode="json", exclude_none=True, by_alias=True)
        if echoed["type"] == "json_schema":  # the API echoes these (strict defaults to false)
            echoed = {"description": None, "strict": False, **echoed}
        return echoed

    @property
    def num_top_logprobs(self) -> int | None:
        """How many most likely tokens each output_text token lists (`top_logprobs`, 0 by default) when the
        request includes logprobs; None when it does not."""
        if INCLUDE_LOGPROBS not in (self.include or ()):
            return None
        return self.top_logprobs or 0

    def with_effort(self, default: str) -> ResponsesRequest:
        """This request with `reasoning.effort` set (to `default` when it names none)."""
        reasoning = self.reasoning or Reasoning()
        if reasoning.effort:
            return self
        return self.model_copy(update={"reasoning": reasoning.model_copy(update={"effort": default})})


def parse_request(body: dict) -> tuple[ResponsesRequest, list[str]]:
    """Validate a request body: (request, names of ignored fields present, in body order).

    Raises RequestError naming the first bad field, with "(and N more)" when
    there are several.
    """
    if not isinstance(body, dict):
        raise RequestError("", f"expected a JSON object, got {json_type(body)}")
    for name, why in _SERVER_SIDE.items():
        if name in body:
            raise RequestError(name, why)
    ignored = [name for name in body if name in IGNORED_FIELDS]
    kept = {name: value for name, value in body.items()
            if name not in IGNORED_FIELDS or name in ECHOED_IGNORED_FIELDS}
    try:
        request = ResponsesRequest.model_validate(kept)
    except ValidationError as exc:
        raise readable_error(exc, kept) from None
    _check_strict_schemas(request)
    return request, ignored


def _check_strict_schemas(request: ResponsesRequest) -> None:
    """A schema given with `strict: true` must be one the API takes under strict (batch/responses/strict_schema.py)."""
    text_format = request.text.format if request.text is not None else None
    if isinstance(text_format, TextFormatJsonSchema) and text_format.strict:
        problem = strict_schema_problem(text_format.json_schema)
        if problem:
            raise RequestError("text.format.schema",
                               f"invalid schema for response_format {text_format.name!r} under strict: {problem}")
    for index, tool in enumerate(request.tools or []):
        if isinstance(tool, FunctionTool) and tool.strict and tool.parameters is not None:
            problem = strict_schema_problem(tool.parameters)
            if problem:
                raise RequestError(f"tools[{index}].parameters",
                                   f"invalid schema for function {tool.name!r} under strict: {problem}")
