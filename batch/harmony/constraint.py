"""A turn's grammar as the engine's `TokenConstraint`: an llguidance matcher over the harmony vocabulary.

llguidance was picked over xgrammar by measurement on the 201,088-token
o200k_harmony vocabulary (README, "Structured outputs";
scripts/compare_grammar_libraries.py), and because its grammars name special
tokens (`<|end|>`) apart from the same characters spelled in text.

Compiling a grammar costs milliseconds; requests of one batch usually share their
grammars, so compiled matchers are cached by grammar text and each turn gets a
fresh copy.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance

from batch.harmony.turn_grammar import TurnGrammar
from batch.harmony.vocab import harmony_encoding

VOCAB_SIZE = 201088  # o200k_harmony: o200k_base's 199,998 tokens, then harmony's special tokens
FIRST_SPECIAL = 199998
RETURN_TOKEN = 200002
_CACHE_SIZE = 256


class ConstraintError(ValueError):
    """A grammar llguidance cannot compile (names the request field at fault)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@functools.cache
def o200k() -> tuple[dict[bytes, int], str]:
    """o200k_base's mergeable ranks and split pattern, from the bpe-openai wheel (never a download).

    Its registry entry alone: `bpe_openai.get_encoding` also loads two other vocabularies (~0.7 s more).
    """
    from bpe_openai import registry

    encoding = registry.o200k_base()
    return encoding["mergeable_ranks"], encoding["pat_str"]


@functools.cache
def harmony_tokenizer() -> llguidance.LLTokenizer:
    """llguidance's view of the harmony vocabulary (about 1 s to build; once per process)."""
    (ranks, pattern), harmony = o200k(), harmony_encoding()
    specials = {harmony.decode([token_id]): token_id for token_id in range(FIRST_SPECIAL, VOCAB_SIZE)}
    return llguidance.LLTokenizer.from_tiktoken(  # type: ignore[attr-defined]  # absent from its stubs
        encoder=ranks, special_tokens=specials, pattern=pattern,
        eos_token=RETURN_TOKEN, n_vocab=VOCAB_SIZE)


class _MatcherCache:
    """Compiled matchers by grammar text (LRU); `fresh()` hands out an unconsumed copy."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._matchers: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def compiled(self, grammar: TurnGrammar) -> llguidance.LLMatcher:
        """The grammar's compiled matcher, shared: copy it before consuming tokens."""
        with self._lock:
            compiled = self._matchers.get(grammar.lark)
            if compiled is not None:
                self._matchers.move_to_end(grammar.lark)
                return compiled
        compiled = llguidance.LLMatcher(harmony_tokenizer(), grammar.lark, log_level=0)
        if compiled.is_error():
            raise _explain(grammar, compiled.get_error())
        with self._lock:
            self._matchers[grammar.lark] = compiled
            while len(self._matchers) > self.size:
                self._matchers.popitem(last=False)
        return compiled

    def fresh(self, grammar: TurnGrammar) -> llguidance.LLMatcher:
        return self.compiled(grammar).deep_copy()


_CACHE = _MatcherCache(_CACHE_SIZE)


def _explain(grammar: TurnGrammar, error: str) -> ConstraintError:
    """Name the schema that broke the grammar (each is compiled alone); else the grammar itself."""
    for field, schema in grammar.schemas:
        problem = schema_problem(json.dumps(schema))
        if problem:
            return ConstraintError(field, f"cannot be enforced: {problem}")
    return ConstraintError("tools", f"cannot be enforced: {_one_line(error)}")


@functools.lru_cache(maxsize=4096)
def schema_problem(schema: str) -> str | None:
    """Why llguidance cannot enforce a JSON Schema (its text, its x-guidance options included), or None.
    Cached by text: a server's listing is the same for every request of a run."""
    alone = llguidance.LLMatcher.grammar_from_json_schema(schema)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(alone, harmony_tokenizer())
    return _one_line(messages[0]) if is_error else None


def _one_line(message: str) -> str:
    """llguidance's message on one line: a regex error spans lines (the pattern, a line of ^
    under it, `error: ...`), which split the run summary into what looked like an error of its own."""
    lines = (line.strip() for line in message.splitlines())
    return " ".join(line for line in lines if line and set(line) != {"^"})


def check_grammar(grammar: TurnGrammar) -> None:
    """Compile the grammar now (cached for its turns); ConstraintError names the field it cannot enforce."""
    _CACHE.compiled(grammar)


class GrammarConstraint:
    """One turn's grammar state; the engine fills masks from it and reports sampled tokens."""

    def __init__(self, grammar: TurnGrammar) -> None:
        self._matcher = _CACHE.fresh(grammar)
        self.error: str | None = None

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        # Straight into the tensor's memory (releasing the GIL); llguidance.torch would import torch
        # into every process that only admits lines.
        target = bitmask[row]
        if target.dtype.itemsize != 4 or not target.is_contiguous() or target.device.type != "cpu":
            raise ValueError("the bitmask must be a contiguous CPU int32 tensor")
        self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), target.numel() * 4)

    def accept(self, token_id: int) -> None:
        if self.error is None and not self._matcher.consume_token(token_id):
            # llguidance appends the whole grammar to its message: keep the first line
            detail = (self._matcher.get_error() or "").split("\n", 1)[0]
            self.error = detail or f"token {token_id} breaks the grammar"

    @property
    def is_accepting(self) -> bool:
        """The tokens so far are a complete completion of the grammar."""
        return self._matcher.is_accepting()
