"""Would a model fit one GPU, and how much KV cache would be left: the engine's own budget, on paper.

The weights are counted from the engine's model built on the meta device (no memory is touched), as
the engine holds them on CUDA: MXFP4 experts packed (4-bit codes, an 8-bit scale per 32, the scales in
whole int32 words of 4: engine.mxfp4_words), the rest bf16. The KV cache then gets what
`engine.device.gpu_kv_cache_budget` gives it once the weights and an allowance for the CUDA context are
in use, less the engine's reserve (`engine.graph_memory.kv_reserve_bytes`: the device block tables, one step's
activations and sampling, and the CUDA graphs' buffers and pool), in blocks of
`engine.model.kv_cache_bytes_per_block`: under the hybrid layout (engine.kv_layout, the default) a block
is one layer group's, the full layers keeping every token and the sliding layers their window; under the
uniform one every layer holds every token.

`python -m engine.memory_plan --preset 120b` prints the plan for gpt-oss-120b's shape on the GPU torch
sees, or on an H100 80GB without one.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

import torch

from engine import mxfp4_words
from engine.config import KV_CACHE_DTYPES, ModelConfig
from engine.device import gpu_kv_cache_budget
from engine.graph_memory import kv_reserve_bytes
from engine.kv_cache import BlockManager, num_blocks_for_budget
from engine.kv_layout import KVLayout, window_blocks
from engine.model import GptOssModel, kv_cache_bytes_per_block

GIB = 2**30
H100_80GB_BYTES = 81_559 * 2**20  # what an H100 80GB HBM3 reports (nvidia-smi, torch)
# What torch's CUDA context and cuBLAS workspace take before any tensor (an assumption, ~0.5-1 GiB on Hopper).
CONTEXT_BYTES = 1 * GIB

@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of each part on one device of `total_bytes`; `kv_tokens` 0 when nothing is left for the cache."""

    total_bytes: int
    utilization: float
    weight_bytes: int
    expert_bytes: int
    context_bytes: int
    reserve_bytes: int  # activations and sampling of one step, and graph_bytes
    graph_bytes: int  # of which: the CUDA graphs' buffers and pool
    kv_bytes: int
    kv_block_bytes: int
    block_size: int
    num_blocks: int
    max_model_len: int  # the model's context
    error: str | None = None
    window: int | None = None  # hybrid layout: the sliding layers' window (their blocks come back past it)
    chunk_tokens: int = 2048  # the most tokens a step computes of one prompt (the sliding layers' prefill reserve)

    @property
    def kv_tokens(self) -> int:
        """Tokens the cache holds across requests (hybrid: in the full layers, each request also holding its
        window's blocks in the sliding layers)."""
        return self.num_blocks * self.block_size

    @property
    def window_blocks(self) -> int:
        """Blocks a decoding request's sliding layers hold (hybrid; 0 uniform): its window's and a new one."""
        return 0 if self.window is None else window_blocks(self.window, self.block_size)

    @property
    def context_tokens(self) -> int:
        """The longest context one request can have: where the engine clamps max_model_len."""
        if not self.num_blocks:
            return 0
        manager = BlockManager(self.num_blocks, self.block_size, window=self.window)
        return min(self.max_model_len, manager.token_capacity(self.chunk_tokens))

    def requests_of(self, tokens: int) -> float:
        """How many requests of `tokens` tokens the cache holds at once."""
        return self.num_blocks / (-(-tokens // self.block_size) + self.window_blocks)

    @property
    def fits(self) -> bool:
        """The weights, the context and one step's activations load, and the cache gets at least a block."""
        return self.error is None

    @property
    def utilization_for_full_context(self) -> float:
        """The gpu_memory_utilization at which the cache would hold one request of the model's full context."""
        blocks = -(-self.max_model_len // self.block_size)
        if self.window is not None:  # and the sliding layers' reserve for its prefill
            blocks += window_blocks(self.window, self.block_size, self.chunk_tokens)
        need = self.weight_bytes + self.context_bytes + self.reserve_bytes + blocks * self.kv_block_bytes
        return need / self.total_bytes


@functools.cache  # building 120b's modules, even on the meta device, takes seconds
def weight_bytes(config: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(all weights, the experts' share) in bytes, as the engine holds them with the Triton kernels on an H100: the
    experts' scales as padded scale words (engine.mxfp4_words.held_scale_bytes)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = GptOssModel(config, kernels="triton")
    finally:
        torch.set_default_dtype(previous)
    total = experts = 0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        if ".experts." in name and name.endswith("_scales"):
            size = mxfp4_words.held_scale_bytes(param.shape)
        total += size
        experts += size if ".experts." in name else 0
    return total, experts


def plan_memory(config: ModelConfig, total_bytes: int, *, utilization: float = 0.9, block_size: int = 16,
                max_num_batched_tokens: int = 2048, max_num_seqs: int = 256, cuda_graphs: bool = True,
                context_bytes: int = CONTEXT_BYTES, dtype: torch.dtype = torch.bfloat16,
                cache_dtype: torch.dtype | None = None, hybrid: bool = True) -> MemoryPlan:
    """The engine's KV-cache sizing for `config` on a device of `total_bytes` with nothing else on it, its cache in
    `cache_dtype` (None: the model's `dtype`), in the hybrid layout if `hybrid` and the model has one."""
    layout = KVLayout.for_model(config, hybrid)
    weights, experts = weight_bytes(config, dtype)
    reserve, eager = (kv_reserve_bytes(config, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                       max_model_len=config.max_position_embeddings, block_size=block_size,
                                       dtype=dtype, cuda_graphs=graphed, hybrid=layout.is_hybrid)
                      for graphed in (cuda_graphs, False))
    graphs = reserve - eager
    block_bytes = kv_cache_bytes_per_block(config, block_size, cache_dtype or dtype, layout)
    free = total_bytes - weights - context_bytes
    chunk = max(max_num_batched_tokens, max_num_seqs)  # engine.config.step_token_budget
    plan = functools.partial(MemoryPlan, total_bytes, utilization, weights, experts, context_bytes, reserve, graphs,
                             window=layout.window, chunk_tokens=chunk)
    try:
        if free < 0:
            raise ValueError(f"the weights alone ({weights / GIB:.1f} GiB) exceed the device")
        budget = gpu_kv_cache_budget(free, total_bytes, utilization, reserve)
        num_blocks = num_blocks_for_budget(budget, block_bytes)
    except ValueError as exc:
        return plan(0, block_bytes, block_size, 0, config.max_position_embeddings, str(exc))
    return plan(num_blocks * block_bytes, block_bytes, block_size, num_blocks, config.max_position_embeddings)


def format_plan(name: str, plan: MemoryPlan) -> str:
    """The plan as lines: each part in GiB, whether it fits, how many KV tokens remain."""
    per_token = plan.kv_block_bytes // plan.block_size
    layers = "" if plan.window is None else ", a block one layer group's"
    lines = [
        f"{name} memory plan on one GPU of {plan.total_bytes / GIB:.1f} GiB at gpu_memory_utilization "
        f"{plan.utilization:.2f} ({plan.utilization * plan.total_bytes / GIB:.1f} GiB):",
        f"  weights        {plan.weight_bytes / GIB:7.2f} GiB  (MXFP4 experts {plan.expert_bytes / GIB:.2f} GiB, "
        f"the rest bf16 {(plan.weight_bytes - plan.expert_bytes) / GIB:.2f} GiB)",
        f"  CUDA context   {plan.context_bytes / GIB:7.2f} GiB  (assumed)",
        f"  activations    {(plan.reserve_bytes - plan.graph_bytes) / GIB:7.2f} GiB  (the engine's reserve for one "
        f"step and its sampling or attention partials)",
        f"  CUDA graphs    {plan.graph_bytes / GIB:7.2f} GiB  (static buffers and pool of the graph plan)",
        f"  KV cache       {plan.kv_bytes / GIB:7.2f} GiB  = {plan.num_blocks:,} blocks of {plan.block_size} tokens "
        f"= {plan.kv_tokens:,} tokens ({per_token / 1024:.0f} KiB per token{layers})",
    ]
    if plan.window is not None:
        lines.append(f"  hybrid layout: the full layers keep every token, the sliding layers their last {plan.window} "
                     f"({plan.window_blocks} blocks a request)")
    if not plan.fits:
        lines.append(f"  fits: NO: {plan.error}")
        return "\n".join(lines)
    lines.append(f"  fits: yes; {plan.kv_tokens:,} KV tokens remain = "
                 f"{plan.requests_of(plan.max_model_len):.2f} requests of the full {plan.max_model_len:,}-token "
                 f"context, or {int(plan.requests_of(2048)):,} of 2,048 tokens")
    if plan.context_tokens < plan.max_model_len:
        lines.append(f"  the engine clamps the context to {plan.context_tokens:,} tokens; a full one needs "
                     f"--gpu-memory-utilization >= {plan.utilization_for_full_context:.3f}")
    return "\n".join(lines)


def preset_model_config(preset: str) -> ModelConfig:
    """ModelConfig of gpt-oss-120b's or -20b's shape (MXFP4 experts)."""
    from engine.bench_gpu import PRESETS, preset_config

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    return ModelConfig.from_hf(preset_config(**PRESETS[preset]))


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.memory_plan [--preset 120b] [--total-gib G]`: print the plan."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--preset", default="120b", choices=["120b", "20b"])
    parser.add_argument("--total-gib", type=float,
                        help="device memory (default: the CUDA device's, else an H100 80GB's)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=sorted(KV_CACHE_DTYPES),
                        help="the KV cache's element type (fp8: a byte a value)")
    parser.add_argument("--uniform-kv-cache", action="store_true",
                        help="every layer keeps every token (the hybrid layout gives the sliding layers' blocks back)")
    args = parser.parse_args(argv)
    if args.total_gib:
        total, source = int(args.total_gib * GIB), "--total-gib"
    elif torch.cuda.is_available():
        total, source = torch.cuda.mem_get_info()[1], torch.cuda.get_device_name()
    else:
        total, source = H100_80GB_BYTES, "no GPU here: an H100 80GB's 81,559 MiB"
    config = preset_model_config(args.preset)
    plan = plan_memory(config, total, utilization=args.gpu_memory_utilization, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       cache_dtype=KV_CACHE_DTYPES[args.kv_cache_dtype], hybrid=not args.uniform_kv_cache)
    print(f"device memory from {source}")
    cache = " (fp8 KV cache)" if args.kv_cache_dtype == "fp8" else ""
    cache += " (uniform KV cache)" if args.uniform_kv_cache else ""
    print(format_plan(f"gpt-oss-{args.preset}-shaped{cache}", plan))


if __name__ == "__main__":
    main()
