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

from functools import lru_cache
from typing import Any

# H100 SXM: SMs, the clock the estimates assume, HBM3 bandwidth.
H100_SMS = 132
H100_CLOCK_HZ = 1.755e9
H100_HBM_BYTES_PER_S = 3.35e12
LAYERS_20B = 24
# The MXFP4 kernel the engine runs on a GPU (bf16 activations, experts re-packed as engine.mxfp4_words at load;
# "mxfp4", tl.dot_scaled's decode, where a projection's scales do not allow the words)
ENGINE_MXFP4 = "mxfp4_words"
MXFP4_BYTES_PER_WEIGHT = 17 / 32  # half a byte a weight and one scale byte per 32


def mxfp4_kernels(report: dict[str, Any], num_tokens: int, block_m: int = 0,
                  tiles: str | None = None, weights: str = ENGINE_MXFP4) -> list[dict[str, Any]]:
    """The report's MXFP4 kernels (gate_up, down) compiled for `num_tokens` tokens with `block_m` rows per tile
    asked (0: the engine's choice) and GemmTiles `tiles` (as text; None: a report compiled with one), on `weights`
    ("mxfp4_words", or "mxfp4": the checkpoint's blocks)."""
    found = [k for k in report["kernels"]
             if k["weights"] == weights and k["tokens"] == num_tokens and k["block_m_asked"] == block_m
             and (tiles is None or k.get("gemm_tiles") == tiles)]
    if sorted(k["projection"] for k in found) != ["down", "gate_up"]:
        raise ValueError(f"the report has no MXFP4 gate_up and down kernels at {num_tokens} tokens, "
                         f"block_m {block_m}, {weights}")
    return found


def issue_bound_ms(report: dict[str, Any], num_tokens: int, block_m: int = 0, layers: int = LAYERS_20B,
                   tiles: str | None = None, weights: str = ENGINE_MXFP4) -> float:
    """Milliseconds a step of `num_tokens` tokens spends issuing the MXFP4 MoE's inner loops on its busiest SM, at
    best (see the module's doc)."""
    sm_cycles = sum(_busiest_sm_cycles(k, k["tiles"])
                    for k in mxfp4_kernels(report, num_tokens, block_m, tiles, weights))
    return 1000 * layers * sm_cycles / H100_CLOCK_HZ


def _busiest_sm_cycles(kernel: dict[str, Any], tiles: int) -> float:
    """One launch of `kernel` over `tiles` tiles: the cycles its busiest SM issues (K split between programs: each
    walks its share of K's steps)."""
    from engine.kernels.moe import GemmTiles

    k_in, n_out = kernel["shape"]
    _, block_n, block_k = kernel["block"]
    split = GemmTiles.parse(kernel["gemm_tiles"]).split_k if kernel.get("gemm_tiles") else 1
    programs = tiles * -(-n_out // block_n) * split
    k_steps = -(-k_in // block_k)
    k_per_program = -(-k_steps // split) * block_k
    return -(-programs // H100_SMS) * min(k_in, k_per_program) * block_n / 4096 * kernel["per_4096"]


def issue_bound_ms_at(report: dict[str, Any], num_tokens: int, layers: int = LAYERS_20B) -> float:
    """`issue_bound_ms` at any step size: the loops of the report's kernels compiled at the rows per tile the engine
    picks for `num_tokens` (at any step size), the tiles seeded uniform routing gives (as sm90 routes)."""
    from engine.kernels.moe import block_m_for
    from engine.kernels.sm90 import EXPERTS, TOP_K

    block_m = block_m_for(num_tokens * TOP_K, EXPERTS)
    kernels = {k["projection"]: k for k in report["kernels"]
               if k["weights"] == ENGINE_MXFP4 and k["block_m_asked"] == 0 and k["block"][0] == block_m}
    if set(kernels) != {"gate_up", "down"}:
        raise ValueError(f"the report has no MXFP4 kernels compiled at {block_m} rows a tile ({num_tokens} tokens)")
    tiles = uniform_tiles(num_tokens, block_m, EXPERTS, TOP_K)
    return 1000 * layers * sum(_busiest_sm_cycles(k, tiles) for k in kernels.values()) / H100_CLOCK_HZ


@lru_cache(maxsize=4096)
def uniform_tiles(num_tokens: int, block_m: int, num_experts: int, top_k: int) -> int:
    """Tiles of `block_m` rows a step of `num_tokens` tokens takes, each routed to `top_k` experts drawn uniformly
    (seeded per token, as engine.kernels.sm90 routes its compiles)."""
    import torch

    counts = [0] * num_experts
    for token in range(num_tokens):
        for expert in torch.randperm(num_experts, generator=torch.Generator().manual_seed(token))[:top_k].tolist():
            counts[expert] += 1
    return sum(-(-count // block_m) for count in counts)


def experts_hit(num_tokens: int, num_experts: int, top_k: int) -> float:
    """Experts a step of `num_tokens` tokens reads, expected, each token routed to `top_k` of them uniformly."""
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def weight_read_ms(report: dict[str, Any], num_tokens: int, layers: int = LAYERS_20B) -> float:
    """Milliseconds to read the hit experts' MXFP4 weights once per layer at the HBM's bandwidth."""
    weights = sum(k["experts_hit"] * k["weights_per_expert"] for k in mxfp4_kernels(report, num_tokens))
    return 1000 * layers * weights * MXFP4_BYTES_PER_WEIGHT / H100_HBM_BYTES_PER_S
