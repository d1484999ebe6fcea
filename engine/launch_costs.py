"""Kernel launches a decode step's forward makes, counted on CPU: the nodes a CUDA graph replays one by one.

Each costs ~1-2 us on an H100 however little it does, so a step's launch count is a floor on its time beside
the bytes it reads: at batch 1 the 20b roofline is ~1.1 ms a token. The count is taken on a model of gpt-oss's
structure (alternating sliding and full layers, MXFP4 experts) at tiny widths, decoding 8 rows, with
engine.op_trace.count_launches; at two layer counts, so a step splits into its layers' launches and its own
(embedding, RoPE's cos and sin, the first layer's input norm), and a 24-layer step is its own + 24 x a layer's.
"""

from __future__ import annotations

import json

import torch

from engine.attention import AttentionMetadata
from engine.kernels import run_json_child
from engine.op_trace import count_launches

LAYERS_20B = 24
GOAL_PER_LAYER = 20  # launches a layer on the Triton path (72 in bf16 before the fused kernels)
_ROWS, _CONTEXT, _BLOCK = 8, 300, 16


def decode_launches(kernels: str, num_layers: int) -> int:
    """Launches of one decode step's forward (logits and sampling aside) on a `num_layers`-layer model."""
    from engine.bench_gpu import DRY_RUN_SHAPE, build_engine_model, preset_config
    from engine.model import allocate_kv_cache

    config = preset_config(**{**DRY_RUN_SHAPE, "num_hidden_layers": num_layers})
    model, model_config = build_engine_model(config, "cpu", torch.bfloat16, kernels)
    blocks_per_row = (_CONTEXT + _BLOCK - 1) // _BLOCK
    meta = AttentionMetadata(positions=torch.full((_ROWS,), _CONTEXT - 1),
                             slot_mapping=torch.arange(_ROWS) * blocks_per_row * _BLOCK + _CONTEXT - 1,
                             query_start_loc=torch.arange(_ROWS + 1), seq_lens=torch.full((_ROWS,), _CONTEXT),
                             block_tables=torch.arange(_ROWS * blocks_per_row).view(_ROWS, blocks_per_row),
                             block_size=_BLOCK, max_query_len=1, max_seq_len=_CONTEXT)
    kv_caches = allocate_kv_cache(model_config, _ROWS * blocks_per_row, _BLOCK, torch.bfloat16, "cpu")
    input_ids = torch.arange(_ROWS)
    with torch.inference_mode():
        # the kernels are counted, not run: nothing a forward launches depends on their values, and running them
        # in Triton's interpreter depends on its version (3.6's fails with numpy 2.4 on a loop over a scalar)
        return count_launches(lambda: model(input_ids, meta, kv_caches), run_kernels=False).launches


def launches_per_step(kernels: str = "triton") -> tuple[float, float]:
    """(launches a layer, launches of a 24-layer decode step's forward) on `kernels`' path."""
    two, four = decode_launches(kernels, 2), decode_launches(kernels, 4)
    per_layer = (four - two) / 2
    return per_layer, two - 2 * per_layer + LAYERS_20B * per_layer


def launch_figures(timeout_s: float = 300) -> tuple[float, float]:
    """`launches_per_step()` on the Triton path, counted in a child process: on CPU tensors the kernels take
    Triton's interpreter, which must be chosen before triton.language first loads (see engine.kernels.moe)."""
    per_layer, per_step = run_json_child("engine.launch_costs", [], interpret=True, what="counting launches",
                                         timeout_s=timeout_s)
    return per_layer, per_step


if __name__ == "__main__":
    print(json.dumps(launches_per_step("triton")))
