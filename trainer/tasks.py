"""A seeded generator of synthetic tasks: a Responses request body and the harmony turns
that answer it, in five families (python arithmetic, function tools, browser search,
no tool, structured JSON answers). `generate(seed, n)` gives the same tasks for the same seed.

Tool answers are what batchrun's tools return: the python tool prints the expression's
value; browser pages come from the real browser over the shipped corpus.

Every family's phrasings are split in two (`Phrasings`): training draws only the `train`
ones; `generate(..., split="held_out")` draws only the `held_out` ones, so an evaluation on
them measures wording the model has never seen, not memorised templates. Held-out phrasings
recombine words of the training ones with a few new ones ("Please", "worth"); they do not
bring new operation words, which no training could teach.
"""

from __future__ import annotations

from typing import cast
import json
import random
from dataclasses import dataclass, replace
from functools import cache, lru_cache

from trainer.facts import FACTS
from trainer.names import CITIES, COUNTRIES, CURRENCIES, PEOPLE, SKIES, STATUSES, SYMBOLS, WORDS
from trainer.render import Step, analysis, browser_call, final, function_call, python_call

FAMILIES = ("python", "function_call", "function_output", "browser", "no_tool", "structured")
SPLITS = ("train", "held_out")
MCP_URL = "http://localhost:8000/mcp"


@dataclass
class Task:
    custom_id: str
    family: str
    body: dict
    steps: list[Step]
    answer: str  # the final answer must contain it ("" for a function_call turn)
    calls: list[tuple[str, dict | str]]  # (recipient, arguments) the model must make, in order
    group: int = 0  # tasks of one group share their Context


@dataclass(frozen=True)
class Phrasings:
    """A family's wordings: those training sees, and those only the held-out evaluation sees."""

    train: tuple[str, ...]
    held_out: tuple[str, ...] = ()

    def pick(self, rng: random.Random, split: str) -> str:
        return rng.choice(self.held_out if split == "held_out" else self.train)

    @property
    def all(self) -> tuple[str, ...]:
        return self.train + self.held_out


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2024, 2027)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


@dataclass(frozen=True)
class Context:
    """What the tasks of one group share: the request fields rendered before the user's
    message (date, reasoning effort, instructions, tools), so their prompts share a prefix
    the trainer computes once. Held-out tasks each get their own."""

    fields: dict  # body fields other than input
    kind: str | None = None  # python: "mcp" or "builtin"; no_tool: the task kind, else one per task
    functions: tuple[str, ...] = ()  # function tasks: the functions offered
    split: str = "train"  # which phrasings the tasks draw ("train" or "held_out")

    def body(self, text) -> dict:
        return {"input": text, **json.loads(json.dumps(self.fields))}

    @property
    def date(self) -> str | None:
        return self.fields.get("metadata", {}).get("conversation_date")


def _fields(rng: random.Random, tools: list[dict], **extra) -> dict:
    fields = {"tools": tools, "metadata": {"conversation_date": _date(rng)}, **extra}
    if rng.random() < 0.1:  # no date: the system message has no "Current date" line
        del fields["metadata"]
    if rng.random() < 0.3:
        fields["reasoning"] = {"effort": rng.choice(["low", "medium", "high"])}
    if rng.random() < 0.2:
        fields["instructions"] = rng.choice(["Answer briefly.", "Be concise.", "You are a helpful assistant.",
                                            "Answer with the result only."])
    return fields


# -- python arithmetic ---------------------------------------------------------------
_OPS = {"*": Phrasings(("Multiply {a}*{b}", "Multiply {a} by {b}", "What is {a}*{b}?", "Compute {a}*{b}",
                        "What is {a} times {b}?", "Calculate {a} times {b}", "Work out {a}*{b}"),
                       ("Calculate {a}*{b}", "Work out {a} times {b}", "Please multiply {a} by {b}")),
        "+": Phrasings(("Add {a}+{b}", "Add {a} and {b}", "What is {a}+{b}?", "Compute {a}+{b}",
                        "What is {a} plus {b}?", "Calculate {a} plus {b}", "Work out {a}+{b}"),
                       ("Calculate {a}+{b}", "Work out {a} plus {b}", "Please add {a} and {b}")),
        "-": Phrasings(("Subtract {b} from {a}", "What is {a}-{b}?", "Compute {a}-{b}", "What is {a} minus {b}?",
                        "Calculate {a} minus {b}", "Work out {a}-{b}"),
                       ("Calculate {a}-{b}", "Work out {a} minus {b}", "Please subtract {b} from {a}")),
        "**": Phrasings(("What is {a}**{b}?", "Compute {a}**{b}", "Raise {a} to the power {b}", "Calculate {a}**{b}",
                         "What is {a} to the power {b}?"),
                        ("Work out {a}**{b}", "Please raise {a} to the power {b}", "Compute {a} to the power {b}"))}
