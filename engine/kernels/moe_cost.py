"""What a step's MoE costs on an H100, from its kernels compiled for sm_90 (engine.kernels.sm90): a lower bound.

Each (tile, column block) program decodes its expert's slice of the weights for its rows: K x BLOCK_N weights, at
the inner loop's warp-instructions per 4,096 weights (which sm90 counts per SM: each of the SM's 4 schedulers
issues one a cycle). The programs of a launch are spread over the SMs, so the busiest SM issues ceil(programs /
SMs) of them: a launch of 360 programs on 132 SMs takes 3 programs' time, not 2.7. At perfect issue that takes
`issue_bound_ms`. The weights the step must read from memory at least once (each hit expert's, whatever its tile
count) take `weight_read_ms` at the HBM's bandwidth. Neither counts stalls, occupancy or the rest of the layer;
the MXFP4 MoE is issue-bound where the first exceeds the second.
"""

from __future__ import annotations

from typing import Any

# H100 SXM: SMs, the clock the estimates assume, HBM3 bandwidth.
H100_SMS = 132
H100_CLOCK_HZ = 1.755e9
H100_HBM_BYTES_PER_S = 3.35e12
LAYERS_20B = 24
MXFP4_BYTES_PER_WEIGHT = 17 / 32  # half a byte a weight and one scale byte per 32


def mxfp4_kernels(report: dict[str, Any], num_tokens: int, block_m: int = 0,
                  tiles: str | None = None) -> list[dict[str, Any]]:
    """The report's MXFP4 kernels (gate_up, down) compiled for `num_tokens` tokens with `block_m` rows per tile
    asked (0: the engine's choice) and GemmTiles `tiles` (as text; None: a report compiled with one)."""
    found = [k for k in report["kernels"]
             if k["weights"] == "mxfp4" and k["tokens"] == num_tokens and k["block_m_asked"] == block_m
             and (tiles is None or k.get("gemm_tiles") == tiles)]
    if sorted(k["projection"] for k in found) != ["down", "gate_up"]:
        raise ValueError(f"the report has no MXFP4 gate_up and down kernels at {num_tokens} tokens, "
                         f"block_m {block_m}")
    return found


def issue_bound_ms(report: dict[str, Any], num_tokens: int, block_m: int = 0, layers: int = LAYERS_20B,
                   tiles: str | None = None) -> float:
    """Milliseconds a step of `num_tokens` tokens spends issuing the MXFP4 MoE's inner loops on its busiest SM, at
    best (see the module's doc)."""
    sm_cycles = 0.0
    for k in mxfp4_kernels(report, num_tokens, block_m, tiles):
        k_in, n_out = k["shape"]
        block_n = k["block"][1]
        programs = k["tiles"] * -(-n_out // block_n)
        sm_cycles += -(-programs // H100_SMS) * k_in * block_n / 4096 * k["per_4096"]
    return 1000 * layers * sm_cycles / H100_CLOCK_HZ


def weight_read_ms(report: dict[str, Any], num_tokens: int, layers: int = LAYERS_20B) -> float:
    """Milliseconds to read the hit experts' MXFP4 weights once per layer at the HBM's bandwidth."""
    weights = sum(k["experts_hit"] * k["weights_per_expert"] for k in mxfp4_kernels(report, num_tokens))
    return 1000 * layers * weights * MXFP4_BYTES_PER_WEIGHT / H100_HBM_BYTES_PER_S
