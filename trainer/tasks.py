"""A seeded generator of synthetic tasks: a Responses request body and the harmony turns
that answer it, in four families (python arithmetic, function tools, browser search,
no tool). `generate(seed, n)` gives the same tasks for the same seed.

Tool answers are what batchrun's tools return: the python tool prints the expression's
value; browser pages come from the real browser over the shipped corpus.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from functools import cache, lru_cache

from trainer.facts import FACTS
from trainer.names import CITIES, COUNTRIES, CURRENCIES, PEOPLE, SKIES, STATUSES, SYMBOLS, WORDS
from trainer.render import Step, analysis, browser_call, final, function_call, python_call

FAMILIES = ("python", "function_call", "function_output", "browser", "no_tool")
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
_OPS = {"*": ("Multiply {a}*{b}", "Multiply {a} by {b}", "What is {a}*{b}?", "Compute {a}*{b}"),
        "+": ("Add {a}+{b}", "Add {a} and {b}", "What is {a}+{b}?", "Compute {a}+{b}"),
        "-": ("Subtract {b} from {a}", "What is {a}-{b}?", "Compute {a}-{b}"),
        "**": ("What is {a}**{b}?", "Compute {a}**{b}", "Raise {a} to the power {b}")}
_PY_SUFFIX = {"mcp": (" using the mcp.code_interpreter tool.", " Use the mcp.code_interpreter tool.",
                      " using the code_interpreter tool."),
              "builtin": (" Use python.", " using python.", " with the code_interpreter tool.",
                          " Use the python tool.")}


def _python_tools(rng: random.Random, kind: str) -> list[dict]:
    if kind == "builtin":
        return [{"type": "code_interpreter", "container": {"type": "auto"}}]
    return [{"type": "mcp", "server_label": rng.choice(["code_interpreter", "code_interpreter", "python"]),
             "server_url": MCP_URL}]


def python_context(rng: random.Random) -> Context:
    kind = rng.choice(["mcp", "builtin"])
    return Context(_fields(rng, _python_tools(rng, kind)), kind=kind)


def python_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    op = rng.choice(["*", "*", "+", "-", "**"])
    if op == "**":
        a, b = rng.randint(2, 20), rng.randint(2, 6)  # results up to 8 digits: long strings of "000" copy badly
    else:
        a, b = rng.randint(2, 9999), rng.randint(2, 9999)
    kind = context.kind
    text, suffix = rng.choice(_OPS[op]).format(a=a, b=b), rng.choice(_PY_SUFFIX[kind])
    if suffix[1].isupper():  # a sentence of its own
        text = text if text.endswith("?") else text + "."
    else:
        text = text.rstrip("?") + suffix if not text.startswith("What") else text
        suffix = "" if text.endswith(suffix) else " Use python."
    text += suffix
    expression = f"{a}{op}{b}"
    result = str(eval(expression))  # noqa: S307 -- two integers and an operator
    code = f"print({expression})"
    steps = [Step((analysis(f"Compute {expression} with python."), python_call(code)), "python", result + "\n"),
             Step((final(f"{expression} = {result}"),))]
    return Task(custom_id, "python", context.body(text), steps, result, [("python", code)])


# -- function tools ------------------------------------------------------------------
def _fn(name, description, properties, required=None):
    return {"type": "function", "name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required or list(properties)}}


FUNCTIONS = {
    "get_weather": (_fn("get_weather", "Current weather for a city.", {"city": {"type": "string"}}),
                    ("What is the weather in {city}?", "How is the weather in {city} today?")),
    "get_stock_price": (_fn("get_stock_price", "Latest price of a stock.", {"symbol": {"type": "string"}}),
                        ("What is the stock price of {symbol}?", "How much is {symbol} trading at?")),
    "lookup_order": (_fn("lookup_order", "Status of an order.", {"order_id": {"type": "integer"}}),
                     ("Where is my order {order_id}?", "What is the status of order {order_id}?")),
    "get_population": (_fn("get_population", "Population of a country.", {"country": {"type": "string"}}),
                       ("What is the population of {country}?", "How many people live in {country}?")),
    "convert_currency": (_fn("convert_currency", "Convert an amount between currencies.",
                             {"amount": {"type": "number"}, "from_currency": {"type": "string"},
                              "to_currency": {"type": "string"}}),
                         ("Convert {amount} {from_currency} to {to_currency}.",
                          "How much is {amount} {from_currency} in {to_currency}?")),
    "find_email": (_fn("find_email", "Email address of a person.", {"name": {"type": "string"}}),
                   ("What is the email address of {name}?", "Find the email of {name}.")),
}


def _arguments(rng: random.Random, name: str) -> dict:
    if name == "get_weather":
        return {"city": rng.choice(CITIES)}
    if name == "get_stock_price":
        return {"symbol": rng.choice(SYMBOLS)}
    if name == "lookup_order":
        return {"order_id": rng.randint(1000, 99999)}
    if name == "get_population":
        return {"country": rng.choice(COUNTRIES)}
    if name == "convert_currency":
        source, target = rng.sample(CURRENCIES, 2)
        return {"amount": rng.randint(1, 5000), "from_currency": source, "to_currency": target}
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
        out = {"population": rng.randint(100000, 99999999)}
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
    return name, args, rng.choice(FUNCTIONS[name][1]).format(**args)


def function_call_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    name, args, question = _function_request(rng, context)
    arguments = json.dumps(args)
    steps = [Step((analysis(f"Call {name}."), function_call(name, arguments)))]
    return Task(custom_id, "function_call", context.body(question), steps, "", [(f"functions.{name}", args)])


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
_ASK = ("Search the corpus: {q}", "{q} Search the web.", "Use the browser to find out: {q}",
        "Look it up: {q}", "{q} Use web search.")


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
    return Task(custom_id, "browser", context.body(rng.choice(_ASK).format(q=question)), steps, answer,
                [("browser.search", search_args), ("browser.open", open_args)])


# -- no tool -------------------------------------------------------------------------
def no_tool_context(rng: random.Random) -> Context:
    """No tools, or one tool the request forbids (`tool_choice: none`)."""
    if rng.random() < 0.5:
        return Context(_fields(rng, []))
    tool = rng.choice([FUNCTIONS["get_weather"][0], {"type": "code_interpreter"}, {"type": "web_search"}])
    return Context(_fields(rng, [tool], tool_choice="none"))


def no_tool_task(rng: random.Random, custom_id: str, context: Context) -> Task:
    kind = context.kind or rng.choice(["copy", "reverse", "hello", "date", "json", "list"] if context.date else
                                      ["copy", "reverse", "hello", "json", "list"])  # the date is the system message's
    words = rng.sample(WORDS, rng.randint(2, 3 if kind == "reverse" else 5))
    if kind == "copy":
        text, answer = f"Repeat exactly: {' '.join(words)}", " ".join(words)
    elif kind == "reverse":
        text, answer = f"Reverse the order of these words: {' '.join(words)}", " ".join(reversed(words))
    elif kind == "hello":
        name = rng.choice(PEOPLE).split()[0]
        text, answer = rng.choice(["Say hello to {n}.", "Greet {n}."]).format(n=name), f"Hello, {name}!"
    elif kind == "date":
        text = rng.choice(["What is today's date?", "What is the date today? Answer in ISO format."])
        answer = context.date
    elif kind == "json":
        name, city = rng.choice(PEOPLE), rng.choice(CITIES)
        text = f"Give JSON with keys name and city for {name} from {city}."
        answer = json.dumps({"name": name, "city": city})
    else:
        text, answer = f"Write these words as a comma-separated list: {' '.join(words)}", ", ".join(words)
    steps = [Step((analysis(f"Task: {kind}. Answer directly."), final(answer)))]
    return Task(custom_id, "no_tool", context.body(text), steps, answer, [])


_MAKERS = {"python": (python_context, python_task), "function_call": (function_context, function_call_task),
           "function_output": (function_context, function_output_task),
           "browser": (browser_context, browser_task), "no_tool": (no_tool_context, no_tool_task)}


def generate(seed: int, n: int, prefix: str = "task", mix: dict[str, int] | None = None, group: int = 1) -> list[Task]:
    """`n` tasks, all drawn from one generator seeded by `seed`, in groups of `group` tasks of
    one family that share a Context (`Task.group` numbers them); families in turn, each
    family `mix[family]` times per cycle (default: the five evaluated families once each).
    A mix key "no_tool/KIND" (training only) is a group of no_tool tasks of that kind."""
    rng = random.Random(seed)
    cycle = [family for family, count in (mix or dict.fromkeys(FAMILIES, 1)).items() for _ in range(count)]
    tasks: list[Task] = []
    while len(tasks) < n:
        number = len(tasks) // group
        family, _, kind = cycle[number % len(cycle)].partition("/")
        make_context, make_task = _MAKERS[family]
        context = make_context(rng)
        if kind:
            context = replace(context, kind=kind)
        for _ in range(min(group, n - len(tasks))):
            task = make_task(rng, f"{prefix}-{len(tasks):05d}-{family}", context)
            task.group = number
            tasks.append(task)
    return tasks
