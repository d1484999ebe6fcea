"""What the GPU path would do, measured without a GPU: one figure per proxy, each with its goal.

A proxy is a number that predicts GPU speed and can be measured on a CPU machine: the MoE inner
loop's instruction count compiled for sm_90, the share of decode tokens a CUDA graph would compute,
the host's milliseconds per step, a decode step's kernel launches, the sampler's launches and peak
temporaries per step, the KV bookkeeping's build time.
Each measure lives beside the code it measures and is listed in MEASURES; `python -m engine.bench
--proxies` (the benchmark, on torch alone: the GPU check runs it) and `python -m engine.proxies` print
them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class ProxyFigure:
    """One measured figure: `value` in `unit`, and whether it meets `goal` (a human-readable bound)."""

    name: str
    value: float
    unit: str
    goal: str
    ok: bool


# Token counts of the MoE's issue-bound figures: batch 1, decode batches 64, 128 and 256, a full mixed step (one at
# each height of tile the engine picks: 16, 16, 32, 64 and 128 rows, so any step's MoE can be estimated).
MOE_STEP_TOKENS = (1, 64, 128, 256, 2048)


@lru_cache(maxsize=1)
def sm90_report() -> dict[str, Any]:
    """The kernels compiled for sm_90 at MOE_STEP_TOKENS, in a child process (~1 min): once for every measure."""
    from engine.kernels.sm90 import moe_inner_loop

    return moe_inner_loop(MOE_STEP_TOKENS)


def _moe_inner_loop() -> list[ProxyFigure]:
    """The MXFP4 MoE's inner loop per projection at decode batch 256, and what a step's MoE issues at
    MOE_STEP_TOKENS (engine.kernels.moe_cost), compiled for sm_90 in a child process."""
    from engine.kernels.moe_cost import issue_bound_ms, mxfp4_kernels, weight_read_ms
    from engine.kernels.sm90 import DECODE_TOKENS, MOE_INNER_LOOP_GOAL

    report = sm90_report()
    goal = MOE_INNER_LOOP_GOAL
    figures = [ProxyFigure(f"moe inner loop, {k['projection']} (triton {report['triton']})", k["per_4096"],
                           "warp-instr / 4096 weights", f"<= {goal}", k["per_4096"] <= goal)
               for k in mxfp4_kernels(report, DECODE_TOKENS)]
    for tokens in MOE_STEP_TOKENS:
        tiles, block = (mxfp4_kernels(report, tokens)[0][key] for key in ("tiles", "block"))
        read_ms = weight_read_ms(report, tokens)
        figures.append(ProxyFigure(f"moe issue-bound ms, T={tokens} ({tiles} tiles of {block[0]})",
                                   issue_bound_ms(report, tokens), f"ms (weights read: {read_ms:.2g})", "-", True))
    return figures


def attention_figures() -> list[ProxyFigure]:
    """The decode attention's loop over a key tile compiled for sm_90, and what it issues a decode step at batch 256
    and 1,024 tokens of context against the time its K and V take to read (engine.kernels.attention_cost)."""
    from engine.kernels.attention_cost import ISSUE_SHARE_GOAL, decode_issue_ms, decode_kernels, decode_read_ms
    from engine.kernels.sm90 import ATTENTION_LOOP_GOAL
    from engine.step_estimate import model_config

    report, config = sm90_report(), model_config()
    full = decode_kernels(report)[False]
    issue, read = decode_issue_ms(report, config, 256, 1024), decode_read_ms(config, 256, 1024)
    return [ProxyFigure(f"attention decode loop (triton {report['triton']})", full["loop_instructions"],
                        f"warp-instr / {full['block_n']} keys", f"<= {ATTENTION_LOOP_GOAL}",
                        full["loop_instructions"] <= ATTENTION_LOOP_GOAL),
            ProxyFigure("  its issue / K,V read, B=256 ctx=1k", issue / read,
                        f"({issue:.2f} / {read:.2f} ms, {full['registers']} regs)", f"<= {ISSUE_SHARE_GOAL}",
                        issue / read <= ISSUE_SHARE_GOAL)]


def host_prepare_figures() -> list[ProxyFigure]:
    """The host's ms to prepare a decode step (engine.host_costs), at batch 64/256 and 1k/4k context."""
    from engine.host_costs import GOAL_MS, prepare_figures

    return [ProxyFigure(f"host prepare ms/step, {case}", ms, "ms (best median)", f"<= {GOAL_MS}", ms <= GOAL_MS)
            for case, ms in prepare_figures()]


def engine_step_figures() -> list[ProxyFigure]:
    """The host's ms for a whole engine decode step, the model's forward taking none (engine.host_costs):
    what async scheduling must hide behind the GPU's step, beside the batch side's work per token."""
    from engine.host_costs import CALLS_PER_ROW_GOAL
    from engine.host_costs import engine_step_figures as measure

    figures = []
    for case, ms, calls in measure():
        figures += [ProxyFigure(f"engine host ms/step, {case}", ms, "ms CPU (best median)", "-", True),
                    ProxyFigure("  Python calls a decode row", calls, "calls", f"<= {CALLS_PER_ROW_GOAL}",
                                calls <= CALLS_PER_ROW_GOAL)]
    return figures


