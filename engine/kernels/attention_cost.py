"""What a decode step's attention issues on an H100, from its kernel compiled for sm_90 (engine.kernels.sm90).

The decode kernel (engine.kernels.attention) walks a partition's keys one tile of BLOCK_N at a time, each
(sequence, KV head) reading 2 x BLOCK_N x head_dim cached values a tile. Its loop over a tile, counted in the
SASS, times the tiles of a step, spread evenly over the SMs (a step has thousands of programs) at 4 warp-
instructions a cycle an SM, gives `decode_issue_ms`; the K and V it reads take `decode_read_ms` at the HBM's
bandwidth. A memory-bound loop needs issue to spare, for the stalls between its loads: ISSUE_SHARE_GOAL.
"""

from __future__ import annotations

from typing import Any

from engine.kernels import decode_partition
from engine.kernels.moe_cost import H100_CLOCK_HZ, H100_HBM_BYTES_PER_S, H100_SMS

# issue at most half the time the keys take to read: at 577 warp-instructions a tile (int64 key positions, a runtime
# block size) it was 0.51, and an H200's 1.43x bandwidth left the loop 73% busy issuing
ISSUE_SHARE_GOAL = 0.5


def decode_kernels(report: dict[str, Any]) -> dict[bool, dict[str, Any]]:
    """The report's decode attention kernels by layer kind: {sliding?: kernel}."""
    found = {k["sliding"]: k for k in report["other_kernels"] if k["kernel"] == "_decode_partition_kernel"}
    if set(found) != {False, True}:
        raise ValueError("the report has no decode attention kernels for full and sliding layers")
    return found


def _tiles(config: Any, batch: int, context: int, block_n: int, sliding: bool) -> int:
    """Key tiles a decode step walks in the layers of one kind: each (sequence, KV head) its keys, in the step's
    partitions (engine.kernels.decode_partition), whose last tile may be partial."""
    tiles = 0
    for layer in range(config.num_hidden_layers):
        if config.is_sliding(layer) == sliding:
            span = min(context, config.window(layer) or context)
            partition = decode_partition(batch, config.num_key_value_heads, span, block_n)
            whole, rest = divmod(span, partition)
            tiles += whole * -(-partition // block_n) + -(-rest // block_n)
    return batch * config.num_key_value_heads * tiles


def decode_issue_ms(report: dict[str, Any], config: Any, batch: int, context: int) -> float:
    """Milliseconds an H100 takes at best to issue the decode attention's key loops for `batch` sequences at
    `context` tokens, every layer of `config` (see the module's doc)."""
    cycles = sum(_tiles(config, batch, context, k["block_n"], sliding) * k["loop_instructions"] * k["num_warps"] / 4
                 for sliding, k in decode_kernels(report).items())
    return 1000 * cycles / (H100_SMS * H100_CLOCK_HZ)


def decode_read_ms(config: Any, batch: int, context: int, kv_itemsize: int = 2) -> float:
    """Milliseconds to read the step's K and V once at the HBM's bandwidth."""
    from engine.step_estimate import kv_bytes

    return 1000 * kv_bytes(config, batch, context, kv_itemsize) / H100_HBM_BYTES_PER_S
