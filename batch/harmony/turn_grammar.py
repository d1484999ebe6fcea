"""The grammar one turn's completion must match: structured outputs and tool_choice, as harmony text.

A turn's completion continues the prompt's `<|start|>assistant`: messages that do
not end the turn (reasoning on `analysis`, preambles on `commentary`), each followed
by `<|start|>assistant`, then the message that ends it: the final answer
(`<|return|>`) or a tool call (`<|call|>`). The grammar (llguidance's Lark dialect,
where `<|name|>` is a harmony special token, never the same characters spelled
out) pins that structure down, so:

- `text.format` json_schema / json_object: the final message is JSON that matches;
- a call's arguments match what `ToolRegistry.arguments_schema` says (a strict
  function's parameters, a listed MCP tool's inputSchema, else a JSON object;
  python code is free text);
- `tool_choice` on the first turn: `required` or a named tool -> the turn ends
  with a call to one of `ToolRegistry.forced_recipients()`, after any reasoning;
  `none` -> no call (the registry then enables no tool), every turn; later turns of others are `auto`;
- a preamble (a `commentary` message) only before a call, never before the final answer;
- `tool_choice` allowed_tools: every turn calls only the tools it names (the prompt
  still shows them all, as in the API); in `required` mode the first turn must call one;
- no text, recipient or argument holds a harmony control token.

A call's header is accepted where harmony renders the recipient, after the role
(` to=functions.f<|channel|>commentary`), and where gpt-oss models often write
it, after the channel (`<|channel|>commentary to=functions.f`). A turn that
nothing constrains (free text, python only, tool_choice auto) gets no grammar:
decoding it costs nothing extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tools.registry import ANY_OBJECT, ToolRegistry

# Whitespace between JSON tokens: at most one space, so random weights cannot wander
# into endless whitespace, and both `{"a":1}` and `{"a": 1}` are accepted.
JSON_OPTIONS = {"whitespace_pattern": "[ ]?"}

_COMMON_RULES = (
    'analysis: <|channel|> "analysis" <|message|> TEXT <|end|>',
    'preamble: <|channel|> "commentary" <|message|> TEXT <|end|>',
    # Not a bare " json": harmony's parser reads `<|channel|>final json` as a message *to* `json`.
    'json_type: " " <|constrain|> "json"',
    "TEXT: /(?s:.*)/",
)


@dataclass(frozen=True)
class TurnGrammar:
    """A turn's Lark grammar and the JSON Schemas inside it, each with the request field it came from."""

    lark: str
    schemas: list[tuple[str, dict]] = field(default_factory=list)


def turn_grammar(registry: ToolRegistry, text_format: dict | None, first_turn: bool) -> TurnGrammar | None:
    """The grammar of this turn's completion, or None when nothing constrains it.

    Raises ToolChoiceError (tools.registry) when tool_choice names nothing callable.
    """
    channels = dict(registry.callable_recipients())
    allowed = registry.allowed_recipients()
    forced = registry.forced_recipients() if first_turn else None
    callable_now = forced if forced is not None else list(channels) if allowed is None else allowed
    final_schema = _final_schema(text_format)
    argument_schemas = {recipient: registry.arguments_schema(recipient) for recipient in callable_now}
    if forced is None and final_schema is None and len(callable_now) == len(channels) \
            and all(s is None for s in argument_schemas.values()) and registry.tool_choice != "none":
        return None
    rules = list(_COMMON_RULES)
    schemas: list[tuple[str, dict]] = []
    if forced is not None:  # reasoning first, if the model wants, then the call
        rules.insert(0, 'start: (analysis <|start|> "assistant")* call')
    else:
        # a preamble is the plan before a call: the final answer follows the reasoning alone (a commentary
        # message before it, a JSON answer above all, would be in the response's output_text, breaking it)
        answer = '(analysis <|start|> "assistant")* (final)'
        rules.insert(0, f'start: {answer} | ((analysis | preamble) <|start|> "assistant")* call' if callable_now
                     else f"start: {answer}")
        body = "TEXT" if final_schema is None else "final_json"
        rules.append(f'final: <|channel|> "final" json_type? <|message|> {body} <|return|>')
        if final_schema is not None:
            compiled = _compiled(final_schema, lenient=not (text_format and text_format.get("strict")))
            rules.append(f"final_json: %json {json.dumps(compiled)}")
            schemas.append(("text.format.schema", compiled))
    if callable_now:
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(callable_now))))
    for i, recipient in enumerate(callable_now):
        schema = argument_schemas[recipient]
        to, channel = json.dumps(f" to={recipient}"), json.dumps(channels[recipient])
        content_type, args = ('(" code")?', "TEXT") if schema is None else ("json_type?", f"args_{i}")
        rules.append(f"call_{i}: ({to} <|channel|> {channel} | <|channel|> {channel} {to}) {content_type} "
                     f"<|message|> {args} <|call|>")
        if schema is not None:
            compiled = _compiled(schema, lenient=not registry.is_strict(recipient))
            text = json.dumps(compiled)
            if registry.is_listed(recipient) and _cannot_be_enforced(text):
                # a server's schema, not the request's: its fault must not make the line invalid (the server
                # checks its own arguments); the call is then held to a JSON object only
                compiled = _compiled(ANY_OBJECT, lenient=False)
                text = json.dumps(compiled)
            rules.append(f"args_{i}: %json {text}")
            schemas.append((_schema_field(registry, recipient), compiled))
    return TurnGrammar("\n".join(rules) + "\n", schemas)


def _final_schema(text_format: dict | None) -> dict | None:
    kind = (text_format or {}).get("type", "text")
    if kind == "json_schema" and text_format is not None:
        return text_format["schema"]
    if kind == "json_object":
        return ANY_OBJECT
    return None


def _schema_field(registry: ToolRegistry, recipient: str) -> str:
    namespace, name = registry.split_recipient(recipient)
    if namespace == "functions":  # named as any request field (export's `param`)
        return f"{registry.function_fields.get(name, f'tools (function {name!r})')}.parameters"
    return f"tools (mcp {namespace!r}, tool {name!r}).inputSchema"


def _compiled(schema: dict, lenient: bool) -> dict:
    """The schema as llguidance reads it. `lenient` (a schema not given with `strict: true`, which the API
    takes as a guide): keywords and formats llguidance does not implement are left unenforced, not an error.
    llguidance reads its options from the schema's "x-guidance": a request's own is not batchrun's to honour
    (it could undo the whitespace bound), and a non-object one failed the line."""
    options = {**JSON_OPTIONS, "lenient": True} if lenient else JSON_OPTIONS
    return {**schema, "x-guidance": options}


def _cannot_be_enforced(schema: str) -> bool:
    """Whether llguidance cannot compile the schema (its JSON text, the check's cache key)."""
    from batch.harmony.schema_check import schema_problem  # llguidance: imported by the runs that need it

    return schema_problem(schema) is not None
