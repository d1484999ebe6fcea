"""A Responses request's `tools` and `tool_choice`, as pydantic models (read through batch/responses/request.py).

As there, the unions are built at runtime (`tagged`, `str_or`) for pydantic, which a type checker cannot read as
types: under TYPE_CHECKING each is spelt as the plain union it validates to. Keep the two spellings in step.
"""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import Discriminator, StringConstraints, Tag

from batch.responses.request_shapes import Strict, shape_of, str_or, tag_of, tagged

WebSearchType = Literal["web_search", "web_search_preview", "web_search_2025_08_26",
                        "web_search_preview_2025_03_11"]
WEB_SEARCH_TYPES: tuple[str, ...] = typing.get_args(WebSearchType)

if TYPE_CHECKING:
    StrOrObject: TypeAlias = str | dict[str, Any]
else:
    StrOrObject = str_or(dict[str, Any], "expected a string or an object", "dict")


# --- tools -----------------------------------------------------------------

class FunctionTool(Strict):
    type: Literal["function"]
    # The name becomes the harmony recipient `functions.<name>`: no dots or spaces.
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CodeInterpreterTool(Strict):
    type: Literal["code_interpreter"]
    container: StrOrObject | None = None


class WebSearchTool(Strict):
    type: WebSearchType
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: dict[str, Any] | None = None
    filters: dict[str, Any] | None = None


class McpToolFilter(Strict):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpApprovalFilter(Strict):
    """require_approval as a filter: the tools that need approval, and those that do not."""

    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


if TYPE_CHECKING:
    ApprovalPolicy: TypeAlias = Literal["always", "never"] | McpApprovalFilter
else:
    ApprovalPolicy = str_or(McpApprovalFilter, "expected 'always', 'never' or an object", "dict",
                             text=Literal["always", "never"])


class McpTool(Strict):
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
        Discriminator(shape_of, custom_error_type="invalid_shape",
                      custom_error_message="expected a list of names or an object")] | None = None
    require_approval: ApprovalPolicy | None = None
    server_description: str | None = None


if TYPE_CHECKING:
    Tool: TypeAlias = FunctionTool | CodeInterpreterTool | WebSearchTool | McpTool
else:
    Tool = tagged(("function", FunctionTool), ("code_interpreter", CodeInterpreterTool),
                   ("web_search", WebSearchTool), ("mcp", McpTool),
                   tag=tag_of({kind: "web_search" for kind in WEB_SEARCH_TYPES}))


# --- tool_choice -----------------------------------------------------------

class FunctionChoice(Strict):
    type: Literal["function"]
    name: str


class McpChoice(Strict):
    type: Literal["mcp"]
    server_label: str
    name: str | None = None


class HostedChoice(Strict):
    """A hosted tool to call: the API's ToolChoiceTypes batchrun serves (any web search tool answers a
    web_search_preview choice). Not `web_search`: the API's types have no such choice, and a Response
    echoing it would fail them."""

    type: Literal["code_interpreter", "web_search_preview", "web_search_preview_2025_03_11"]


def _choice_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "mode"
    # web_search tagged hosted, so that its error lists the choices there are
    return tag_of({kind: "hosted" for kind in ("code_interpreter", "web_search", "web_search_preview",
                                                  "web_search_preview_2025_03_11")})(value)


class HostedEntry(Strict):
    """An allowed_tools entry naming a hosted tool: there the API takes tool definitions, any web search type
    among them."""

    type: Literal["code_interpreter"] | WebSearchType


if TYPE_CHECKING:
    AllowedEntry: TypeAlias = FunctionChoice | McpChoice | HostedEntry
else:
    AllowedEntry = tagged(("function", FunctionChoice), ("mcp", McpChoice), ("hosted", HostedEntry),
                           tag=tag_of({kind: "hosted" for kind in ("code_interpreter", *WEB_SEARCH_TYPES)}))


class AllowedToolsChoice(Strict):
    """Of the request's tools, only these may be called (all stay in the prompt); `required`: the first turn
    calls one of them."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedEntry]


ToolMode = Literal["auto", "none", "required"]
if TYPE_CHECKING:
    ToolChoice: TypeAlias = ToolMode | FunctionChoice | McpChoice | HostedChoice | AllowedToolsChoice
else:
    ToolChoice = tagged(("mode", ToolMode), ("function", FunctionChoice), ("mcp", McpChoice),
                         ("hosted", HostedChoice), ("allowed_tools", AllowedToolsChoice), tag=_choice_tag)