_PY_SUFFIX = {"mcp": Phrasings((" using the mcp.code_interpreter tool.", " Use the mcp.code_interpreter tool.",
                                " using the code_interpreter tool.", " with the code_interpreter tool."),
                               (" Use the code_interpreter tool.", " with the mcp.code_interpreter tool.")),
              "builtin": Phrasings((" Use python.", " using python.", " with the code_interpreter tool.",
                                    " Use the python tool.", " with python."),
                                   (" using the python tool.", " Run it in python."))}
MAX_DIGITS = {"*": 7, "+": 12, "-": 12}  # operand lengths: products up to 14 digits, sums up to 13


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(2 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)


def python_request(op: str, a: int, b: int, template: str, suffix: str) -> tuple[str, str]:
    """(the user's message, the expression python evaluates)."""
    text = template.format(a=a, b=b)
    if suffix[1].isupper():  # a sentence of its own
        text = (text if text.endswith("?") else text + ".") + suffix
    elif text.endswith("?"):  # "What is 2*3 using python?"
        text = text[:-1] + suffix[:-1] + "?"
    else:
        text += suffix
    return text, f"{a}{op}{b}"


def python_steps(expression: str) -> tuple[list[Step], str, str]:
    """(the turns, the printed result, the code) of a task that computes `expression`."""
    result = str(eval(expression))  # noqa: S307 -- two integers and an operator
    code = f"print({expression})"
    steps = [Step((analysis(f"Compute {expression} with python."), python_call(code)), "python", result + "\n"),
             Step((final(f"{expression} = {result}"),))]
    return steps, result, code


def _python_tools(rng: random.Random, kind: str) -> list[dict]:
    if kind == "builtin":
        return [{"type": "code_interpreter", "container": {"type": "auto"}}]
    return [{"type": "mcp", "server_label": rng.choice(["code_interpreter", "code_interpreter", "python"]),
             "server_url": MCP_URL}]


def python_context(rng: random.Random) -> Context:
    kind = rng.choice(["mcp", "builtin"])
    return Context(_fields(rng, _python_tools(rng, kind)), kind=kind)


def python_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    """Operands of 1 to MAX_DIGITS digits, each length equally likely, so results of any
    length up to 13-14 digits (3-5 tokens: o200k splits numbers into groups of 3) come often."""
    op = rng.choice(["*", "*", "+", "-", "-", "**"])  # half the differences are negative
    if op == "**":
        a, b = rng.randint(2, 40), rng.randint(2, 6)  # up to 10 digits; long runs of "000" copy badly
    else:
        a, b = (_operand(rng, rng.randint(1, MAX_DIGITS[op])) for _ in range(2))
    text, expression = python_request(op, a, b, _OPS[op].pick(rng, context.split),
                                      _PY_SUFFIX[cast(str, context.kind)].pick(rng, context.split))
    steps, result, code = python_steps(expression)
    return Task(custom_id, "python", context.body(text), steps, result, [("python", code)])


