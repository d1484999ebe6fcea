"""The Responses request body batchrun accepts, as pydantic models.

`parse_request` is the one entry: it sets aside the fields the runner cannot
honour, validates the rest, and turns pydantic's errors into one readable
`RequestError` naming the field (`tools[0].name`, `input[2].call_id`).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag,
                      ValidationError)

from batch.responses.request_errors import RequestError, json_type, readable_error
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
WebSearchType = Literal["web_search", "web_search_preview", "web_search_2025_08_26",
                        "web_search_preview_2025_03_11"]
_WEB_SEARCH_TYPES: tuple[str, ...] = typing.get_args(WebSearchType)


class _Strict(BaseModel):
    # strict: a string where a number is expected is an error, as in the API.
    model_config = ConfigDict(extra="forbid", strict=True)


def _tag_of(aliases: dict[str, str] | None = None) -> Callable[[Any], str | None]:
    """A discriminator reading `type` (None, i.e. "no tag", for non-objects)."""
    def tag(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if not isinstance(kind, str):
            return None
        return (aliases or {}).get(kind, kind)
    return tag


def _tagged(*choices: tuple[str, Any], tag: Callable[[Any], str | None]) -> Any:
    """A union of `(tag, type)` choices, picked by `tag(value)`."""
    members = tuple(Annotated[model, Tag(name)] for name, model in choices)
    return Annotated[Union[members], Discriminator(tag)]  # noqa: UP007 - built from a tuple


_SHAPES: dict[type, str] = {str: "str", list: "list", dict: "dict"}


def _shape(value: Any) -> str | None:
    # On the way out (model_dump) the value of an object branch is the parsed model, not a dict.
    return "dict" if isinstance(value, BaseModel) else _SHAPES.get(type(value))


def _str_or(other: Any, message: str, shape: str = "list", text: Any = str) -> Any:
    """`text | other` (`text` a str type), picked by the input's JSON shape, with one error if neither."""
    return Annotated[Annotated[text, Tag("str")] | Annotated[other, Tag(shape)],
                     Discriminator(_shape, custom_error_type="invalid_shape",
                                   custom_error_message=message)]


# The unions below are built at runtime (`_tagged`, `_str_or`) for pydantic, which a
# type checker cannot read as types: under TYPE_CHECKING each is spelt as the plain
# union it validates to. Keep the two spellings of each alias in step.

# --- content parts ---------------------------------------------------------

class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class PlainText(_Strict):
    type: Literal["text"]
    text: str


class SummaryText(_Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Strict):
    type: Literal["reasoning_text"]
    text: str


if TYPE_CHECKING:
    MessagePart: TypeAlias = InputText | OutputText | PlainText
    MessageContent: TypeAlias = str | list[MessagePart]
    CallOutput: TypeAlias = str | list[InputText]
    StrOrObject: TypeAlias = str | dict[str, Any]
else:
    MessagePart = _tagged(("input_text", InputText), ("output_text", OutputText), ("text", PlainText),
                          tag=_tag_of())
    MessageContent = _str_or(list[MessagePart], "expected a string or a list of content parts")
    CallOutput = _str_or(list[InputText], "expected a string or a list of input_text parts")
    StrOrObject = _str_or(dict[str, Any], "expected a string or an object", "dict")
ItemStatus = Literal["in_progress", "completed", "incomplete"]


# --- input items -----------------------------------------------------------

