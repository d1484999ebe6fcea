"""A decode step's time on an H100, estimated part by part from figures a CPU measures (issue 24).

No GPU has run the engine yet. Each part's least time comes from what is measured here, and their sum judges the
goals about time (batch-1 decode <= 1.5x the roofline) before a GPU does; the GPU check's `profile` step
(engine.step_profile) then measures the same parts:
- moe: the larger of its kernels' issue-bound time (compiled for sm_90: engine.kernels.moe_cost) and the time to
  read the hit experts' weights once;
- weights: every weight but the experts' (attention's projections, the router, the lm_head) read once a step, or
  their matmuls at the tensor cores' peak where that takes longer;
- attention: the KV cache each sequence reads (its context in the full layers, the window in the sliding ones);
- sampler: the Triton draw for temperature-1 rows (submit's default; engine.sampler_costs);
- launches: the forward's kernels (engine.launch_costs), each ~LAUNCH_GAP_US inside a CUDA graph.
The host is left out (async scheduling hides it: engine.host_costs). Each part is a floor (perfect issue, peak
bandwidth, no stalls, parts never overlapping the launch gaps), so the sum is optimistic where the parts are and
pessimistic in adding the gaps; a GPU's profile says by how much. `estimate_run` sums every step of a scheduled
run the same way (`step_parts`: prefill chunks too), so a whole workload's total tok/s is estimated against the
benchmark's goal before a GPU measures it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.kernels.moe_cost import H100_HBM_BYTES_PER_S

H100_BF16_FLOPS = 989e12  # dense bf16 on the tensor cores, H100 SXM
LAUNCH_GAP_US = 1.5  # a kernel node of a CUDA graph after the one it waits for (~1-2 us)
BATCH1_GOAL = 1.5  # x the roofline (issue 24)


@dataclass(frozen=True)
class StepEstimate:
    """One decode step of `batch` sequences at `context` tokens: each part's ms, and the roofline's (the bytes the
    step must read, at the HBM's bandwidth)."""

    batch: int
    context: int
    parts_ms: dict[str, float]
    roofline_ms: float

    @property
    def total_ms(self) -> float:
        return sum(self.parts_ms.values())

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.total_ms * 1000

    def line(self) -> str:
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in self.parts_ms.items())
        return (f"decode step estimate B={self.batch} ctx={self.context}: {self.total_ms:.2f} ms "
                f"({self.tokens_per_s:,.0f} tok/s), {self.total_ms / self.roofline_ms:.2f}x the roofline "
                f"({self.roofline_ms:.2f} ms); ms: {parts}")


def model_config() -> Any:
    """gpt-oss-20b's ModelConfig (engine.bench_gpu's preset)."""
    from engine.bench_gpu import preset_config
    from engine.config import ModelConfig

    return ModelConfig.from_hf(preset_config())


def weight_bytes(config: Any) -> int:
    """Bytes of every bf16 weight a decode step reads whatever its batch: all but the experts and the embedding
    table (one row a token)."""
    h, i, e = config.hidden_size, config.intermediate_size, config.num_local_experts
    experts = config.num_hidden_layers * e * (h * 2 * i + i * h + 2 * i + h)
    return 2 * (config.num_params - experts - config.vocab_size * h)


def kv_bytes(config: Any, batch: int, context: int, kv_itemsize: int = 2) -> int:
    """Bytes of K and V `batch` sequences at `context` tokens read in a decode step, all layers, each value
    `kv_itemsize` bytes (a bf16 cache's 2, an fp8 one's 1)."""
    per_token = 2 * config.num_key_value_heads * config.head_dim * kv_itemsize
    tokens = sum(min(context, config.window(layer) or context) for layer in range(config.num_hidden_layers))
    return batch * tokens * per_token


def estimate(report: dict[str, Any], launches_per_step: float, batch: int, context: int,
             config: Any = None, kv_itemsize: int = 2) -> StepEstimate:
    """A decode step of `batch` sequences at `context` tokens (`step_parts` of its rows), from `report`
    (engine.kernels.sm90's, compiled at the engine's tile height for `batch` tokens) and the forward's
    `launches_per_step` (engine.launch_costs), its KV cache `kv_itemsize` bytes a value."""
    config = config or model_config()
    parts = step_parts(report, ((context - 1, 1, True),) * batch, launches_per_step, config, kv_itemsize)
    roofline = (moe_read_bytes(config, batch) + weight_bytes(config) + kv_bytes(config, batch, context, kv_itemsize)) \
        * 1000 / H100_HBM_BYTES_PER_S
    return StepEstimate(batch, context, parts, roofline)


def moe_read_bytes(config: Any, num_tokens: int) -> float:
    """Bytes of MXFP4 expert weights a step of `num_tokens` tokens reads once, each token routed to its top-k
    experts uniformly (the hit experts expected)."""
    from engine.kernels.moe_cost import MXFP4_BYTES_PER_WEIGHT, experts_hit

    hit = experts_hit(num_tokens, config.num_local_experts, config.num_experts_per_tok)
    return config.num_hidden_layers * hit * 3 * config.hidden_size * config.intermediate_size * MXFP4_BYTES_PER_WEIGHT