def long_product_tasks(seed: int, n: int, digits: tuple[tuple[int, int], tuple[int, int]] = ((4, 7), (3, 6))
                       ) -> list[Task]:
    """`n` tasks in the seed data's phrasing, "Multiply 9953*424 using the code_interpreter
    tool.", over an MCP python tool: a of digits[0] digits, b of digits[1] (6 to 13-digit products)."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = (_operand(rng, rng.randint(*span)) for span in digits)
        text, expression = python_request("*", a, b, "Multiply {a}*{b}", " using the code_interpreter tool.")
        steps, result, code = python_steps(expression)
        body = {"input": text, "tools": [{"type": "mcp", "server_label": "code_interpreter", "server_url": MCP_URL}]}
        tasks.append(Task(f"long-{i:05d}-python", "python", body, steps, result, [("python", code)]))
    return tasks


# -- function tools ------------------------------------------------------------------
def _fn(name, description, properties, required=None):
    return {"type": "function", "name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required or list(properties)}}


FUNCTIONS = {
    "get_weather": (_fn("get_weather", "Current weather for a city.", {"city": {"type": "string"}}),
                    ("What is the weather in {city}?", "How is the weather in {city} today?",
                     "Tell me the weather in {city}.", "Weather in {city}, please.")),
    "get_stock_price": (_fn("get_stock_price", "Latest price of a stock.", {"symbol": {"type": "string"}}),
                        ("What is the stock price of {symbol}?", "How much is {symbol} trading at?",
                         "Tell me the stock price of {symbol}.", "What does {symbol} trade at?")),
    "lookup_order": (_fn("lookup_order", "Status of an order.", {"order_id": {"type": "integer"}}),
                     ("Where is my order {order_id}?", "What is the status of order {order_id}?",
                      "Tell me the status of order {order_id}.", "Has order {order_id} shipped?")),
    "get_population": (_fn("get_population", "Population of a country.", {"country": {"type": "string"}}),
                       ("What is the population of {country}?", "How many people live in {country}?",
                        "Tell me the population of {country}.", "How big is the population of {country}?")),
    "convert_currency": (_fn("convert_currency", "Convert an amount between currencies.",
                             {"amount": {"type": "number"}, "from_currency": {"type": "string"},
                              "to_currency": {"type": "string"}}),
                         ("Convert {amount} {from_currency} to {to_currency}.",
                          "How much is {amount} {from_currency} in {to_currency}?",
                          "What is {amount} {from_currency} in {to_currency}?",
                          "Change {amount} {from_currency} into {to_currency}.")),
    "find_email": (_fn("find_email", "Email address of a person.", {"name": {"type": "string"}}),
                   ("What is the email address of {name}?", "Find the email of {name}.",
                    "Tell me the email of {name}.", "How can I email {name}?")),
}
# Questions only the held-out evaluation asks.
HELD_OUT_QUESTIONS = {
    "get_weather": ("What is the weather like in {city} today?", "How is the weather in {city}?"),
    "get_stock_price": ("How much is the stock price of {symbol}?", "Tell me what {symbol} is trading at."),
    "lookup_order": ("Where is order {order_id}?", "What is the status of my order {order_id}?"),
    "get_population": ("How many people live in {country} today?", "What is the population of {country} today?"),
    "convert_currency": ("Convert {amount} {from_currency} into {to_currency}.",
                         "How much is {amount} {from_currency} worth in {to_currency}?"),
    "find_email": ("Find the email address of {name}.", "What is the email of {name}?"),
}


def questions(name: str) -> Phrasings:
    """The function's question phrasings, split."""
    return Phrasings(FUNCTIONS[name][1], HELD_OUT_QUESTIONS[name])


def _arguments(rng: random.Random, name: str) -> dict:
    if name == "get_weather":
        return {"city": rng.choice(CITIES)}
    if name == "get_stock_price":
        return {"symbol": rng.choice(SYMBOLS)}
    if name == "lookup_order":
        return {"order_id": _operand(rng, rng.randint(3, 8))}
    if name == "get_population":
        return {"country": rng.choice(COUNTRIES)}
    if name == "convert_currency":
        source, target = rng.sample(CURRENCIES, 2)
        return {"amount": _operand(rng, rng.randint(1, 6)), "from_currency": source, "to_currency": target}
    return {"name": rng.choice(PEOPLE)}


