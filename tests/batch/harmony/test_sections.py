"""The prompt cases of issue 27 against the harmony guide's own text (openai/harmony docs/format.md).

Each expected prompt is the guide's text for that case, written out here and tokenized with the
special tokens allowed; batchrun's tokens must equal it exactly.
"""

from mcp.types import Tool
from openai_harmony import Message, Role

from batch.harmony.render import PromptOptions, render_prompt
from batch.harmony.sections import harmony_schema
from batch.harmony.vocab import harmony_encoding
from batch.responses.request import parse_request
from tools.registry import ToolRegistry

GUIDE_SYSTEM = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n"
                "# Valid channels: analysis, commentary, final. Channel must be included for every message.")
FORMAT_PARAMETER = {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}
GUIDE_FUNCTIONS = [  # the guide's function-calling example, as a request's function tools
    {"type": "function", "name": "get_location", "description": "Gets the location of the user."},
    {"type": "function", "name": "get_current_weather",
     "description": "Gets the current weather in the provided location.",
     "parameters": {"type": "object", "properties": {
         "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
         "format": FORMAT_PARAMETER}, "required": ["location"]}},
    {"type": "function", "name": "get_multiple_weathers",
     "description": "Gets the current weather in the provided list of locations.",
     "parameters": {"type": "object", "properties": {
         "locations": {"type": "array", "items": {"type": "string"},
                       "description": 'List of city and state, e.g. ["San Francisco, CA", "New York, NY"]'},
         "format": FORMAT_PARAMETER}, "required": ["locations"]}},
]
GUIDE_FUNCTIONS_SECTION = """# Tools

## functions

namespace functions {

// Gets the location of the user.
type get_location = () => any;

// Gets the current weather in the provided location.
type get_current_weather = (_: {
// The city and state, e.g. San Francisco, CA
location: string,
format?: "celsius" | "fahrenheit", // default: celsius
}) => any;

// Gets the current weather in the provided list of locations.
type get_multiple_weathers = (_: {
// List of city and state, e.g. ["San Francisco, CA", "New York, NY"]
locations: string[],
format?: "celsius" | "fahrenheit", // default: celsius
}) => any;

} // namespace functions"""
GUIDE_DATE = {"metadata": {"conversation_date": "2025-06-28"}, "reasoning": {"effort": "high"}}


def tokens_of(text: str) -> list[int]:
    return harmony_encoding().encode(text, allowed_special="all")


def prompt(body: dict, registry: ToolRegistry | None = None) -> list[int]:
    request, _ = parse_request(body)
    registry = registry or ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    return render_prompt(request, request.input_items(), registry, PromptOptions())


def test_the_guides_function_calling_example_with_its_system_prompt_as_a_developer_input_message():
    # Item 1: the guide's "complete input example": its "Use a friendly tone." is the developer
    # message's # Instructions, above # Tools, in one developer message.
    body = {**GUIDE_DATE, "tools": GUIDE_FUNCTIONS,
            "input": [{"role": "developer", "content": "Use a friendly tone."},
                      {"role": "user", "content": "What is the weather like in SF?"}]}
    expected = (GUIDE_SYSTEM + "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
                "<|start|>developer<|message|># Instructions\n\nUse a friendly tone.\n\n" + GUIDE_FUNCTIONS_SECTION
                + "<|end|><|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant")
    assert prompt(body) == tokens_of(expected)
    system_role = {**body, "input": [{"role": "system", "content": "Use a friendly tone."}, *body["input"][1:]]}
    assert prompt(system_role) == tokens_of(expected)


