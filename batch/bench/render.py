"""Render benchmark: the host cost of a request's prompt when it carries many MCP tools.

The host benchmark (batch/bench/host.py) has no MCP servers; this one times what admission
does for a request whose MCP server listed many tools: the request's registry over the run's
one listing (`add_listing`), then `render_prompt`. The listed tools are made the way a
FastMCP server makes them (pydantic's schemas: titles everywhere, optional fields as
`anyOf` with null, ~1 KB each); the requests differ in their input, and some carry a
function tool, instructions or another effort, so the prompt-head cache sees both repeats
and variety, as a run does; or (`distinct_heads`) each has instructions of its own, so
every head is rendered afresh.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from mcp.types import Tool
from pydantic import BaseModel, Field, create_model

from batch.harmony.render import PromptOptions, render_prompt
from batch.harmony.vocab import harmony_encoding
from batch.responses.request import ResponsesRequest, parse_request
from tools.registry import ToolRegistry

LABEL = "docs"
_FIELD_TYPES = (str, int, float, bool, list[str])
_WORDS = ("query page limit offset city country language sort order filter since until author "
          "topic section format level region currency amount account project label").split()


@dataclass
class RenderWorkload:
    """The requests (parsed, with their input items) and the listing their MCP server gave."""

    requests: list[tuple[ResponsesRequest, list[dict]]]
    listing: list[Tool]

    @property
    def schema_bytes(self) -> int:
        import json

        return sum(len(json.dumps(tool.input_schema)) for tool in self.listing)


def _arguments_model(rng: random.Random, index: int) -> type[BaseModel]:
    """A tool's arguments as a FastMCP tool function's signature becomes a pydantic model."""
    fields: dict = {}
    for position in range(rng.randint(6, 9)):
        name = f"{rng.choice(_WORDS)}_{position}"
        kind = rng.choice(_FIELD_TYPES)
        description = f"The {name.replace('_', ' ')} to use, as the caller names it."
        if position < 2:  # required
            fields[name] = (kind, Field(description=description))
        else:  # optional: anyOf [kind, null] with default null
            fields[name] = (kind | None, Field(default=None, description=description))
    return create_model(f"tool{index}Arguments", **fields)


def make_listing(num_tools: int, seed: int = 0) -> list[Tool]:
    """`num_tools` tools with pydantic-made input schemas (~1 KB each), as a server lists them."""
    rng = random.Random(seed)
    return [Tool(name=f"tool_{index}", description=f"Tool {index}: looks {rng.choice(_WORDS)} up in the docs.",
                 input_schema=_arguments_model(rng, index).model_json_schema())
            for index in range(num_tools)]


def _body(index: int, distinct_heads: bool) -> dict:
    body: dict = {"input": f"Question {index}: what does the page say about topic {index * 7}?",
                  "tools": [{"type": "mcp", "server_label": LABEL, "server_url": "http://docs.invalid",
                             "server_description": "The product documentation.", "require_approval": "never"}]}
    if index % 4 == 1:
        body["tools"].append({"type": "function", "name": "lookup", "description": "Look a value up.",
                              "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                             "required": ["query"]}})
    if distinct_heads:  # as an eval suite whose every line has its own instructions
        body["instructions"] = f"Answer question {index} from the documentation only."
    elif index % 5 == 2:
        body["instructions"] = "Answer from the documentation only."
    if index % 7 == 3:
        body["reasoning"] = {"effort": "high"}
    return body


def make_render_workload(num_requests: int, num_tools: int = 30, seed: int = 0,
                         distinct_heads: bool = False) -> RenderWorkload:
    """`num_requests` requests naming one MCP server that listed `num_tools` tools; with
    `distinct_heads` each has its own instructions, so no two share a prompt head."""
    requests = []
    for index in range(num_requests):
        request, _ = parse_request(_body(index, distinct_heads))
        requests.append((request.with_effort("medium"), request.input_items()))
    return RenderWorkload(requests, make_listing(num_tools, seed))


@dataclass
class RenderBenchResult:
    """Time spent rendering the workload's prompts."""

    num_requests: int
    num_tools: int
    prompt_tokens: int
    render_s: float
    registry_s: float

    @property
    def render_ms_per_request(self) -> float:
        return 1e3 * self.render_s / self.num_requests

    @property
    def registry_ms_per_request(self) -> float:
        return 1e3 * self.registry_s / self.num_requests

    def line(self) -> str:
        return (f"{self.render_ms_per_request:.3f} ms per request for render_prompt "
                f"(+{self.registry_ms_per_request:.3f} ms building its registry), {self.num_requests} requests x "
                f"{self.num_tools} MCP tools, {self.prompt_tokens / self.num_requests:,.0f} prompt tokens each")


def run_render_bench(workload: RenderWorkload, options: PromptOptions | None = None) -> RenderBenchResult:
    """Build each request's registry over the one listing, as admission does, and render its prompt.

    Harmony's vocabulary (a once-per-process load) is loaded before the clock starts; the first
    request's cold work (trimming the listing, rendering the head) counts, as it does in a run.
    """
    harmony_encoding()
    options = options or PromptOptions(conversation_date="2026-01-01")
    render_s = registry_s = 0.0
    prompt_tokens = 0
    for request, items in workload.requests:
        started = time.perf_counter()
        registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
        registry.add_listing(LABEL, workload.listing)
        listed = time.perf_counter()
        prompt_tokens += len(render_prompt(request, items, registry, options))
        render_s += time.perf_counter() - listed
        registry_s += listed - started
    return RenderBenchResult(len(workload.requests), len(workload.listing), prompt_tokens, render_s, registry_s)
