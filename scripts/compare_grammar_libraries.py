"""llguidance against xgrammar on the o200k_harmony vocabulary (201,088 tokens), as the README reports.

For each library: time to build its tokenizer view, time to compile a JSON-schema
grammar, and the time to compute one next-token mask while a fixed answer is
consumed token by token (mean and 99th percentile), plus its installed size.
Both get the same schema and the same tokens. Run after `pip install xgrammar`
(batchrun itself depends on llguidance only):

    python scripts/compare_grammar_libraries.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from importlib import metadata
from pathlib import Path

import torch

from batch.harmony.constraint import VOCAB_SIZE, harmony_tokenizer, o200k
from batch.harmony.vocab import harmony_encoding

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"enum": ["France", "Germany", "Italy", "Spain"]},
        "population": {"type": "integer"},
        "coordinates": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                        "required": ["lat", "lon"], "additionalProperties": False},
        "districts": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    },
    "required": ["city", "country", "population", "coordinates", "districts"],
    "additionalProperties": False,
}
ANSWER = json.dumps({"city": "Paris", "country": "France", "population": 2102650,
                     "coordinates": {"lat": 48.8566, "lon": 2.3522},
                     "districts": ["Louvre", "Bourse", "Temple", "Hotel-de-Ville", "Pantheon"]})


def installed_mb(*distributions: str) -> float:
    """Size on disk of the distributions' files, in MB."""
    total = 0
    for name in distributions:
        for file in metadata.files(name) or []:
            path = Path(file.locate())
            total += path.stat().st_size if path.is_file() else 0
    return total / 1e6


def time_masks(fill, consume, tokens: list[int]) -> list[float]:
    """Seconds per mask while `tokens` are consumed one by one."""
    times = []
    for token in tokens:
        start = time.perf_counter()
        fill()
        times.append(time.perf_counter() - start)
        if not consume(token):
            raise RuntimeError(f"token {token} rejected")
    return times


def run_llguidance(tokens: list[int], repeats: int) -> dict:
    import llguidance
    import llguidance.torch as llt

    start = time.perf_counter()
    tokenizer = harmony_tokenizer()
    tokenizer_s = time.perf_counter() - start
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False,
                                                                              "item_separator": ", ",
                                                                              "key_separator": ": "})
    compile_s, times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        compile_s.append(time.perf_counter() - start)
        bitmask = llt.allocate_token_bitmask(1, VOCAB_SIZE)
        times += time_masks(lambda m=matcher, b=bitmask: llt.fill_next_token_bitmask(m, b, 0),
                            matcher.consume_token, tokens)
    return {"tokenizer_s": tokenizer_s, "compile_s": statistics.median(compile_s), "mask_s": times,
            "installed_mb": installed_mb("llguidance")}


def run_xgrammar(tokens: list[int], repeats: int) -> dict:
    import xgrammar

    encoding = harmony_encoding()
    start = time.perf_counter()
    ranks, _ = o200k()
    vocab = [b""] * VOCAB_SIZE
    for token, rank in ranks.items():
        vocab[rank] = token
    for token_id in range(len(ranks), VOCAB_SIZE):
        vocab[token_id] = encoding.decode([token_id]).encode()
    info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=VOCAB_SIZE, stop_token_ids=[200002])
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    tokenizer_s = time.perf_counter() - start
    compile_s, times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                separators=(", ", ": "))
        compile_s.append(time.perf_counter() - start)
        matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
        bitmask = xgrammar.allocate_token_bitmask(1, VOCAB_SIZE)
        times += time_masks(lambda m=matcher, b=bitmask: m.fill_next_token_bitmask(b, 0), matcher.accept_token,
                            tokens)
    return {"tokenizer_s": tokenizer_s, "compile_s": statistics.median(compile_s), "mask_s": times,
            "installed_mb": installed_mb("xgrammar", "apache-tvm-ffi")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokens = harmony_encoding().encode(ANSWER)
    print(f"{len(tokens)} answer tokens, {args.repeats} repeats, vocabulary {VOCAB_SIZE}")
    print(f"{'library':<12} {'tokenizer s':>12} {'compile ms':>11} {'mask µs mean':>13} {'mask µs p99':>12} "
          f"{'installed MB':>13}")
    for name, run in (("llguidance", run_llguidance), ("xgrammar", run_xgrammar)):
        result = run(tokens, args.repeats)
        masks = sorted(result["mask_s"])
        p99 = masks[int(0.99 * (len(masks) - 1))]
        print(f"{name:<12} {result['tokenizer_s']:>12.2f} {1e3 * result['compile_s']:>11.2f} "
              f"{1e6 * statistics.mean(masks):>13.1f} {1e6 * p99:>12.1f} {result['installed_mb']:>13.1f}")


if __name__ == "__main__":
    main()