def test_instructions_and_system_messages_share_the_one_developer_message():
    # The guide's developer message without tools: "# Instructions\n\n{instructions}".
    body = {**GUIDE_DATE, "instructions": "Always respond in riddles",
            "input": [{"role": "system", "content": "Never say the answer."}, {"role": "user", "content": "2+2?"},
                      {"role": "developer", "content": [{"type": "input_text", "text": "Rhyme."}]}]}
    expected = (GUIDE_SYSTEM + "<|end|><|start|>developer<|message|># Instructions\n\nAlways respond in riddles\n\n"
                "Never say the answer.\n\nRhyme.<|end|><|start|>user<|message|>2+2?<|end|><|start|>assistant")
    assert prompt(body) == tokens_of(expected)


def test_text_format_is_the_guides_response_formats_section_at_the_end_of_the_developer_message():
    # Item 2: "# Response Formats\n\n## {format name}\n\n// {description or context}\n{schema}<|end|>",
    # with the guide's shopping-list schema (its example prints "Reasoning: high" where the name goes).
    schema = {"properties": {"items": {"type": "array", "description": "entries on the shopping list",
                                       "items": {"type": "string"}}}, "type": "object"}
    body = {**GUIDE_DATE, "instructions": "You are a helpful shopping assistant",
            "input": "I need to buy coffee, soda and eggs",
            "text": {"format": {"type": "json_schema", "name": "shopping_list", "schema": schema,
                                "description": "The list to buy."}}}
    expected = (GUIDE_SYSTEM + "<|end|><|start|>developer<|message|># Instructions\n\n"
                "You are a helpful shopping assistant\n\n# Response Formats\n\n## shopping_list\n\n"
                "// The list to buy.\n"
                '{"properties":{"items":{"type":"array","description":"entries on the shopping list",'
                '"items":{"type":"string"}}},"type":"object"}'
                "<|end|><|start|>user<|message|>I need to buy coffee, soda and eggs<|end|><|start|>assistant")
    assert prompt(body) == tokens_of(expected)
    # After the tools, and alone when the developer message has nothing else; json_object shows nothing.
    with_tools = prompt({**body, "instructions": None, "tools": GUIDE_FUNCTIONS})
    assert harmony_encoding().decode(with_tools).count(
        "} // namespace functions\n\n# Response Formats\n\n## shopping_list\n\n// The list to buy.\n{") == 1
    bare = harmony_encoding().decode(prompt({**body, "instructions": None}))
    assert "<|start|>developer<|message|># Response Formats\n\n## shopping_list\n\n// The list" in bare
    json_object = harmony_encoding().decode(prompt({**body, "text": {"format": {"type": "json_object"}}}))
    assert "Response Formats" not in json_object


MCP_SCHEMA = {  # what an MCP server built on pydantic lists (FastMCP): titles, anyOf with null
    "type": "object", "title": "nowArguments", "required": ["city"],
    "properties": {"city": {"type": "string", "title": "City", "description": "The city."},
                   "units": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Units"},
                   "days": {"type": "integer", "default": 1, "title": "Days"}}}


def test_mcp_schemas_are_trimmed_and_the_namespace_is_routed_to_commentary():
    # Item 3: the guide's function syntax for the namespace (no `// City` or `//` noise), and the
    # system line naming every namespace the model calls on the commentary channel.
    body = {**GUIDE_DATE, "input": "Weather in Oslo?",
            "tools": [{"type": "mcp", "server_label": "weather", "server_url": "http://x/mcp",
                       "server_description": "Weather server."}]}
    request, _ = parse_request(body)
    registry = ToolRegistry.from_tools(request.tool_dicts())
    registry.add_listing("weather", [Tool(name="now", description="Current weather.", inputSchema=MCP_SCHEMA)])
    namespace = ("## weather\n\n// Weather server.\nnamespace weather {\n\n// Current weather.\ntype now = (_: {\n"
                 "// The city.\ncity: string,\nunits?: string,\ndays?: number, // default: 1\n}) => any;\n\n"
                 "} // namespace weather")
    expected = (GUIDE_SYSTEM + "\nCalls to these tools must go to the commentary channel: 'weather'.<|end|>"
                "<|start|>developer<|message|># Tools\n\n" + namespace
                + "<|end|><|start|>user<|message|>Weather in Oslo?<|end|><|start|>assistant")
    assert prompt(body, registry) == tokens_of(expected)
    # Beside function tools: harmony's `functions` line gains the namespace, `functions` first as rendered.
    body["tools"].insert(0, GUIDE_FUNCTIONS[0])
    request, _ = parse_request(body)
    registry = ToolRegistry.from_tools(request.tool_dicts())
    registry.add_listing("weather", [Tool(name="now", description="Current weather.", inputSchema=MCP_SCHEMA)])
    text = harmony_encoding().decode(prompt(body, registry))
    assert "\nCalls to these tools must go to the commentary channel: 'functions', 'weather'.<|end|>" in text
    assert text.index("namespace functions {") < text.index("namespace weather {")
    # The grammar still checks arguments against the server's own schema.
    assert registry.arguments_schema("weather.now") == MCP_SCHEMA