def _result(rng: random.Random, name: str, args: dict) -> tuple[dict, str]:
    """(the function's JSON output, the answer sentence built from it)."""
    if name == "get_weather":
        out = {"temp_c": rng.randint(-10, 35), "sky": rng.choice(SKIES)}
        return out, f"It is {out['temp_c']}°C and {out['sky']} in {args['city']}."
    if name == "get_stock_price":
        out = {"symbol": args["symbol"], "price": round(rng.uniform(5, 900), 2)}
        return out, f"{args['symbol']} trades at {out['price']}."
    if name == "lookup_order":
        out = {"order_id": args["order_id"], "status": rng.choice(STATUSES)}
        return out, f"Order {args['order_id']} is {out['status']}."
    if name == "get_population":
        out = {"population": _operand(rng, rng.randint(4, 11))}
        return out, f"{args['country']} has a population of {out['population']}."
    if name == "convert_currency":
        out = {"result": round(args["amount"] * rng.uniform(0.1, 3), 2)}
        return out, f"{args['amount']} {args['from_currency']} is {out['result']} {args['to_currency']}."
    out = {"email": f"{args['name'].split()[0].lower()}@{rng.choice(WORDS)}.com"}
    return out, f"The email of {args['name']} is {out['email']}."


def function_context(rng: random.Random) -> Context:
    """One to three functions, in a random order."""
    functions = tuple(rng.sample(list(FUNCTIONS), rng.randint(1, 3)))
    return Context(_fields(rng, [FUNCTIONS[f][0] for f in functions]), functions=functions)


def _function_request(rng: random.Random, context: Context) -> tuple[str, dict, str]:
    name = rng.choice(context.functions)
    args = _arguments(rng, name)
    return name, args, questions(name).pick(rng, context.split).format(**args)


def function_call_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    """A call the question asks for. Some requests force it (`tool_choice` "required", or the
    function by name): batchrun renders those prompts exactly as `auto`'s (the grammar forces
    the call at decode time), so the turns are the same; the requests are there so the model
    is trained on them as sent."""
    name, args, question = _function_request(rng, context)
    arguments = json.dumps(args)
    steps = [Step((analysis(f"Call {name}."), function_call(name, arguments)))]
    body = context.body(question)
    choice = rng.random()
    if choice < 0.2:
        body["tool_choice"] = "required"
    elif choice < 0.4:
        body["tool_choice"] = {"type": "function", "name": name}
    return Task(custom_id, "function_call", body, steps, "", [(f"functions.{name}", args)])


