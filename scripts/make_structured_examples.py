"""Writes data/examples/structured.jsonl: a seeded set of structured-output requests for the shipped model.

JSON-schema answers (flat and nested objects, arrays, enums, $defs/$ref, anyOf,
integers, patterns) and forced / required / none tool choices over the function
tools the model was trained on:

    python scripts/make_structured_examples.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.names import CITIES, PEOPLE  # noqa: E402
from trainer.tasks import FUNCTIONS  # noqa: E402


def _object(properties: dict, **extra: object) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False, **extra}


TEXT = {"type": "string"}
SCHEMAS = {
    "flat": _object({"name": TEXT, "city": TEXT}),
    "nested": _object({"person": _object({"name": TEXT, "city": TEXT})}),
    "array": _object({"names": {"type": "array", "items": TEXT, "minItems": 1, "maxItems": 3}}),
    "enum": _object({"name": TEXT, "size": {"enum": ["small", "large"]}}),
    "defs": _object({"name": TEXT, "home": {"$ref": "#/$defs/place"}}, **{"$defs": {"place": _object({"city": TEXT})}}),
    "anyof": _object({"name": TEXT, "city": {"anyOf": [TEXT, {"type": "null"}]}}),
    "number": _object({"name": TEXT, "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "pattern": _object({"name": {"type": "string", "pattern": "^[A-Z][a-z]+ [A-Z][a-z]+$"}, "city": TEXT}),
}


def requests(seed: int = 0) -> list[dict]:
    """40 schema requests, then 30 tool-choice requests (named, required, none in turn)."""
    rng = random.Random(seed)
    lines = []
    for i in range(40):
        kind = list(SCHEMAS)[i % len(SCHEMAS)]
        name, city = rng.choice(PEOPLE), rng.choice(CITIES)
        lines.append({"custom_id": f"schema-{kind}-{i}",
                      "input": f"Give JSON with keys name and city for {name} from {city}.",
                      "text": {"format": {"type": "json_schema", "name": kind, "schema": SCHEMAS[kind],
                                          "strict": True}}})
    for i in range(30):
        function = rng.choice(list(FUNCTIONS))
        tool, questions = FUNCTIONS[function]
        others = [FUNCTIONS[f][0] for f in rng.sample(list(FUNCTIONS), 2) if f != function]
        args = {key: rng.choice(CITIES) if key == "city" else rng.choice(PEOPLE) if key == "name" else "X"
                for key in tool["parameters"]["properties"]}
        try:
            question = rng.choice(questions).format(**args)
        except KeyError:
            question = rng.choice(questions)
        choice = [{"type": "function", "name": function}, "required", "none"][i % 3]
        lines.append({"custom_id": f"choice-{i % 3}-{function}-{i}", "input": question,
                      "tools": [tool, *others], "tool_choice": choice})
    return lines


if __name__ == "__main__":
    out = ROOT / "data" / "examples" / "structured.jsonl"
    out.write_text("".join(json.dumps(line) + "\n" for line in requests()))
    print(f"wrote {out.relative_to(ROOT)}")
