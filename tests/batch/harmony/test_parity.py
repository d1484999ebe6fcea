"""Parity: batchrun's prompt tokens against an independent rendering of the harmony guide.

`guide_prompt` below builds each body's prompt from openai-harmony's own objects
(SystemContent, DeveloperContent, Message, Conversation) the way openai/harmony's
docs/format.md describes, written here once and sharing no code with batch/harmony/render.py.
Where the guide has text but no library builder (the `# Response Formats` section, the
commentary routing line for MCP namespaces) it appends the guide's text itself. Where the
guide has no form at all it raises NotInGuide.

Every body must render to exactly the guide's tokens, except those in INTENDED: there batchrun
renders a stated variant of the body (its reason says why), and the test checks both that
batchrun equals the guide's rendering of that variant and that it is not the body's own.
"""

from __future__ import annotations

import json

import pytest
from mcp.types import Tool, ToolAnnotations
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from batch.harmony.render import PromptOptions, render_prompt
from batch.harmony.vocab import harmony_encoding
from batch.responses.request import parse_request
from tools.registry import ToolRegistry


class NotInGuide(Exception):
    """The guide has no form for this part of the body."""


# --- MCP servers: what each lists, and the schema the guide's tool syntax should show -----------
RAW_NOW = {"type": "object", "title": "nowArguments", "required": ["city"],
           "properties": {"city": {"type": "string", "title": "City", "description": "A city."},
                          "units": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
                                    "title": "Units"}}}
SHOWN_NOW = {"type": "object", "required": ["city"],
             "properties": {"city": {"type": "string", "description": "A city."}, "units": {"type": "string"}}}
RAW_ADD = {"type": "object", "title": "addArguments", "required": ["a", "b"],
           "properties": {"a": {"type": "integer", "title": "A"}, "b": {"type": "integer", "title": "B"}}}
SHOWN_ADD = {"type": "object", "required": ["a", "b"], "properties": {"a": {"type": "integer"},
                                                                       "b": {"type": "integer"}}}
# label -> [(name, description, listed schema, schema the prompt shows, read-only)]
SERVERS = {
    "weather": [("now", "Current weather.", RAW_NOW, SHOWN_NOW, True),
                ("alerts", "Weather alerts.", {"type": "object", "properties": {}}, {"type": "object",
                                                                                      "properties": {}}, False)],
    "calc": [("add", "Adds two integers.", RAW_ADD, SHOWN_ADD, True)],
}


def listed(label: str) -> list[Tool]:
    return [Tool(name=name, description=description, inputSchema=raw,
                 annotations=ToolAnnotations(readOnlyHint=read_only))
            for name, description, raw, _, read_only in SERVERS[label]]


# --- the independent rendering --------------------------------------------------------------
EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
BROWSER_LABELS = {"browser", "web_search", "web_search_preview"}
PYTHON_LABELS = {"code_interpreter", "python"}
ROUTING = "Calls to these tools must go to the commentary channel: "


def _text(content) -> str | list[str]:
    """A message's text; a list of parts stays a list (harmony renders each part as its own content)."""
    if isinstance(content, str):
        return content
    texts = [part["text"] for part in content]
    return texts[0] if len(texts) == 1 else texts


def _message(role: Role, text: str | list[str], author: str | None = None) -> Message:
    parts = [text] if isinstance(text, str) else text
    return Message(author=Author(role=role, name=author), content=[TextContent(text=t) for t in parts])


def _shown_tools(tool: dict) -> list[ToolDescription]:
    """A namespaced MCP server's tools as the prompt shows them: its listing, cut by allowed_tools."""
    allowed = tool.get("allowed_tools")
    kept = []
    for name, description, _, shown, read_only in SERVERS[tool["server_label"]]:
        if isinstance(allowed, list) and name not in allowed:
            continue
        if isinstance(allowed, dict) and ((allowed.get("tool_names") is not None and name not in allowed["tool_names"])
                                          or (allowed.get("read_only") and not read_only)):
            continue
        kept.append(ToolDescription.new(name, description, parameters=shown))
    return kept