class MessageItem(_Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: MessageContent
    id: str | None = None
    status: ItemStatus | None = None
    # An assistant message's: `commentary` (said before a tool call, harmony's commentary channel) or the answer.
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: CallOutput
    id: str | None = None
    status: ItemStatus | None = None


class ReasoningItem(_Strict):
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


class ItemReference(_Strict):
    """An item of a stored response, by its id: admission puts the item itself in its place."""

    type: Literal["item_reference"]
    id: str


def _item_tag(value: Any) -> str | None:
    # A message may leave out `type`: `{"role": "user", "content": "..."}`.
    if (isinstance(value, dict) and "type" not in value) or isinstance(value, MessageItem):
        return "message"
    return _tag_of()(value)


if TYPE_CHECKING:
    InputItem: TypeAlias = (MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
                            | McpCallItem | HostedItem | ItemReference)
    RequestInput: TypeAlias = str | list[InputItem]
else:
    InputItem = _tagged(
        ("message", MessageItem), ("function_call", FunctionCallItem),
        ("function_call_output", FunctionCallOutputItem), ("reasoning", ReasoningItem),
        ("mcp_call", McpCallItem), ("mcp_list_tools", HostedItem),
        ("code_interpreter_call", HostedItem), ("web_search_call", HostedItem),
        ("item_reference", ItemReference), tag=_item_tag)
    RequestInput = _str_or(list[InputItem], "expected a string or a list of input items")


# --- tools -----------------------------------------------------------------

class FunctionTool(_Strict):
    type: Literal["function"]
    # The name becomes the harmony recipient `functions.<name>`: no dots or spaces.
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CodeInterpreterTool(_Strict):
    type: Literal["code_interpreter"]
    container: StrOrObject | None = None


class WebSearchTool(_Strict):
    type: WebSearchType
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: dict[str, Any] | None = None
    filters: dict[str, Any] | None = None


class McpToolFilter(_Strict):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpApprovalFilter(_Strict):
    """require_approval as a filter: the tools that need approval, and those that do not."""

    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


if TYPE_CHECKING:
    ApprovalPolicy: TypeAlias = Literal["always", "never"] | McpApprovalFilter
else:
    ApprovalPolicy = _str_or(McpApprovalFilter, "expected 'always', 'never' or an object", "dict",
                             text=Literal["always", "never"])


class McpTool(_Strict):
    type: Literal["mcp"]
    # The label becomes the harmony recipient's namespace (`label.tool`): a space, a newline or a control
    # token in it could never be called (a dot may be: `time.v2`)
    server_label: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    server_url: str | None = None
    connector_id: str | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None
    allowed_tools: Annotated[
        Annotated[list[str], Tag("list")] | Annotated[McpToolFilter, Tag("dict")],
        Discriminator(_shape, custom_error_type="invalid_shape",
                      custom_error_message="expected a list of names or an object")] | None = None
    require_approval: ApprovalPolicy | None = None
    server_description: str | None = None


if TYPE_CHECKING:
    Tool: TypeAlias = FunctionTool | CodeInterpreterTool | WebSearchTool | McpTool
else:
    Tool = _tagged(("function", FunctionTool), ("code_interpreter", CodeInterpreterTool),
                   ("web_search", WebSearchTool), ("mcp", McpTool),
                   tag=_tag_of({kind: "web_search" for kind in _WEB_SEARCH_TYPES}))


# --- tool_choice -----------------------------------------------------------

class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class McpChoice(_Strict):
    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class HostedChoice(_Strict):
    """A hosted tool to call: the API's ToolChoiceTypes batchrun serves (any web search tool answers a
    web_search_preview choice). Not `web_search`: the API's types have no such choice, and a Response
    echoing it would fail them."""

    type: Literal["code_interpreter", "web_search_preview", "web_search_preview_2025_03_11"]


def _choice_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "mode"
    # web_search tagged hosted, so that its error lists the choices there are
    return _tag_of({kind: "hosted" for kind in ("code_interpreter", "web_search", "web_search_preview",
                                                  "web_search_preview_2025_03_11")})(value)


class HostedEntry(_Strict):
    """An allowed_tools entry naming a hosted tool: there the API takes tool definitions, any web search type
    among them."""

    type: Literal["code_interpreter"] | WebSearchType


if TYPE_CHECKING:
    AllowedEntry: TypeAlias = FunctionChoice | McpChoice | HostedEntry
else:
    AllowedEntry = _tagged(("function", FunctionChoice), ("mcp", McpChoice), ("hosted", HostedEntry),
                           tag=_tag_of({kind: "hosted" for kind in ("code_interpreter", *_WEB_SEARCH_TYPES)}))


class AllowedToolsChoice(_Strict):
    """Of the request's tools, only these may be called (all stay in the prompt); `required`: the first turn
    calls one of them."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedEntry]


ToolMode = Literal["auto", "none", "required"]
if TYPE_CHECKING:
    ToolChoice: TypeAlias = ToolMode | FunctionChoice | McpChoice | HostedChoice | AllowedToolsChoice
else:
    ToolChoice = _tagged(("mode", ToolMode), ("function", FunctionChoice), ("mcp", McpChoice),
                         ("hosted", HostedChoice), ("allowed_tools", AllowedToolsChoice), tag=_choice_tag)


# --- text.format -----------------------------------------------------------

class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
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
    TextFormat = _tagged(("text", TextFormatText), ("json_object", TextFormatJsonObject),
                         ("json_schema", TextFormatJsonSchema), tag=_tag_of())


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


# --- the request -----------------------------------------------------------

# The reasoning efforts a request (`reasoning.effort`) and a run (`--reasoning-effort`) may name:
# the one list of them (the CLI's choices and the harmony rendering derive from it).
ReasoningEffortName: TypeAlias = Literal["minimal", "low", "medium", "high"]
REASONING_EFFORTS: tuple[str, ...] = typing.get_args(ReasoningEffortName)


ReasoningSummary: TypeAlias = Literal["auto", "concise", "detailed"]


class Reasoning(_Strict):
    effort: ReasoningEffortName | None = None
    summary: ReasoningSummary | None = None  # echoed in the response; gpt-oss writes no summaries
    generate_summary: ReasoningSummary | None = None  # (the API's older name of summary)


Metadata = Annotated[
    dict[Annotated[str, StringConstraints(max_length=64)],
         Annotated[str, StringConstraints(max_length=512)]],
    Field(max_length=16)]


ConversationId = Annotated[str, StringConstraints(min_length=1)]


class ConversationRef(_Strict):
    id: ConversationId


if TYPE_CHECKING:
    Conversation: TypeAlias = str | ConversationRef
else:
    Conversation = _str_or(ConversationRef, 'expected a conversation id (a non-empty string) or {"id": ...}',
                           "dict", text=ConversationId)


class ResponsesRequest(_Strict):
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
