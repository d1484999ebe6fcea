"""What the GPU path would do, measured without a GPU: one figure per proxy, each with its goal.

A proxy is a number that predicts GPU speed and can be measured on a CPU machine: the MoE inner
loop's instruction count compiled for sm_90, the share of decode tokens a CUDA graph would compute,
the host's milliseconds per step, the sampler's launches per step, the KV bookkeeping's build time.
Each measure lives beside the code it measures and is listed in MEASURES; `python -m engine.proxies`
(and `batchrun bench --systems proxies`) prints them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProxyFigure:
    """One measured figure: `value` in `unit`, and whether it meets `goal` (a human-readable bound)."""

    name: str
    value: float
    unit: str
    goal: str
    ok: bool


# Each entry measures one concern and returns its figures. Imports stay inside the measures so a
# missing optional dependency (triton) fails only its own line.
def host_prepare_figures() -> list[ProxyFigure]:
    """The host's ms to prepare a decode step (engine.host_costs), at batch 64/256 and 1k/4k context."""
    from engine.host_costs import GOAL_MS, prepare_figures

    return [ProxyFigure(f"host prepare ms/step, {case}", ms, "ms (median)", f"<= {GOAL_MS}", ms <= GOAL_MS)
            for case, ms in prepare_figures()]


def graph_share_figures() -> list[ProxyFigure]:
    """Decode tokens of a ShareGPT-like 512-request run in a CUDA graph (engine.graph_share), and in full
    decode graphs alone (what steps without a prefill row reach: the only graphs before piecewise capture)."""
    from engine.graph_share import sharegpt_graph_stats

    stats = sharegpt_graph_stats()
    share, full = stats["graph_share"], stats["full_graph_decode_tokens"] / max(stats["decode_tokens"], 1)
    return [ProxyFigure("decode tokens in graphs, sharegpt 512", share, "share of decode tokens", ">= 0.9",
                        share >= 0.9),
            ProxyFigure("  of which in full decode graphs", full, "share of decode tokens", "-", True)]


MEASURES: list[tuple[str, Callable[[], list[ProxyFigure]]]] = [
    ("decode tokens in graphs", graph_share_figures),
    ("host prepare ms/step", host_prepare_figures),
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
            lines.append(f"{f.name:<44} {f.value:>12.4g} {f.unit:<26} {f.goal:<14} {'yes' if f.ok else 'NO'}")
        else:
            lines.append(f"{f[0]:<44} FAILED: {type(f[1]).__name__}: {f[1]}")
    return "\n".join(lines)


def main() -> None:
    print(format_figures(measure_all()))


if __name__ == "__main__":
    # Run as engine.proxies, not __main__: the measures build engine.proxies.ProxyFigure objects.
    import engine.proxies

    engine.proxies.main()