def guide_prompt(body: dict) -> list[int]:
    """The prompt the harmony guide describes for `body` (see the module docstring)."""
    if body.get("tool_choice", "auto") != "auto":
        raise NotInGuide("tool_choice")  # the guide shows tools; it has no way to demand or forbid a call
    effort = (body.get("reasoning") or {}).get("effort") or "medium"
    if effort not in EFFORTS:
        raise NotInGuide(f"reasoning effort {effort}")  # the guide's levels: low, medium, high
    system = SystemContent.new().with_reasoning_effort(EFFORTS[effort]).with_knowledge_cutoff("2024-06")
    date = (body.get("metadata") or {}).get("conversation_date")
    if date:
        system = system.with_conversation_start_date(date)

    # Built-in tools in the system message (the guide's "Built-in tools"), browser first as in the guide.
    tools = body.get("tools") or []
    kinds = {tool["type"] if tool["type"] != "mcp" else tool["server_label"] for tool in tools}
    if kinds & ({"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
                | BROWSER_LABELS):
        system = system.with_browser_tool()
    if kinds & PYTHON_LABELS:
        system = system.with_python_tool()

    # The developer message: instructions ("the system prompt"), function tools, other namespaces.
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    instructions = [body["instructions"]] if body.get("instructions") else []
    for item in items:
        if item.get("type", "message") == "message" and item["role"] in ("system", "developer"):
            text = _text(item["content"])
            instructions.append(text if isinstance(text, str) else "".join(text))
    instructions = [text for text in instructions if text]
    developer = DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions("\n\n".join(instructions))
    functions = [ToolDescription.new(t["name"], t.get("description") or "", parameters=t.get("parameters"))
                 for t in tools if t["type"] == "function"]
    namespaces = [ToolNamespaceConfig(name=t["server_label"], description=t.get("server_description"),
                                      tools=_shown_tools(t))
                  for t in tools if t["type"] == "mcp" and t["server_label"] not in BROWSER_LABELS | PYTHON_LABELS]
    for namespace in namespaces:
        developer = developer.with_tools(namespace)
    if functions:
        developer = developer.with_function_tools(functions)
    has_developer = bool(instructions or functions or namespaces)

    head = [Message.from_role_and_content(Role.SYSTEM, system)]
    if has_developer:
        head.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    encoding = harmony_encoding()
    head_text = encoding.decode(encoding.render_conversation(Conversation.from_messages(head)))
    bodies = [part.split("<|message|>", 1)[1] for part in head_text.split("<|end|>") if part]
    system_text, developer_text = bodies[0], (bodies[1] if len(bodies) > 1 else None)
    routed = [n.name for n in namespaces if n.tools]
    if routed:  # function calls and MCP calls alike go to commentary: the routing line names them all
        system_text = system_text.split("\n" + ROUTING)[0] + "\n" + ROUTING + ", ".join(
            f"'{name}'" for name in (["functions"] if functions else []) + routed) + "."
    text_format = (body.get("text") or {}).get("format") or {"type": "text"}
    if text_format["type"] == "json_object":
        raise NotInGuide("json_object")  # the guide's response format is a named schema
    if text_format["type"] == "json_schema":  # the guide's "Structured output", at the end of the developer message
        section = f"# Response Formats\n\n## {text_format['name']}\n\n"
        if text_format.get("description"):
            section += f"// {text_format['description']}\n"
        # Unescaped, as harmony writes every other schema text (a tool's `enum`, `default`): `"Zoë"`, not `"Zo\u00eb"`.
        section += json.dumps(text_format["schema"], separators=(",", ":"), ensure_ascii=False)
        developer_text = f"{developer_text}\n\n{section}" if developer_text else section
    messages = [Message.from_role_and_content(Role.SYSTEM, system_text)]
    if developer_text is not None:
        messages.append(Message.from_role_and_content(Role.DEVELOPER, developer_text))

    # The conversation, in the guide's message forms.
    calls: dict[str, str] = {}
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            if item["role"] == "user":
                messages.append(_message(Role.USER, _text(item["content"])))
            elif item["role"] == "assistant":  # the guide's preamble is on commentary; an answer on final
                channel = "commentary" if item.get("phase") == "commentary" else "final"
                messages.append(_message(Role.ASSISTANT, _text(item["content"])).with_channel(channel))
        elif kind == "reasoning":  # raw CoT on analysis; a summary is not CoT
            text = "\n".join(part["text"] for part in item.get("content") or [])
            if text:
                messages.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis"))
        elif kind == "mcp_call" and item["server_label"] in PYTHON_LABELS | BROWSER_LABELS:
            # A built-in's label is served by the built-in's section: the call was the guide's built-in call,
            # on analysis, to `python` (code) or `browser.<action>` (as a function call's JSON otherwise).
            is_python = item["server_label"] in PYTHON_LABELS
            recipient = "python" if is_python else f"browser.{item['name']}"
            messages.append(Message.from_role_and_content(Role.ASSISTANT, item["arguments"]).with_channel("analysis")
                            .with_recipient(recipient).with_content_type("code" if is_python else "<|constrain|>json"))
            messages.append(_tool_message(recipient, item.get("output") or item.get("error") or "", "analysis"))
        elif kind in ("function_call", "mcp_call"):  # the guide's "Receiving tool calls"
            recipient = (f"functions.{item['name']}" if kind == "function_call"
                         else f"{item['server_label']}.{item['name']}")
            calls[item.get("call_id", recipient)] = recipient
            messages.append(Message.from_role_and_content(Role.ASSISTANT, item["arguments"])
                            .with_channel("commentary").with_recipient(recipient)
                            .with_content_type("<|constrain|>json"))
            if kind == "mcp_call":
                messages.append(_tool_message(recipient, item.get("output") or item.get("error") or "", "commentary"))
        elif kind == "function_call_output":  # the guide's "Handling tool calls"
            messages.append(_tool_message(calls[item["call_id"]], _text(item["output"]), "commentary"))
        elif kind == "code_interpreter_call":  # python: analysis channel, recipient python
            messages.append(Message.from_role_and_content(Role.ASSISTANT, item["code"]).with_channel("analysis")
                            .with_recipient("python").with_content_type("code"))
            messages.append(_tool_message("python", "".join(o.get("logs", "") for o in item["outputs"]), "analysis"))
        else:
            raise NotInGuide(kind)  # web_search_call, mcp_list_tools: no text to show the model
    return encoding.render_conversation_for_completion(Conversation.from_messages(messages), Role.ASSISTANT)


def _tool_message(author: str, text: str | list[str], channel: str) -> Message:
    """A tool's answer on its call's channel: gpt-oss's reference tools answer so (openai/gpt-oss
    gpt_oss/tools/tool.py), and vLLM's harmony loop passes the last message's channel to its tools."""
    return _message(Role.TOOL, text, author).with_channel(channel).with_recipient("assistant")


def batchrun_prompt(body: dict) -> list[int]:
    """The tokens `batchrun submit` renders for `body` (admission's path: parse, registry, listings)."""
    request, _ = parse_request(body)
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    for label in registry.mcp_servers:
        registry.add_listing(label, listed(label))
    return render_prompt(request, request.input_items(), registry, PromptOptions())


# --- the corpus ---------------------------------------------------------------------------
DATE = {"metadata": {"conversation_date": "2026-03-04"}}
_UNIT = {"type": ["string", "null"], "enum": ["c", "f", None]}  # strict: optional as nullable, and required
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City."},
                                                           "unit": _UNIT},
                          "required": ["city", "unit"], "additionalProperties": False}, "strict": True}
