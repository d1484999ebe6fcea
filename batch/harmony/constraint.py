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

import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance

from batch.harmony.schema_check import (FIRST_SPECIAL, RETURN_TOKEN, VOCAB_SIZE, harmony_tokenizer, o200k,
                                        one_line, schema_problem)
from batch.harmony.turn_grammar import TurnGrammar

__all__ = ["FIRST_SPECIAL", "RETURN_TOKEN", "VOCAB_SIZE", "ConstraintError", "GrammarConstraint", "check_grammar",
           "harmony_tokenizer", "o200k"]

_CACHE_SIZE = 256


class ConstraintError(ValueError):
    """A grammar llguidance cannot compile (names the request field at fault)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


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
    return ConstraintError("tools", f"cannot be enforced: {one_line(error)}")


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
