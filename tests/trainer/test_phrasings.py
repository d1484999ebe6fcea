"""Held-out phrasings: training never draws them, the held-out split draws only them."""

import re

import pytest

from trainer import tasks as t
from trainer.facts import FACTS
from trainer.names import CITIES, COUNTRIES, CURRENCIES, PEOPLE, SYMBOLS, WORDS
from trainer.tasks import FAMILIES, FUNCTIONS, HELD_OUT_QUESTIONS, generate

NUMBER = r"-?\d+"
WORD_LIST = "(?:{0})(?: (?:{0}))*".format("|".join(WORDS))
FIELDS = {"a": NUMBER, "b": NUMBER, "order_id": NUMBER, "amount": NUMBER,
          "q": "|".join(re.escape(q) for _, q, _ in FACTS),
          "city": "|".join(CITIES), "country": "|".join(COUNTRIES), "symbol": "|".join(SYMBOLS),
          "name": "|".join(PEOPLE), "n": "|".join(p.split()[0] for p in PEOPLE), "w": WORD_LIST,
          "from_currency": "|".join(CURRENCIES), "to_currency": "|".join(CURRENCIES), "keys": ".+", "subject": ".+"}


def _pattern(template: str) -> str:
    parts = re.split(r"\{(\w+)\}", template)
    return "".join(re.escape(part) if i % 2 == 0 else f"(?:{FIELDS[part]})" for i, part in enumerate(parts))


def _training_patterns() -> re.Pattern:
    """Every user message the training phrasings can produce, whatever the values."""
    templates = list(t._ASK.train) + list(t._JSON.train)
    templates += [q for _, questions in FUNCTIONS.values() for q in questions]
    templates += [phrasing for p in t._NO_TOOL.values() for phrasing in p.train]
    for op, phrasings in t._OPS.items():
        for suffixes in t._PY_SUFFIX.values():
            templates += [t.python_request(op, "{a}", "{b}", p, s)[0] for p in phrasings.train for s in suffixes.train]
    return re.compile("|".join(f"(?:{_pattern(x)})" for x in templates))


def _user_text(task) -> str:
    text = task.body["input"]
    return text if isinstance(text, str) else text[0]["content"]


@pytest.fixture(scope="module")
def training():
    return _training_patterns()


def test_training_split_draws_only_training_phrasings(training):
    tasks = generate(0, 240)
    assert {task.family for task in tasks} == set(FAMILIES)
    unmatched = [_user_text(task) for task in tasks if not training.fullmatch(_user_text(task))]
    assert not unmatched


def test_held_out_split_draws_no_training_phrasing(training):
    tasks = generate(8, 240, split="held_out")
    assert {task.family for task in tasks} == set(FAMILIES)
    memorised = [_user_text(task) for task in tasks if training.fullmatch(_user_text(task))]
    assert not memorised
    # ...and every family's held-out phrasings come up (values drawn fresh as well)
    asked = " ".join(_user_text(task) for task in tasks)
    assert "Please multiply" in asked or "Work out" in asked
    assert any(q.split("{")[0] in asked for questions in HELD_OUT_QUESTIONS.values() for q in questions)


def test_held_out_phrasings_are_not_training_phrasings():
    sets = [t._ASK, t._JSON, *t._OPS.values(), *t._PY_SUFFIX.values(), *t._NO_TOOL.values()]
    sets += [t.questions(name) for name in FUNCTIONS]
    for phrasings in sets:
        assert phrasings.held_out and not set(phrasings.held_out) & set(phrasings.train), phrasings


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split"):
        generate(0, 5, split="test")
