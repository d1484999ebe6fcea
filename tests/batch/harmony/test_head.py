"""The prompt-head cache (batch/harmony/head.py): keyed by a `HeadSpec` built without serialising the
tools' schemas, it must serve a head only to requests whose head is that head, token for token."""

from __future__ import annotations

import copy
import dataclasses
import random
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


# A head with instructions is its head without them plus the `# Instructions` section's tokens
# (head.with_instructions): checked against harmony's own rendering over texts that end (where
# the splice is) in every kind of character the pre-tokenizer tells apart.
_FRAGMENTS = [
    "Answer", "from", "the docs", "only", " ", "  ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r", "\r\n\r\n",
    " \n", "\n ", ".", "!", "?", "...", ":", ";", ",", "#", "##", "# Tools", "\n# Tools\n\n", "/", "//",
    "\n/", "{", "}", "`", "```", "-", "*", "\\", '"', "'", "'s", "'LL", "123", "4567", "é", "É", "e\u0301",
    "\u0301", "ß", "İ", "Σ", "ǅ", "ʰ", "中文", "日本語です", "١٢٣", "Ⅻ", "😀", "👩\u200d💻", "\u00a0", "\u2028",
    "\u2029", "\x85", "\u3000", "\x0b", "\x0c", "\u200b", "\ufeff", "<|start|>", "<|end|>", "<|message|>",
    "<|endoftext|>", "<|return|>", "<|constrain|>", "<|", "|>", "developer", "<|start|>developer<|message|>",
]
_TEXTS = ["x", "# Instructions", "\n" * 9, " " * 9, "\r" * 5, "a" * 400, "Be terse.\n\n# Tools\n\n## docs\n"] + [
    fragment for fragment in _FRAGMENTS if fragment.strip()] + [f"Be terse{end}" for end in _FRAGMENTS]


def _random_texts(count: int, seed: int = 0) -> list[str]:
    """Seeded texts of 1-12 fragments, each fragment also ending some of them."""
    rng = random.Random(seed)
    return ["".join(rng.choices(_FRAGMENTS, k=rng.randint(0, 11))) + _FRAGMENTS[index % len(_FRAGMENTS)]
            for index in range(count)]


_JSON_FORMAT = {"format": {"type": "json_schema", "name": "answer", "description": "The answer.",
                           "schema": {"type": "object", "properties": {"text": {"type": "string"}}}}}
_BROWSER_PYTHON = [{"type": "web_search_preview"}, {"type": "code_interpreter", "container": {"type": "auto"}}]
HEAD_BODIES = {
    "mcp tools": {"tools": [DOCS]},
    "mcp and function tools": {"tools": [DOCS, LOOKUP]},
    "function tools": {"tools": [LOOKUP]},
    "builtin tools": {"tools": _BROWSER_PYTHON},
    "builtin and function tools": {"tools": [*_BROWSER_PYTHON, LOOKUP]},
    "mcp tools, a response format": {"tools": [DOCS, LOOKUP], "text": _JSON_FORMAT},
    "a response format, no tools": {"text": _JSON_FORMAT},
    "no tools": {},
}


def _spec(body: dict) -> head.HeadSpec:
    request, _ = parse_request({"input": "Hi", **body})
    request = request.with_effort(OPTIONS.reasoning_effort)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    registry.add_listing("docs", LISTING)
    return render.head_spec(request, request.input_items(), registry, OPTIONS)


def test_the_hash_token_is_o200ks_hash():
    assert harmony_encoding().encode("#") == [head._HASH_TOKEN]


@pytest.mark.parametrize("name", HEAD_BODIES)
def test_a_head_with_instructions_equals_harmonys_rendering_token_for_token(name):
    spec = _spec(HEAD_BODIES[name])
    assert spec.instructions is None
    cache = HeadCache(4)
    spliced = 0
    for text in [*_TEXTS, *_random_texts(300, seed=len(name))]:
        with_text = dataclasses.replace(spec, instructions=text)
        assert cache.tokens(with_text) == RENDER_HEAD(with_text), repr(text)
        spliced += head.with_instructions(cache.tokens(spec), text) is not None
    # spliced into the developer message, or a developer message of its own where the head has none
    assert spliced == len(_TEXTS) + 300


def test_a_head_with_instructions_is_cached_from_the_head_without_them(monkeypatch):
    renders = []
    monkeypatch.setattr(head, "render_head", lambda spec: renders.append(spec) or RENDER_HEAD(spec))
    cache = HeadCache(8)
    spec = _spec(HEAD_BODIES["mcp and function tools"])
    first, second = (dataclasses.replace(spec, instructions=f"Answer question {index}.") for index in range(2))
    assert cache.tokens(first) == RENDER_HEAD(first) and cache.tokens(second) == RENDER_HEAD(second)
    assert renders == [spec]  # the tools rendered once, each text's section spliced in
    assert cache.tokens(spec) is cache.tokens(spec)


def test_instructions_that_are_not_unicode_fail_as_harmonys_rendering_does():
    spec = dataclasses.replace(_spec(HEAD_BODIES["mcp tools"]), instructions="half a pair: \ud800")
    with pytest.raises(ValueError):
        RENDER_HEAD(spec)
    with pytest.raises(ValueError):
        HeadCache(4).tokens(spec)


@pytest.mark.parametrize("name", ["no tools", "mcp tools"])
def test_a_megabyte_of_instructions_in_one_word_is_rendered(name):
    # harmony's rendering panics on it (its regex's stack) where the head has no developer message
    text = "a" * 1_200_000
    tokens = HeadCache(4).tokens(dataclasses.replace(_spec(HEAD_BODIES[name]), instructions=text))
    assert text in harmony_encoding().decode_utf8(tokens)