def step_parts(report: dict[str, Any], rows: tuple[tuple[int, int, bool], ...], launches_per_step: float,
               config: Any, kv_itemsize: int = 2) -> dict[str, float]:
    """Each part's ms of any step (decodes and prefill chunks alike), its rows as the scheduler made them: (first
    position, new tokens, sampled?) each: the MoE's issue at the engine's rows per tile for the step's tokens
    (engine.kernels.moe_cost.issue_bound_ms_at), its weights' read, or its matmuls at the tensor cores' peak; the
    other weights' read or every token's projections (the lm_head only the sampled rows'); the keys each row reads
    and a chunk's attention FLOPs (`kv_itemsize` bytes a cached value); the sampler's draw for the sampled rows;
    the launch gaps."""
    from engine.kernels.moe_cost import issue_bound_ms_at
    from engine.sampler_costs import draw_issue_ms, hbm_ms

    h, i, k = config.hidden_size, config.intermediate_size, config.num_experts_per_tok
    layers, bandwidth_ms, flops_ms = config.num_hidden_layers, 1000 / H100_HBM_BYTES_PER_S, 1000 / H100_BF16_FLOPS
    tokens = sum(n for _, n, _ in rows)
    sampled = sum(1 for *_, is_sampled in rows if is_sampled)
    moe = max(issue_bound_ms_at(report, tokens, layers), moe_read_bytes(config, tokens) * bandwidth_ms,
              2 * tokens * k * 3 * h * i * layers * flops_ms)  # gate_up's 2 x intermediate columns, then down
    lm_head = config.vocab_size * h
    others = weight_bytes(config) // 2 - lm_head
    weights = max(weight_bytes(config) * bandwidth_ms, 2 * (tokens * others + sampled * lm_head) * flops_ms)
    kv_ms, attention_flops = 0.0, 0.0
    for start, n, _ in rows:
        kv_ms += kv_bytes(config, 1, start + n, kv_itemsize) * bandwidth_ms  # every key its queries see, read once
        if n > 1:  # a chunk's queries each see the keys before them: QK and PV, 2 FLOPs a multiply-add
            for layer in range(layers):
                seen = min(config.window(layer) or start + n, start + (n + 1) / 2)
                attention_flops += 4 * config.num_attention_heads * config.head_dim * n * seen
    return {"moe": moe, "weights": weights, "attention": kv_ms + attention_flops * flops_ms,
            "sampler": max(draw_issue_ms(report, sampled), hbm_ms(4, sampled)) if sampled else 0.0,
            "launches": launches_per_step * LAUNCH_GAP_US / 1000}


@dataclass(frozen=True)
class RunEstimate:
    """A whole run's steps, each estimated by `step_parts`: total tok/s as vLLM's `bench serve` counts it."""

    steps: int
    prefill_steps: int  # steps with a prefill chunk (mixed steps)
    seconds: float
    tokens: int  # the workload's prompt and output tokens
    parts_s: dict[str, float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def estimate_run(report: dict[str, Any], steps: tuple[tuple[tuple[int, int, bool], ...], ...], tokens: int,
                 launches_per_step: float, config: Any = None) -> RunEstimate:
    """A run of `steps` (engine.graph_share.sharegpt_run's) of a workload of `tokens` prompt and output tokens."""
    config = config or model_config()
    parts_s: dict[str, float] = {}
    for rows in steps:
        for name, ms in step_parts(report, rows, launches_per_step, config).items():
            parts_s[name] = parts_s.get(name, 0.0) + ms / 1000
    prefill = sum(1 for rows in steps if any(n > 1 for _, n, _ in rows))
    return RunEstimate(len(steps), prefill, sum(parts_s.values()), tokens, parts_s)


def main() -> None:
    """`python -m engine.step_estimate`: decode steps at batch 1, 64 and 256, 1,024 tokens of context, and the
    ShareGPT-like run of engine.graph_share (~3 min: the kernels compiled for sm_90 and the launches counted, each
    in a child process, and the run scheduled on CPU)."""
    from engine.graph_share import sharegpt_run
    from engine.kernels.sm90 import moe_inner_loop
    from engine.launch_costs import launch_figures

    report, (_, per_step) = moe_inner_loop((1, 64, 128, 256, 2048)), launch_figures()
    for batch in (1, 64, 256):
        print(estimate(report, per_step, batch, 1024).line())
    _, steps, tokens = sharegpt_run()
    run = estimate_run(report, steps, tokens, per_step)
    print(f"sharegpt 512 run estimate: {run.steps} steps ({run.prefill_steps} with a prefill chunk), "
          f"{run.seconds:.2f} s, {run.tokens_per_s:,.0f} total tok/s; s: "
          + ", ".join(f"{name} {seconds:.2f}" for name, seconds in run.parts_s.items()))


if __name__ == "__main__":
    main()
