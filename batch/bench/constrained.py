"""What grammar-constrained decoding costs the engine: the same batch with and without token masks.

`concurrent` requests decode `output_len` tokens each on one engine, once free and
once each under a JSON-schema grammar that starts in the final channel (so every
token is a JSON token, the expensive case) and never has to end (an unbounded
array of small objects). Both runs are greedy with stop tokens ignored, so both
decode exactly the same number of steps; the overhead is the extra time per step
outside the model's forward, over the free step time, measured alternately in one
process (`batchrun bench --systems constrained`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from batch.harmony.constraint import GrammarConstraint
from batch.harmony.turn_grammar import JSON_OPTIONS, TurnGrammar
from engine.api import SamplingParams

SCHEMA = {"type": "object", "properties": {"rows": {"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                     "score": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "ok": {"type": "boolean"}},
    "required": ["name", "score", "ok"], "additionalProperties": False}}},
    "required": ["rows"], "additionalProperties": False, "x-guidance": JSON_OPTIONS}
GRAMMAR = TurnGrammar(f'start: <|channel|> "final" <|message|> answer <|return|>\nanswer: %json {json.dumps(SCHEMA)}\n',
                      [("schema", SCHEMA)])


@dataclass(frozen=True)
class ConstraintBenchResult:
    concurrent: int
    output_tokens: int
    free_step_ms: float
    free_forward_ms: float
    constrained_step_ms: float
    constrained_forward_ms: float

    @property
    def overhead(self) -> float:
        """Extra time per step outside the model's forward under constraints (filling and applying
        the masks), as a fraction of the free step. The forward itself is left out: with random
        weights its time follows the tokens (which experts they route to), not the masks."""
        extra = (self.constrained_step_ms - self.constrained_forward_ms) - (self.free_step_ms - self.free_forward_ms)
        return extra / self.free_step_ms

    def line(self) -> str:
        return (f"constrained decoding, {self.concurrent} concurrent requests: {self.free_step_ms:.1f} ms/step free "
                f"({self.free_step_ms - self.free_forward_ms:.1f} outside the forward), "
                f"{self.constrained_step_ms - self.constrained_forward_ms:.1f} ms/step outside the forward with "
                f"JSON-schema masks: overhead {100 * self.overhead:.1f}% of a step ({self.output_tokens} tokens a run)")


def _decode(model_dir: Path, prompts: list[list[int]], output_len: int, constrained: bool,
            engine_options: dict) -> tuple[float, float, int, int]:
    """(ms per step, ms of forward per step, steps, output tokens) for one run."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model_dir, max_num_seqs=len(prompts), **engine_options))
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", prompt, SamplingParams(
            max_tokens=output_len, temperature=0.0, ignore_eos=True,
            constraint=GrammarConstraint(GRAMMAR) if constrained else None))
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
    stats = engine.stats()
    steps = stats["num_steps"]
    return 1000 * stats["step_s"] / steps, 1000 * stats["forward_s"] / steps, steps, tokens


def run_constraint_bench(model_dir: Path, *, concurrent: int = 32, prompt_len: int = 64, output_len: int = 64,
                         repeats: int = 3, engine_options: dict | None = None) -> ConstraintBenchResult:
    """Free and constrained runs of the same batch, alternated `repeats` times; the run with the least
    time outside the forward of each (a shared machine's noise only ever adds time)."""
    options = engine_options or {}
    prompts = [[1000 + (i * 131 + j * 17) % 50000 for j in range(prompt_len)] for i in range(concurrent)]
    _decode(model_dir, prompts[:2], 4, True, options)  # warm-up: tokenizer, grammar compile, allocator
    best: dict[bool, tuple[float, float]] = {}
    counts = set()
    for _ in range(repeats):
        for constrained in (False, True):
            step_ms, forward_ms, steps, tokens = _decode(model_dir, prompts, output_len, constrained, options)
            if constrained not in best or step_ms - forward_ms < best[constrained][0] - best[constrained][1]:
                best[constrained] = (step_ms, forward_ms)
            counts.add((steps, tokens))
    if len(counts) != 1:
        raise RuntimeError(f"runs decoded different amounts (steps, tokens): {sorted(counts)}")
    [(_, tokens)] = counts
    return ConstraintBenchResult(concurrent, tokens, *best[False], *best[True])