CLOCK = {"type": "function", "name": "clock"}  # no description, no parameters
LOOKUP = {"type": "function", "name": "lookup_order", "description": "Find an order.", "strict": False,
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}}}
MCP_WEATHER = {"type": "mcp", "server_label": "weather", "server_url": "http://127.0.0.1:9/mcp",
               "server_description": "Weather data.", "require_approval": "never"}
MCP_CALC = {"type": "mcp", "server_label": "calc", "server_url": "http://127.0.0.1:9/mcp",
            "headers": {"X-Key": "k"}, "authorization": "token"}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": '{"t": 4}'}
THINK = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Need weather."}]}

CORPUS: dict[str, dict] = {
    "string input": {"input": "Hi there"},
    "string input, date": {**DATE, "input": "What day is it?"},
    "effort low": {"input": "Hi", "reasoning": {"effort": "low"}},
    "effort medium": {"input": "Hi", "reasoning": {"effort": "medium", "summary": "auto"}},
    "effort high": {**DATE, "input": "Hi", "reasoning": {"effort": "high", "generate_summary": "concise"}},
    "effort minimal": {"input": "Hi", "reasoning": {"effort": "minimal"}},
    "instructions": {"input": "Hi", "instructions": "Answer in French."},
    "system message": {"input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    "developer message, parts": {"input": [{"type": "message", "role": "developer",
                                            "content": [{"type": "input_text", "text": "Use SI units."}]},
                                           {"role": "user", "content": "Hi"}]},
    "instructions + system + developer": {
        "instructions": "Be kind.", "input": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hi"},
                                              {"role": "developer", "content": "Reply in one line."}]},
    "system message + tools": {**DATE, "tools": [WEATHER], "input": [
        {"role": "system", "content": "Prefer Celsius."}, {"role": "user", "content": "Weather in Oslo?"}]},
    "user parts, one": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}]},
    "user parts, several": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello "},
                                                                    {"type": "input_text", "text": "world"}]}]},
    "text part": {"input": [{"role": "user", "content": [{"type": "text", "text": "Plain part"}]}]},
    "assistant history": {"input": [{"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
                                    {"role": "user", "content": "Bye"}]},
    "message with id and status": {"input": [{"type": "message", "role": "user", "content": "Hi", "id": "msg_1",
                                              "status": "completed"}]},
    "function tool": {**DATE, "input": "Weather in Oslo?", "tools": [WEATHER]},
    "function tools, no parameters, not strict": {"input": "Time?", "tools": [CLOCK, LOOKUP]},
    "function call and output": {"tools": [WEATHER], "input": [{"role": "user", "content": "Oslo?"}, THINK, CALL,
                                                                OUTPUT]},
    "function output as parts": {"tools": [WEATHER], "input": [
        {"role": "user", "content": "Oslo?"}, CALL,
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "4 C"}]}]},
    "analysis dropped after final": {"tools": [WEATHER], "input": [
        {"role": "user", "content": "Oslo?"}, THINK, CALL, OUTPUT, {"role": "assistant", "content": "4 C."},
        {"role": "user", "content": "And Rome?"}]},
    "answered analysis stays dropped in a later call": {"tools": [WEATHER], "input": [
        {"role": "user", "content": "Hi"}, THINK, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Oslo?"}, THINK, CALL, OUTPUT]},
    "reasoning, several parts": {"input": [{"role": "user", "content": "Hi"}, {
        "type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Greeting."}],
        "content": [{"type": "reasoning_text", "text": "A greeting."}, {"type": "reasoning_text", "text": "Reply."}]}]},
    "reasoning, summary only": {"input": [{"role": "user", "content": "Hi"}, {
        "type": "reasoning", "summary": [{"type": "summary_text", "text": "Greeting."}]}]},
    "reasoning, encrypted": {"input": [{"role": "user", "content": "Hi"}, {
        "type": "reasoning", "summary": [], "encrypted_content": "gAAAA...", "status": "completed"}]},
    "code_interpreter": {**DATE, "input": "12**5?", "tools": [{"type": "code_interpreter", "container": "auto"}]},
    "code_interpreter, container object": {"input": "Hi", "tools": [
        {"type": "code_interpreter", "container": {"type": "auto"}}]},
    "code_interpreter_call replayed": {"tools": [{"type": "code_interpreter"}], "input": [
        {"role": "user", "content": "12**5?"},
        {"type": "code_interpreter_call", "id": "ci_1", "code": "print(12**5)", "container_id": "c",
         "outputs": [{"type": "logs", "logs": "248832\n"}], "status": "completed"}]},
    "web_search": {"input": "News?", "tools": [{"type": "web_search"}]},
    "web_search_preview, options": {"input": "News?", "tools": [{
        "type": "web_search_preview", "search_context_size": "low",
        "user_location": {"type": "approximate", "city": "Oslo"}}]},
    "web_search dated types": {"input": "News?", "tools": [{"type": "web_search_2025_08_26",
                                                            "filters": {"allowed_domains": ["a.org"]}}]},
    "web_search_preview dated": {"input": "News?", "tools": [{"type": "web_search_preview_2025_03_11"}]},
    "browser and python": {**DATE, "input": "Hi", "reasoning": {"effort": "high"},
                           "tools": [{"type": "code_interpreter"}, {"type": "web_search_preview"}]},
    "every tool kind": {**DATE, "instructions": "Use tools.", "input": "Hi",
                        "tools": [WEATHER, {"type": "code_interpreter"}, {"type": "web_search"}, MCP_WEATHER]},
    "mcp python label": {"input": "2+2?", "tools": [{"type": "mcp", "server_label": "python",
                                                     "server_url": "http://127.0.0.1:9/mcp"}]},
    "mcp code_interpreter label": {"input": "2+2?", "tools": [
        {"type": "mcp", "server_label": "code_interpreter", "server_url": "http://127.0.0.1:9/mcp"}]},
    "mcp browser label": {"input": "News?", "tools": [{"type": "mcp", "server_label": "browser",
                                                       "server_url": "http://127.0.0.1:9/mcp"}]},
    "mcp namespace": {**DATE, "input": "Weather in Oslo?", "tools": [MCP_WEATHER]},
    "mcp namespaces, two": {"input": "Hi", "tools": [MCP_WEATHER, MCP_CALC]},
    "mcp + function": {"input": "Hi", "tools": [WEATHER, MCP_CALC]},
    "mcp allowed_tools list": {"input": "Hi", "tools": [{**MCP_WEATHER, "allowed_tools": ["now"]}]},
    "mcp allowed_tools read_only": {"input": "Hi", "tools": [{**MCP_WEATHER, "allowed_tools": {"read_only": True}}]},
    "mcp allowed_tools names": {"input": "Hi", "tools": [{**MCP_WEATHER, "allowed_tools": {"tool_names": ["alerts"]},
                                                         "require_approval": {"never": {"tool_names": ["alerts"]}},
                                                         "connector_id": None}]},
    "preamble replayed": {"tools": [MCP_CALC], "input": [
        {"role": "user", "content": "1+2?"},
        {"type": "message", "role": "assistant", "phase": "commentary", "content": "Let me add them."},
        {"type": "mcp_call", "id": "mcp_0", "server_label": "calc", "name": "add", "arguments": '{"a":1,"b":2}',
         "output": "3"}, {"role": "assistant", "phase": "final_answer", "content": "3"},
        {"role": "user", "content": "And 2+2?"}]},
    "mcp_call replayed": {"tools": [MCP_CALC], "input": [
        {"role": "user", "content": "1+2?"},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "calc", "name": "add", "arguments": '{"a":1,"b":2}',
         "output": "3"}]},
    "mcp_call error replayed": {"tools": [MCP_CALC], "input": [
        {"role": "user", "content": "1+2?"},
        {"type": "mcp_call", "server_label": "calc", "name": "add", "arguments": "{}", "error": "bad arguments"}]},
    "mcp_call replayed, python label": {"tools": [{"type": "mcp", "server_label": "python",
                                                   "server_url": "http://127.0.0.1:9/mcp"}], "input": [
        {"role": "user", "content": "12**5?"},
        {"type": "mcp_call", "id": "mcp_2", "server_label": "python", "name": "python", "arguments": "print(12**5)",
         "output": "248832\n"}]},
    "mcp_call replayed, web_search label": {"input": [  # the tool is gone from this request: the call stays
        {"role": "user", "content": "News?"},
        {"type": "mcp_call", "id": "mcp_3", "server_label": "web_search", "name": "search",
         "arguments": '{"query": "news"}', "output": "[0] Nothing new"}]},
    "mcp_list_tools replayed": {"tools": [MCP_CALC], "input": [
        {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "calc", "tools": []},
        {"role": "user", "content": "1+2?"}]},
    "web_search_call replayed": {"tools": [{"type": "web_search"}], "input": [
        {"role": "user", "content": "News?"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}}]},
    "tool_choice auto": {"input": "Oslo?", "tools": [WEATHER], "tool_choice": "auto"},
    "tool_choice none": {"input": "Oslo?", "tools": [WEATHER], "tool_choice": "none"},
    "tool_choice required": {"input": "Oslo?", "tools": [WEATHER], "tool_choice": "required"},
    "tool_choice function": {"input": "Oslo?", "tools": [WEATHER, CLOCK],
                             "tool_choice": {"type": "function", "name": "get_weather"}},
    "tool_choice mcp": {"input": "Oslo?", "tools": [MCP_WEATHER],
                        "tool_choice": {"type": "mcp", "server_label": "weather", "name": "now"}},
    "tool_choice hosted": {"input": "2+2?", "tools": [{"type": "code_interpreter"}],
                           "tool_choice": {"type": "code_interpreter"}},
    "tool_choice allowed_tools": {"input": "Oslo?", "tools": [WEATHER, CLOCK], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}},
    "text.format text": {"input": "Hi", "text": {"format": {"type": "text"}, "verbosity": "low"}},
    "text.format json_schema": {**DATE, "input": "Ada, 36", "text": {"format": {
        "type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}},
    "text.format json_schema, description, tools": {
        "instructions": "Extract.", "input": "Ada, 36", "tools": [WEATHER], "text": {"format": {
            "type": "json_schema", "name": "person", "description": "A person's name and age.", "schema": SCHEMA}}},
    "text.format json_schema, mcp and functions": {  # both additions: routing line and Response Formats
        **DATE, "input": "Ada, 36", "tools": [MCP_WEATHER, WEATHER], "text": {"format": {
            "type": "json_schema", "name": "person", "schema": SCHEMA}}},
    "text.format json_schema, non-ASCII text": {"input": "Zoë, 36", "text": {"format": {
        "type": "json_schema", "name": "personne", "description": "Prénom et âge.",
        "schema": {"type": "object", "properties": {"prénom": {"type": "string", "enum": ["Zoë", "Chloé"]}}}}}},
    "text.format json_object": {"input": "Give JSON", "text": {"format": {"type": "json_object"}}},
    "sampling and run fields": {"input": "Hi", "temperature": 0.2, "top_p": 0.9, "max_output_tokens": 64,
                                "max_tool_calls": 2, "parallel_tool_calls": False, "model": "gpt-oss-20b",
                                "user": "u-1", "metadata": {"conversation_date": "2026-01-01", "team": "a"},
                                "previous_response_id": None, "conversation": {"id": "conv_1"},
                                "include": ["message.output_text.logprobs"], "top_logprobs": 5},
    "ignored fields": {"input": "Hi", "stream": False, "store": True, "include": ["reasoning.encrypted_content"],
                       "truncation": "disabled", "service_tier": "auto", "background": False,
                       "prompt_cache_key": "k-1", "safety_identifier": "user-1"},
    "special-token spellings and unicode": {"input": "What is <|start|>? Déjà vu 😀\n\n  spaced  "},
}


def _drop(items: list[dict], kind: str) -> list[dict]:
    return [item for item in items if item.get("type") != kind]


# body name -> (why batchrun renders a variant of the body, the variant)
INTENDED: dict[str, tuple[str, dict]] = {
    "effort minimal": ("the guide's levels are low/medium/high; `minimal` is rendered as low rather than refused",
                       {**CORPUS["effort minimal"], "reasoning": {"effort": "low"}}),
    "user parts, several": ("a message's parts are one text (harmony would tokenize each part apart, splitting "
                            "tokens at part boundaries the user never meant)",
                            {"input": [{"role": "user", "content": "Hello world"}]}),
    "tool_choice none": ("`none`: the model is shown no tools, so it cannot call one",
                         {"input": "Oslo?"}),
    "tool_choice required": ("the guide cannot demand a call: the prompt is auto's, the grammar forces the call",
                             {**CORPUS["tool_choice required"], "tool_choice": "auto"}),
    "tool_choice function": ("as required: auto's prompt, the grammar forces the named function",
                             {**CORPUS["tool_choice function"], "tool_choice": "auto"}),
    "tool_choice mcp": ("as required: auto's prompt, the grammar forces the named MCP tool",
                        {**CORPUS["tool_choice mcp"], "tool_choice": "auto"}),
    "tool_choice hosted": ("as required: auto's prompt, the grammar forces the python call",
                           {**CORPUS["tool_choice hosted"], "tool_choice": "auto"}),
    "tool_choice allowed_tools": ("auto's prompt, every tool shown (as the API keeps them in the prompt); the "
                                  "grammar limits the calls", {**CORPUS["tool_choice allowed_tools"],
                                                               "tool_choice": "auto"}),
    "text.format json_object": ("the guide's format is a named schema; json_object has none, so only the grammar "
                                "holds the answer to JSON", {"input": "Give JSON"}),
    "mcp_list_tools replayed": ("a listing is not a message: the listed tools are in the developer message",
                                {**CORPUS["mcp_list_tools replayed"],
                                 "input": _drop(CORPUS["mcp_list_tools replayed"]["input"], "mcp_list_tools")}),
    "answered analysis stays dropped in a later call": (
        "harmony keeps the reasoning before an earlier final answer when the conversation ends in a call, yet "
        "every turn after that answer was rendered (and read) without it: it stays dropped, as the guide drops "
        "previous reasoning once a response ended in a final message",
        {**CORPUS["answered analysis stays dropped in a later call"],
         "input": CORPUS["answered analysis stays dropped in a later call"]["input"][:1]
         + CORPUS["answered analysis stays dropped in a later call"]["input"][2:]}),
    "mcp_call error replayed": ("a failed call's answer is its error as the loop showed it to the model "
                                "(`Error: ` and the error's text), so a replay renders what the model read",
                                {**CORPUS["mcp_call error replayed"], "input": [
                                    CORPUS["mcp_call error replayed"]["input"][0],
                                    {"type": "mcp_call", "server_label": "calc", "name": "add", "arguments": "{}",
                                     "output": "Error: bad arguments"}]}),
    "web_search_call replayed": ("the item carries no page text to show the model",
                                 {**CORPUS["web_search_call replayed"],
                                  "input": _drop(CORPUS["web_search_call replayed"]["input"], "web_search_call")}),
}


def test_the_corpus_covers_every_body_field_batchrun_accepts():
    from batch.responses.request import IGNORED_FIELDS, ResponsesRequest

    assert len(CORPUS) >= 40
    fields = {field for body in CORPUS.values() for field in body}
    assert set(ResponsesRequest.model_fields) <= fields
    assert fields & IGNORED_FIELDS
    item_kinds = {item.get("type", "message") for body in CORPUS.values() if isinstance(body["input"], list)
                  for item in body["input"]}
    assert item_kinds == {"message", "function_call", "function_call_output", "reasoning", "mcp_call",
                          "mcp_list_tools", "code_interpreter_call", "web_search_call"}
    roles = {item["role"] for body in CORPUS.values() if isinstance(body["input"], list) for item in body["input"]
             if item.get("type", "message") == "message"}
    assert roles == {"user", "system", "developer", "assistant"}
    tool_kinds = {tool["type"] for body in CORPUS.values() for tool in body.get("tools", [])}
    assert tool_kinds == {"function", "code_interpreter", "mcp", "web_search", "web_search_preview",
                          "web_search_2025_08_26", "web_search_preview_2025_03_11"}
    assert set(INTENDED) <= set(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_batchrun_renders_the_guides_prompt(name):
    body = CORPUS[name]
    tokens = batchrun_prompt(body)
    if name not in INTENDED:
        assert tokens == guide_prompt(body), harmony_encoding().decode(tokens)
        return
    _, variant = INTENDED[name]
    assert tokens == guide_prompt(variant)
    try:
        own = guide_prompt(body)
    except NotInGuide:
        return
    assert tokens != own  # still a difference: else the entry must go


def test_batchrun_submit_stores_the_guides_prompt(tmp_path, tiny_model_dir):
    """End to end: the prompt `batchrun submit --keep-tokens` decoded from is the guide's, for every
    body that needs no MCP server (the renderer test above covers those with their listings)."""
    import subprocess
    import sys

    from batch.store.store import Store

    names = [name for name, body in CORPUS.items() if not any(t["type"] == "mcp" for t in body.get("tools", []))]
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"custom_id": f"b{i}", **CORPUS[name]}) + "\n"
                             for i, name in enumerate(names)))
    subprocess.run([sys.executable, "-m", "batch.cli", "submit", str(lines), "--db", str(tmp_path / "t.duckdb"),
                    "--model", str(tiny_model_dir), "--run-id", "r", "--keep-tokens", "--max-output-tokens", "1",
                    "--quiet"], check=True)
    with Store(tmp_path / "t.duckdb", read_only=True) as store:
        rows = store.db.rows("""SELECT q.custom_id, t.prompt_token_ids FROM tokens t JOIN requests q
                              ON q.run_id = t.run_id AND q.response_id = t.response_id WHERE t.turn = 0""")
    prompts = {row["custom_id"]: list(row["prompt_token_ids"]) for row in rows}
    assert len(prompts) == len(names) >= 40
    for i, name in enumerate(names):
        body = INTENDED[name][1] if name in INTENDED else CORPUS[name]
        assert prompts[f"b{i}"] == guide_prompt(body), name