def function_output_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    name, args, question = _function_request(rng, context)
    output, answer = _result(rng, name, args)
    call_id = f"call_{rng.randint(1, 999)}"
    items = [{"role": "user", "content": question},
             {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(args)},
             {"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)}]
    body = context.body(items)
    steps = [Step((analysis(f"Answer from the {name} result."), final(answer)))]
    return Task(custom_id, "function_output", body, steps, answer, [])


# -- browser -------------------------------------------------------------------------
_ASK = Phrasings(("Search the corpus: {q}", "{q} Search the web.", "Use the browser to find out: {q}",
                  "Look it up: {q}", "{q} Use web search.", "Search the web: {q}", "{q} Look it up."),
                 ("Use web search to find out: {q}", "{q} Search the corpus.", "Look it up on the web: {q}"))


@lru_cache(maxsize=1)
def _browser():
    from tools.browser_server import Browser
    from tools.corpus import Corpus

    return Browser(Corpus.from_directories())


@cache
def _search_and_open(query: str) -> tuple[str, str]:
    """What the browser shows a fresh session for search(query, topn 3), then open(0)."""
    browser, session = _browser(), "trainer"
    results, page = browser.search(session, query, 3), browser.open(session, 0)
    browser.reset(session)
    return results, page


def browser_context(rng: random.Random) -> Context:
    return Context(_fields(rng, [{"type": rng.choice(["web_search_preview", "web_search"])}]))


def browser_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    query, question, answer = rng.choice(FACTS)
    search_args, open_args = {"query": query, "topn": 3}, {"id": 0}
    results, page = _search_and_open(query)
    steps = [Step((analysis(f"Search for {query}."), browser_call("search", json.dumps(search_args))),
                  "browser.search", results),
             Step((browser_call("open", json.dumps(open_args)),), "browser.open", page),
             Step((final(f"{answer}."),))]
    return Task(custom_id, "browser", context.body(_ASK.pick(rng, context.split).format(q=question)), steps, answer,
                [("browser.search", search_args), ("browser.open", open_args)])


# -- no tool -------------------------------------------------------------------------
_NO_TOOL = {
    "copy": Phrasings(("Repeat exactly: {w}", "Say exactly: {w}", "Repeat these words: {w}"),
                      ("Repeat exactly these words: {w}", "Please repeat exactly: {w}")),
    "reverse": Phrasings(("Reverse the order of these words: {w}", "Say these words in reverse order: {w}",
                          "Reverse these words: {w}"),
                         ("Reverse the order of the words: {w}", "Please reverse these words: {w}")),
    "hello": Phrasings(("Say hello to {n}.", "Greet {n}.", "Please greet {n}."),
                       ("Say hello to {n}, please.", "Greet {n}, please.")),
    "date": Phrasings(("What is today's date?", "What is the date today? Answer in ISO format.",
                       "Tell me today's date."),
                      ("What date is it today?", "Today's date, please.")),
    "list": Phrasings(("Write these words as a comma-separated list: {w}", "List these words separated by commas: {w}"),
                      ("Write these words as a list separated by commas: {w}",)),
}
# A JSON request: "Give JSON with keys name and city for Ada Lovelace from Oslo."
_JSON = Phrasings(("Give JSON with keys {keys} for {subject}.", "Write JSON with keys {keys} for {subject}.",
                   "Give a JSON object with keys {keys} for {subject}."),
                  ("Return JSON with keys {keys} for {subject}.",
                   "Write a JSON object with keys {keys} for {subject}."))
DECLINE = "I have no tool to look that up."


def no_tool_context(rng: random.Random) -> Context:
    """No tools, or one tool the request forbids (`tool_choice: none`)."""
    if rng.random() < 0.5:
        return Context(_fields(rng, []))
    tool = rng.choice([FUNCTIONS["get_weather"][0], {"type": "code_interpreter"}, {"type": "web_search"}])
    return Context(_fields(rng, [tool], tool_choice="none"))


def no_tool_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    """"decline": a function's question with no tool enabled (no tools, or `tool_choice: none`,
    which batchrun renders the same)."""
    kinds = ["copy", "reverse", "hello", "json", "list", "decline"] + (["date"] if context.date else [])
    kind = context.kind or rng.choice(kinds)  # the date is the system message's
    words = rng.sample(WORDS, rng.randint(2, 3 if kind == "reverse" else 5))
    phrasing = _NO_TOOL.get(kind)
    template = phrasing.pick(rng, context.split) if phrasing else ""
    if kind == "copy":
        text, answer = template.format(w=" ".join(words)), " ".join(words)
    elif kind == "reverse":
        text, answer = template.format(w=" ".join(words)), " ".join(reversed(words))
    elif kind == "hello":
        name = rng.choice(PEOPLE).split()[0]
        text, answer = template.format(n=name), f"Hello, {name}!"
    elif kind == "date":
        text, answer = template, cast(str, context.date)  # a date task only when there is one
    elif kind == "json":
        name, city = rng.choice(PEOPLE), rng.choice(CITIES)
        text = _JSON.pick(rng, context.split).format(keys="name and city", subject=f"{name} from {city}")
        answer = json.dumps({"name": name, "city": city})
    elif kind == "decline":
        function = rng.choice(list(FUNCTIONS))
        text, answer = questions(function).pick(rng, context.split).format(**_arguments(rng, function)), DECLINE
    else:
        text, answer = template.format(w=" ".join(words)), ", ".join(words)
    steps = [Step((analysis(f"Task: {kind}. Answer directly."), final(answer)))]
    return Task(custom_id, "no_tool", context.body(text), steps, answer, [])


# -- structured answers --------------------------------------------------------------
_STRING = {"type": "string"}


def _object(properties: dict, **extra) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False, **extra}


def _json_shape(rng: random.Random, name: str, city: str) -> tuple[dict, dict, str, str]:
    """A schema of the generator's family (flat, nested, $ref, array, enum, integer, nullable,
    pattern), the answer that fills it from the request, its keys in words, and what the
    request must say beyond "NAME from CITY"."""
    shape = rng.choice(["flat", "flat", "nested", "ref", "array", "enum", "integer", "nullable", "pattern"])
    if shape == "nested":
        key = rng.choice(["person", "user", "contact", "entry"])
        return _object({key: _object({"name": _STRING, "city": _STRING})}), {key: {"name": name, "city": city}}, key, ""
    if shape == "ref":
        key = rng.choice(["home", "place", "address"])
        place = {"$defs": {"place": _object({"city": _STRING})}}
        schema = _object({"name": _STRING, key: {"$ref": "#/$defs/place"}}, **place)
        return schema, {"name": name, key: {"city": city}}, f"name and {key}", ""
    if shape == "array":
        key = rng.choice(["names", "people"])
        schema = _object({key: {"type": "array", "items": _STRING, "minItems": 1, "maxItems": 3}})
        return schema, {key: [name]}, key, ""
    if shape == "enum":
        sizes = rng.sample(["small", "medium", "large"], rng.randint(2, 3))
        size = rng.choice(sizes)
        return _object({"name": _STRING, "size": {"enum": sizes}}), {"name": name, "size": size}, "name and size", \
            f", size {size}"
    if shape == "integer":
        age = rng.randint(0, 120)
        schema = _object({"name": _STRING, "age": {"type": "integer", "minimum": 0, "maximum": 120}})
        return schema, {"name": name, "age": age}, "name and age", f", aged {age}"
    city_schema = {"anyOf": [_STRING, {"type": "null"}]} if shape == "nullable" else _STRING
    name_schema = {"type": "string", "pattern": "^[A-Z][a-z]+ [A-Z][a-z]+$"} if shape == "pattern" else _STRING
    if rng.random() < 0.25:
        return _object({"city": city_schema, "name": name_schema}), {"city": city, "name": name}, "city and name", ""
    return _object({"name": name_schema, "city": city_schema}), {"name": name, "city": city}, "name and city", ""


def structured_context(rng: random.Random) -> Context:
    """No tools, or a tool the request forbids."""
    return replace(no_tool_context(rng), kind="structured")


def structured_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    """A JSON answer under `text.format` (json_schema, strict; or json_object). A json_schema
    format is in the prompt (`# Response Formats`), json_object is not, so the request also
    names the keys and values; the answer is the JSON object in the schema's key order."""
    name, city = rng.choice(PEOPLE), rng.choice(CITIES)
    text_format: dict
    if rng.random() < 0.2:
        text_format, answer, keys, extra = {"type": "json_object"}, {"name": name, "city": city}, "name and city", ""
    else:
        schema, answer, keys, extra = _json_shape(rng, name, city)
        text_format = {"type": "json_schema", "name": rng.choice(["answer", "person", "record", "result"]),
                       "schema": schema, "strict": True}
    text = _JSON.pick(rng, context.split).format(keys=keys, subject=f"{name} from {city}{extra}")
    body = {**context.body(text), "text": {"format": text_format}}
    steps = [Step((analysis("Task: json. Answer directly."), final(json.dumps(answer))))]
    return Task(custom_id, "structured", body, steps, json.dumps(answer), [])


_MAKERS = {"python": (python_context, python_task), "function_call": (function_context, function_call_task),
           "function_output": (function_context, function_output_task),
           "browser": (browser_context, browser_task), "no_tool": (no_tool_context, no_tool_task),
           "structured": (structured_context, structured_task)}


def generate(seed: int, n: int, prefix: str = "task", mix: dict[str, int] | None = None, group: int = 1,
             split: str = "train") -> list[Task]:
    """`n` tasks, all drawn from one generator seeded by `seed`, in groups of `group` tasks of
    one family that share a Context (`Task.group` numbers them); families in turn, each
    family `mix[family]` times per cycle (default: the evaluated families once each).
    A mix key "no_tool/KIND" (training only) is a group of no_tool tasks of that kind.
    `split`: the phrasings drawn, "train" or "held_out" (wording training never sees)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(seed)
    cycle = [family for family, count in (mix or dict.fromkeys(FAMILIES, 1)).items() for _ in range(count)]
    tasks: list[Task] = []
    while len(tasks) < n:
        number = len(tasks) // group
        family, _, kind = cycle[number % len(cycle)].partition("/")
        make_context, make_task = _MAKERS[family]
        context = replace(make_context(rng), split=split)
        if kind:
            context = replace(context, kind=kind)
        for _ in range(min(group, n - len(tasks))):
            task = make_task(rng, f"{prefix}-{len(tasks):05d}-{family}", context)
            task.group = number
            tasks.append(task)
    return tasks