def test_harmony_schema_keeps_what_the_tool_syntax_shows():
    trimmed = harmony_schema(MCP_SCHEMA)
    assert trimmed == {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "The city."}, "units": {"type": "string"},
        "days": {"type": "integer", "default": 1}}}
    assert MCP_SCHEMA["properties"]["units"]["title"] == "Units"  # a copy: the original is untouched
    union = harmony_schema({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]})
    assert union == {"type": ["string", "integer"]}
    kept = {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/X"}]}  # not a plain type union: left as is
    assert harmony_schema(kept) == kept
    assert harmony_schema({"type": "array", "items": {"title": "Item", "type": "string"}}) == {
        "type": "array", "items": {"type": "string"}}


def test_reasoning_items_render_only_their_raw_chain_of_thought():
    # Item 4: the analysis channel holds raw CoT (the guide's "Reasoning"); a summary is not it.
    items = [{"role": "user", "content": "What is 2 + 2?"},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Adds numbers."}]},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Ignored."}],
              "content": [{"type": "reasoning_text", "text": 'User asks: "What is 2 + 2?"'},
                          {"type": "reasoning_text", "text": "Simple arithmetic. Provide answer."}]},
             {"type": "function_call", "call_id": "c", "name": "get_location", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c", "output": "SF"}]
    body = {**GUIDE_DATE, "input": items, "tools": [GUIDE_FUNCTIONS[0]]}
    text = harmony_encoding().decode(prompt(body))
    assert "Adds numbers." not in text and "Ignored." not in text
    analysis = ('<|start|>assistant<|channel|>analysis<|message|>User asks: "What is 2 + 2?"\n'
                "Simple arithmetic. Provide answer.<|end|>")
    assert text.count("<|channel|>analysis") == 1 and analysis in text
    tail = analysis + ("<|start|>assistant to=functions.get_location<|channel|>commentary <|constrain|>json"
                       "<|message|>{}<|call|><|start|>functions.get_location to=assistant<|channel|>commentary"
                       "<|message|>SF<|end|><|start|>assistant")
    assert prompt(body)[-len(tokens_of(tail)):] == tokens_of(tail)


def test_harmony_renders_a_content_object_as_one_text():
    # The head's additions rely on it: a text message holding harmony's rendered text is the same tokens.
    encoding = harmony_encoding()
    request, _ = parse_request({**GUIDE_DATE, "input": "Hi", "instructions": "Déjà vu 😀", "tools": GUIDE_FUNCTIONS})
    registry = ToolRegistry.from_tools(request.tool_dicts())
    from batch.harmony.head import head_messages
    from batch.harmony.render import head_spec

    _, developer = head_messages(head_spec(request, [], registry, PromptOptions()))
    tokens = encoding.render(developer)
    text = encoding.decode(tokens[tokens.index(200008) + 1:-1])
    assert encoding.render(Message.from_role_and_content(Role.DEVELOPER, text)) == tokens
