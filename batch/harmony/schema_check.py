"""llguidance's view of the harmony vocabulary, and whether it can enforce a JSON Schema.

Apart from batch/harmony/constraint.py (which compiles whole turn grammars and imports the turn grammar's
module) so that the turn grammar can ask whether a server's schema can be enforced before it builds on it.
"""

from __future__ import annotations

import functools

import llguidance

from batch.harmony.vocab import harmony_encoding

VOCAB_SIZE = 201088  # o200k_harmony: o200k_base's 199,998 tokens, then harmony's special tokens
FIRST_SPECIAL = 199998
RETURN_TOKEN = 200002


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


@functools.lru_cache(maxsize=4096)
def schema_problem(schema: str) -> str | None:
    """Why llguidance cannot enforce a JSON Schema (its text, its x-guidance options included), or None.
    Cached by text: a server's listing is the same for every request of a run."""
    alone = llguidance.LLMatcher.grammar_from_json_schema(schema)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(alone, harmony_tokenizer())
    return one_line(messages[0]) if is_error else None


def one_line(message: str) -> str:
    """llguidance's message on one line: a regex error spans lines (the pattern, a line of ^
    under it, `error: ...`), which split the run summary into what looked like an error of its own."""
    lines = (line.strip() for line in message.splitlines())
    return " ".join(line for line in lines if line and set(line) != {"^"})