def graph_share_figures() -> list[ProxyFigure]:
    """Decode tokens of a ShareGPT-like 512-request run in a CUDA graph (engine.graph_share), and in full
    decode graphs alone (what steps without a prefill row reach: the only graphs before piecewise capture)."""
    from engine.graph_share import sharegpt_graph_stats

    stats = sharegpt_graph_stats()
    share, full = stats["graph_share"], stats["full_graph_decode_tokens"] / max(stats["decode_tokens"], 1)
    return [ProxyFigure("decode tokens in graphs, sharegpt 512", share, "share of decode tokens", ">= 0.9",
                        share >= 0.9),
            ProxyFigure("  of which in full decode graphs", full, "share of decode tokens", "-", True)]


@lru_cache(maxsize=1)
def launches() -> tuple[float, float]:
    """(launches a layer, a 24-layer decode step's) on the Triton path, counted in a child process: once for every
    measure."""
    from engine.launch_costs import launch_figures

    return launch_figures()


def _decode_launches() -> list[ProxyFigure]:
    """Kernel launches of a decode step's forward on the Triton path (engine.launch_costs)."""
    from engine.launch_costs import GOAL_PER_LAYER, LAYERS_20B

    per_layer, per_step = launches()
    return [ProxyFigure("decode launches a layer (triton)", per_layer, "launches", f"<= {GOAL_PER_LAYER}",
                        per_layer <= GOAL_PER_LAYER),
            ProxyFigure(f"  a {LAYERS_20B}-layer step's forward", per_step, "launches", "-", True)]


def _block_manager_build() -> list[ProxyFigure]:
    from engine.kv_cache import build_seconds

    seconds = build_seconds(1_000_000)
    return [ProxyFigure("block manager build, 1M blocks", seconds, "s", "<= 0.2", seconds <= 0.2)]


def _sampler_ops() -> list[ProxyFigure]:
    from engine.sampler_costs import ops_per_step

    counts = ops_per_step((1, 64, 256))
    constant = len(set(counts.values())) == 1
    return [ProxyFigure(f"sampler ops per step, batch {batch}", count, "aten ops (mixed rows)", "constant", constant)
            for batch, count in counts.items()]


def sampler_temporary_figures() -> list[ProxyFigure]:
    """The sampler's peak temporaries at batch 256 over gpt-oss's vocabulary (measured per vocabulary entry
    on a small one), against what the KV reserve allows for them (engine.config.sampling_reserve_bytes)."""
    from engine.device_sampler import sampler_temporary_bytes
    from engine.sampler_costs import GPT_OSS_VOCAB, MEASURE_VOCAB, temporaries

    batch, mib = 256, 2**20
    bound = batch * sampler_temporary_bytes(1, GPT_OSS_VOCAB) / mib
    # ok: within the bound at the measured vocabulary (its per-row part weighs more there)
    return [ProxyFigure(f"sampler temporaries, B=256, {kind}", per_logit * batch * GPT_OSS_VOCAB / mib, "MiB (peak)",
                        f"<= {bound:.0f}", per_logit * MEASURE_VOCAB <= sampler_temporary_bytes(1, MEASURE_VOCAB))
            for kind, per_logit in temporaries(batch).items()]


SAMPLER_GOAL_MS = 0.5  # a decode step's draw at batch 256: a tenth of its MoE (engine.kernels.moe_cost)


def sampler_step_figures() -> list[ProxyFigure]:
    """A decode step's sampling at batch 256 over gpt-oss's vocabulary, submit's default rows (temperature 1), on
    an H100: the torch ops' memory traffic at the HBM's bandwidth; the Triton draw's, or what its sm_90 code
    issues where that takes longer."""
    from engine.sampler_costs import UNIFORM, draw_issue_ms, hbm_ms, traffic_per_logit

    batch, rows = 256, [UNIFORM["temperature 1"]] * 256
    figures = []
    for kernels in ("torch", "triton"):
        per_logit = traffic_per_logit(rows, kernels)
        ms = hbm_ms(per_logit, batch)
        unit = f"ms ({per_logit:.3g} B/logit moved)"
        if kernels == "triton":
            issue = draw_issue_ms(sm90_report(), batch)
            if issue > ms:
                ms, unit = issue, f"ms issue-bound ({per_logit:.2g} B/logit)"
        figures.append(ProxyFigure(f"sampler ms/step, B=256, temp 1 ({kernels})", ms, unit,
                                   f"<= {SAMPLER_GOAL_MS}" if kernels == "triton" else "-",
                                   kernels == "torch" or ms <= SAMPLER_GOAL_MS))
    return figures


