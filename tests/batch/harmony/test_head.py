"""The prompt-head cache (batch/harmony/head.py): keyed by a `HeadSpec` built without serialising the
tools' schemas, it must serve a head only to requests whose head is that head, token for token."""

from __future__ import annotations

import copy
import gc

import pytest
from mcp.types import Tool

from batch.harmony import head, render, tool_sections
from batch.harmony.head import HeadCache
from batch.harmony.render import PromptOptions, render_prompt
from batch.harmony.tool_sections import Held, JsonValue, _TrimmedSchemas
from batch.harmony.vocab import harmony_encoding
from batch.responses.request import parse_request
from tools.registry import ToolRegistry

OPTIONS = PromptOptions(conversation_date="2026-01-01")
RENDER_HEAD = head.render_head  # the uncached rendering, before a test counts its calls
# As a FastMCP server lists a tool: pydantic's schema, a title everywhere, optional fields as anyOf null.
SEARCH = {"type": "object", "title": "searchArguments", "required": ["query"], "properties": {
    "query": {"type": "string", "title": "Query", "description": "What to look for."},
    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Limit"}}}
FETCH = {"type": "object", "title": "fetchArguments", "required": ["url"],
         "properties": {"url": {"type": "string", "title": "Url"}}}
LOOKUP = {"type": "function", "name": "lookup", "description": "Look a value up.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}
DOCS = {"type": "mcp", "server_label": "docs", "server_url": "http://docs.invalid",
        "server_description": "The product documentation."}
BASE = {"input": "Hi", "tools": [DOCS, LOOKUP]}


def _listing(search: dict = SEARCH, description: str = "Search the docs.") -> list[Tool]:
    return [Tool(name="search", description=description, input_schema=copy.deepcopy(search)),
            Tool(name="fetch", description="Fetch a page.", input_schema=copy.deepcopy(FETCH))]


LISTING = _listing()


def _prompt(body: dict, listing: list[Tool] | None = None, options: PromptOptions = OPTIONS) -> list[int]:
    """The prompt admission renders: the run's effort on the request, its servers' listing added."""
    request, _ = parse_request(body)
    request = request.with_effort(options.reasoning_effort)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    registry.add_listing("docs", LISTING if listing is None else listing)
    return render_prompt(request, request.input_items(), registry, options)


def _fresh(monkeypatch, *args, **kwargs) -> list[int]:
    """The same prompt with an empty head cache: rendered afresh."""
    with monkeypatch.context() as patch:
        patch.setattr(render, "HEADS", HeadCache(4))
        return _prompt(*args, **kwargs)


def _with(**changes) -> dict:
    return {**copy.deepcopy(BASE), **changes}


def _changed_lookup(**changes) -> dict:
    return _with(tools=[DOCS, {**copy.deepcopy(LOOKUP), **changes}])


VARIANTS = {
    "function parameters": (_changed_lookup(parameters={"type": "object", "properties": {"id": {"type": "integer"}}}),
                            None, OPTIONS),
    "function description": (_changed_lookup(description="Look a word up."), None, OPTIONS),
    "function name": (_changed_lookup(name="find"), None, OPTIONS),
    "a second function": (_with(tools=[DOCS, LOOKUP, {**LOOKUP, "name": "find"}]), None, OPTIONS),
    "the functions' order": (_with(tools=[DOCS, {**LOOKUP, "name": "find"}, LOOKUP]), None, OPTIONS),
    "mcp listing: a changed schema": (
        BASE, _listing({**SEARCH, "properties": {**SEARCH["properties"], "lang": {"type": "string"}}}), OPTIONS),
    "mcp listing: a changed description, the same schema object": (
        BASE, [LISTING[0].model_copy(update={"description": "Search."}), LISTING[1]], OPTIONS),
    "mcp listing: one tool fewer": (BASE, LISTING[:1], OPTIONS),
    "mcp allowed_tools": (_with(tools=[{**DOCS, "allowed_tools": ["fetch"]}, LOOKUP]), None, OPTIONS),
    "server description": (_with(tools=[{**DOCS, "server_description": "Other docs."}, LOOKUP]), None, OPTIONS),
    "request effort": (_with(reasoning={"effort": "high"}), None, OPTIONS),
    "run effort": (BASE, None, PromptOptions(conversation_date="2026-01-01", reasoning_effort="low")),
    "request date": (_with(metadata={"conversation_date": "2026-02-02"}), None, OPTIONS),
    "run date": (BASE, None, PromptOptions(conversation_date="2026-03-03")),
    "no date": (BASE, None, PromptOptions()),
    "knowledge cutoff": (BASE, None, PromptOptions(conversation_date="2026-01-01", knowledge_cutoff="2025-01")),
    "instructions": (_with(instructions="Be terse."), None, OPTIONS),
    "a developer input message": (_with(input=[{"role": "developer", "content": "Be terse."},
                                               {"role": "user", "content": "Hi"}]), None, OPTIONS),
    "tool_choice none": (_with(tool_choice="none"), None, OPTIONS),
    "text format": (_with(text={"format": {"type": "json_schema", "name": "answer",
                                           "schema": {"type": "object", "properties": {}}}}), None, OPTIONS),
    "python": (_with(tools=[DOCS, LOOKUP, {"type": "code_interpreter", "container": {"type": "auto"}}]), None, OPTIONS),
    "no mcp server": (_with(tools=[LOOKUP]), None, OPTIONS),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_a_changed_head_is_never_served_from_the_cache(monkeypatch, name):
    base = _prompt(BASE)  # cached now
    body, listing, options = VARIANTS[name]
    cached = _prompt(body, listing, options)
    assert cached == _fresh(monkeypatch, body, listing, options)
    assert cached != base
    assert _prompt(BASE) == base  # and the base head is still its own


def test_a_cached_prompt_equals_a_fresh_one_token_for_token(monkeypatch):
    renders = []
    monkeypatch.setattr(head, "render_head", lambda spec: renders.append(spec) or RENDER_HEAD(spec))
    monkeypatch.setattr(render, "HEADS", HeadCache(4))
    bodies = [_with(input=f"Question {index}?") for index in range(3)]
    prompts = [_prompt(body, _listing()) for body in bodies]  # each request: its own listing objects ...
    assert len(renders) == 3  # ... so each is a new key (a new run's listing is rendered afresh)
    listing = _listing()
    prompts = [_prompt(body, listing) for body in bodies]  # one run: one listing, new registries
    assert len(renders) == 4  # rendered once, then served
    with monkeypatch.context() as patch:
        patch.setattr(render, "HEADS", HeadCache(4))
        assert prompts == [_prompt(body, listing) for body in bodies]
    text = harmony_encoding().decode(prompts[2])
    assert "namespace docs {" in text and "type lookup = " in text and text.endswith(
        "<|start|>user<|message|>Question 2?<|end|><|start|>assistant")



def test_a_listing_whose_object_id_is_reused_is_not_mistaken_for_an_earlier_one(monkeypatch):
    # The key holds each listed schema: a freed schema's id cannot come back while its head is cached
    # (with ids alone, CPython hands a new listing's dict a freed one's address within a few rounds).
    monkeypatch.setattr(render, "HEADS", HeadCache(256))
    monkeypatch.setattr(tool_sections, "_TRIMMED", _TrimmedSchemas(1))  # holds none of search's schemas
    for index in range(40):
        changed = {**SEARCH, "properties": {**SEARCH["properties"], f"field_{index}": {"type": "string"}}}
        prompt = _prompt(BASE, _listing(changed)[:1])
        assert f"field_{index}" in harmony_encoding().decode(prompt)
        gc.collect(0)  # a young listing's cycles only: a full collection is 0.15 s in a loaded test process


def test_key_parts_compare_as_the_rendering_needs():
    schema = {"type": "object"}
    assert Held(schema) == Held(schema) and hash(Held(schema)) == hash(Held(schema))
    assert Held(schema) != Held({"type": "object"})  # an equal dict of another listing: rendered afresh
    assert JsonValue({"a": [1]}) == JsonValue({"a": [1]}) and hash(JsonValue({"a": [1]})) == hash(JsonValue({"a": [1]}))
    assert JsonValue({"a": 1}) != JsonValue({"a": 1.0})
    assert JsonValue({"a": 1, "b": 2}) != JsonValue({"b": 2, "a": 1})  # harmony shows properties in order