def step_estimate_figures() -> list[ProxyFigure]:
    """A decode step's time on an H100 summed from the parts above (engine.step_estimate), at batch 1 against the
    roofline (issue 24's goal) and at batch 256, 1,024 tokens of context, each part beneath."""
    from engine.step_estimate import BATCH1_GOAL, estimate

    report, (_, per_step) = sm90_report(), launches()
    figures = []
    for batch in (1, 256):
        step = estimate(report, per_step, batch, 1024)
        ratio = step.total_ms / step.roofline_ms
        if batch == 1:
            figures.append(ProxyFigure("decode step estimate, B=1 ctx=1k", step.total_ms,
                                       f"ms, {ratio:.2f}x the roofline", f"<= {BATCH1_GOAL}x roofline",
                                       ratio <= BATCH1_GOAL))
        else:
            figures.append(ProxyFigure(f"decode step estimate, B={batch} ctx=1k", step.total_ms,
                                       f"ms, {step.tokens_per_s:,.0f} tok/s", "-", True))
        figures += [ProxyFigure(f"  {name}", ms, "ms", "-", True) for name, ms in step.parts_ms.items()]
    # a long reasoning eval's decode, where attention's reads lead: the KV cache in bf16 and in fp8
    for kv_itemsize, label in ((2, ""), (1, ", fp8 KV")):
        step = estimate(report, per_step, 64, 16384, kv_itemsize=kv_itemsize)
        figures.append(ProxyFigure(f"decode step estimate, B=64 ctx=16k{label}", step.total_ms,
                                   f"ms, {step.tokens_per_s:,.0f} tok/s (attention {step.parts_ms['attention']:.2f})",
                                   "-", True))
    return figures


RUN_GOAL_TOKENS_PER_S = 20_000  # issue 24: ShareGPT-like, one H100, above vLLM's 19,129 with async scheduling


def run_estimate_figures() -> list[ProxyFigure]:
    """The ShareGPT-like 512-request run of the graph-share figure, every scheduled step's time estimated by
    engine.step_estimate.step_parts: the run's total tok/s on paper, against issue 24's goal."""
    from engine.graph_share import sharegpt_run
    from engine.step_estimate import estimate_run

    _, steps, tokens = sharegpt_run()
    run = estimate_run(sm90_report(), steps, tokens, launches()[1])
    goal = RUN_GOAL_TOKENS_PER_S
    return [ProxyFigure("sharegpt 512 estimate, total tok/s", run.tokens_per_s,
                        f"tok/s ({run.steps} steps, {run.prefill_steps} mixed)", f">= {goal:,}",
                        run.tokens_per_s >= goal),
            *[ProxyFigure(f"  {name}", seconds, "s of the run", "-", True) for name, seconds in run.parts_s.items()]]


# Each entry measures one concern and returns its figures. Imports stay inside the measures so a
# missing optional dependency (triton) fails only its own line.
MEASURES: list[tuple[str, Callable[[], list[ProxyFigure]]]] = [
    ("moe inner loop", _moe_inner_loop),
    ("attention decode loop", attention_figures),
    ("decode tokens in graphs", graph_share_figures),
    ("host prepare ms/step", host_prepare_figures),
    ("engine host ms/step", engine_step_figures),
    ("decode launches", _decode_launches),
    ("block manager build", _block_manager_build),
    ("sampler ops per step", _sampler_ops),
    ("sampler temporaries", sampler_temporary_figures),
    ("sampler ms/step", sampler_step_figures),
    ("decode step estimate", step_estimate_figures),
    ("sharegpt run estimate", run_estimate_figures),
]


def measure_all() -> list[ProxyFigure | tuple[str, Exception]]:
    """Every measure's figures; a measure that raises gives (its name, the error) instead."""
    out: list[ProxyFigure | tuple[str, Exception]] = []
    for name, measure in MEASURES:
        try:
            out.extend(measure())
        except Exception as error:  # one broken proxy must not hide the others
            out.append((name, error))
    return out


def format_figures(figures: list[ProxyFigure | tuple[str, Exception]]) -> str:
    """A table: name, value, unit, goal, ok (or the error of a measure that failed)."""
    lines = [f"{'proxy':<44} {'value':>12} {'unit':<26} {'goal':<14} ok"]
    for f in figures:
        if isinstance(f, ProxyFigure):
            value = f"{f.value:,.0f}" if abs(f.value) >= 1e4 else f"{f.value:.4g}"  # 20,248, not 2.025e+04
            lines.append(f"{f.name:<44} {value:>12} {f.unit:<26} {f.goal:<14} {'yes' if f.ok else 'NO'}")
        else:
            lines.append(f"{f[0]:<44} FAILED: {type(f[1]).__name__}: {f[1]}")
    return "\n".join(lines)


def main() -> None:
    # Run as `python -m engine.proxies` this file is __main__; the measures build engine.proxies' figures.
    from engine import proxies

    print(proxies.format_figures(proxies.measure_all()))


if __name__ == "__main__":
    # Through the imported module: measures return engine.proxies.ProxyFigure, not __main__'s copy of the class.
    from engine import proxies

    proxies.main()
