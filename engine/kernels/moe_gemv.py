# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""The MoE of the smallest steps as matrix-vector products: one program per (token, expert) pair and column block.

At a few tokens a step (batch-1 decode, a run's tail) the grouped GEMM (engine.kernels.moe_gemm) multiplies tiles
of 16 rows of which one to four are real, and its few tiles a launch leave the GPU's memory system idle: on an H200
a batch-1 layer's MoE took ~64 us (its K split 4 ways) to read ~53 MB of weights, 11 us at the HBM's bandwidth.
Here every pair's program reads its expert's words for BLOCK_N outputs along the whole of K, decodes them as the
GEMM does (engine.kernels.moe_gemm._words_decoded), and multiplies them with the pair's activations on the CUDA
cores in fp32: no tile padding, no sort, no partial sums to reduce, and ~N / BLOCK_N x pairs programs a launch
(20b's gate_up at one token: 4 x 360) with their loads in flight at once.

The weights are decoded in word order (a word's 8 weights are inputs 32h + 16b + 8s + 2c + t of its 64-input
chunk, engine.mxfp4_words), and the activations read in the same order, so no weight is moved between threads.

`moe_gemv_kernel` serves both projections, as moe_gemm_kernel does, but by pair, not by sorted row:
- SWIGLU: x[pair // top_k] times the pair's expert's gate_up weight, plus bias, then the clamped SwiGLU
  (engine.kernels.moe_gemm._store_swiglu) -> activated [P, intermediate] by pair;
- otherwise (down): activated[pair] times the expert's down weight, plus bias, times the router weight -> fp32
  [P, hidden] by pair, which the experts' sum (engine.kernels.fused) adds up as it does the GEMM's.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from engine.kernels import interpreted, require_triton
from engine.mxfp4_words import CHUNK, MAX_K_STEP, takes_k_step

require_triton("cuda" if torch.cuda.is_available() else "cpu")  # see engine.kernels.moe: before triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.kernels.moe_gemm import (  # noqa: E402
    WORDS_CHUNK, _load_step_scales, _store_swiglu, _unpack_step_scales, _words_decoded)

@triton.jit
def moe_gemv_kernel(
    a_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, expert_ids_ptr, pair_weights_ptr,
    K, N, top_k, alpha, limit,
    stride_am, stride_we, stride_wn, stride_se, stride_sg, stride_sn, stride_be, stride_bn, stride_om,
    SWIGLU: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """BLOCK_N outputs of one (token, expert) pair (see the module docstring)."""
    pair = tl.program_id(0)
    expert = tl.load(expert_ids_ptr + pair).to(tl.int64)
    if SWIGLU:
        a_row = pair // top_k  # gate_up reads x by token
    else:
        a_row = pair
    a_row_ptr = a_ptr + a_row.to(tl.int64) * stride_am
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_ptr += expert * stride_we
    s_ptr += expert * stride_se
    acc = tl.full((BLOCK_N, BLOCK_K // 8, 2, 2, 2), 0.0, tl.float32)
    k_steps_end = K // BLOCK_K * BLOCK_K
    # each step loads the next step's operands before it multiplies its own: two steps' weights in flight a program
    loaded = _gemv_loads(a_row_ptr, w_ptr, s_ptr, offs_n, mask_n, 0, k_steps_end, stride_wn, stride_sg, stride_sn,
                         BLOCK_K)
    for k0 in range(0, k_steps_end, BLOCK_K):
        following = _gemv_loads(a_row_ptr, w_ptr, s_ptr, offs_n, mask_n, k0 + BLOCK_K, k_steps_end, stride_wn,
                                stride_sg, stride_sn, BLOCK_K)
        acc += _gemv_products(*loaded, k0, BLOCK_K, ASM)
        loaded = following
    y = _sum_rows(acc, BLOCK_N, BLOCK_K)
    if BLOCK_K > WORDS_CHUNK:  # K's chunks of 64 past the last whole step
        tail = tl.full((BLOCK_N, WORDS_CHUNK // 8, 2, 2, 2), 0.0, tl.float32)
        for k0 in range(k_steps_end, K, WORDS_CHUNK):
            tail += _gemv_products(*_gemv_loads(a_row_ptr, w_ptr, s_ptr, offs_n, mask_n, k0, K, stride_wn, stride_sg,
                                                stride_sn, WORDS_CHUNK), k0, WORDS_CHUNK, ASM)
        y += _sum_rows(tail, BLOCK_N, WORDS_CHUNK)
    y += tl.load(bias_ptr + expert * stride_be + offs_n * stride_bn, mask=mask_n, other=0.0).to(tl.float32)
    if SWIGLU:
        _store_swiglu(y[None, :], out_ptr, pair + tl.arange(0, 1), tl.full((1,), 1, tl.int1), N, stride_om, alpha,
                      limit, 1, BLOCK_N)
    else:
        router_weight = tl.load(pair_weights_ptr + pair).to(tl.float32)
        tl.store(out_ptr + pair.to(tl.int64) * stride_om + offs_n, y * router_weight, mask=mask_n)


@triton.jit
def _gemv_loads(a_row_ptr, w_ptr, s_ptr, offs_n, mask_n, k0, k_end, stride_wn, stride_sg, stride_sn,
                BLOCK_K: tl.constexpr):
    """K step k0's operands (none read where k0 >= k_end): its words [BLOCK_N, BLOCK_K/8], scale loads
    (engine.kernels.moe_gemm._load_step_scales) and activations in word order [BLOCK_K/8, 2, 2, 2]."""
    m = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    inside = m < k_end // 8  # all or none: k_end is a multiple of BLOCK_K past k0
    words = tl.load(w_ptr + offs_n[:, None] * stride_wn + m[None, :], mask=mask_n[:, None] & inside[None, :],
                    other=0)
    first, second = _load_step_scales(s_ptr, offs_n, mask_n & (offs_n * 0 + k0 < k_end), k0, stride_sg, stride_sn,
                                      BLOCK_K)
    a_index = k0 + _word_order(BLOCK_K)
    a = tl.load(a_row_ptr + a_index, mask=a_index < k_end, other=0.0)
    return words, first, second, a


@triton.jit
def _gemv_products(words, first, second, a, k0, BLOCK_K: tl.constexpr, ASM: tl.constexpr):
    """K step k0's products, [BLOCK_N, BLOCK_K/8, 2, 2, 2] fp32 in word order, from its `_gemv_loads`."""
    weights = _words_decoded(words, _unpack_step_scales(first, second, k0, BLOCK_K), BLOCK_K, ASM).to(tl.float32)
    return weights * a.to(tl.float32)[None, :, :, :, :]


@triton.jit
def _word_order(BLOCK_K: tl.constexpr):
    """[BLOCK_K/8, 2 (t), 2 (s), 2 (b)]: the input each decoded weight of a K step multiplies (engine.mxfp4_words:
    word w of a step is (chunk w // 8, c, h) with w % 8 = 2c + h; its weight (t, s, b) is input
    32h + 16b + 8s + 2c + t of the chunk)."""
    w = tl.arange(0, BLOCK_K // 8)
    word = (w // 8) * WORDS_CHUNK + (w % 2) * 32 + (w % 8 // 2) * 2
    t = tl.arange(0, 2)[None, :, None, None]
    s = tl.arange(0, 2)[None, None, :, None]
    b = tl.arange(0, 2)[None, None, None, :]
    return word[:, None, None, None] + t + 8 * s + 16 * b


@triton.jit
def _sum_rows(acc, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc [BLOCK_N, BLOCK_K/8, 2, 2, 2] -> its sums over all but the first axis, [BLOCK_N] (tl.sum's combine
    through tl.reduce: see engine.kernels.moe_route._sum)."""
    return tl.reduce(tl.reshape(acc, (BLOCK_N, BLOCK_K)), 1, tl.standard._sum_combine)


def gemv_experts(x: Tensor, expert_ids: Tensor, top_k: int, weights: Tensor,
                 gate_up: tuple[Tensor, Tensor, Tensor], down: tuple[Tensor, Tensor, Tensor], alpha: float,
                 limit: float, *, block_n: int, block_k: int, num_warps: int, num_stages: int) -> Tensor:
    """The MoE's two projections by pair: x [T, hidden] bf16, expert_ids and router weights [T, top_k], each
    projection as (words, scale words or bytes, bias) -> [T * top_k, hidden] fp32, row token * top_k + slot, each
    pair's expert output times its router weight (what engine.kernels.fused.moe_combine sums)."""
    ids = expert_ids.reshape(-1)
    launch = partial(gemv_launch, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages)
    activated = torch.empty(ids.numel(), gate_up[0].shape[1] // 2, dtype=x.dtype, device=x.device)
    launch(x, *gate_up, activated, ids, top_k, pair_weights=x, swiglu=(alpha, limit))
    per_pair = torch.empty(ids.numel(), down[0].shape[1], dtype=torch.float32, device=x.device)
    launch(activated, *down, per_pair, ids, 1, pair_weights=weights.reshape(-1).contiguous(), swiglu=None)
    return per_pair


def gemv_launch(a: Tensor, blocks: Tensor, scales: Tensor, bias: Tensor, out: Tensor, expert_ids: Tensor,
                top_k: int, *, pair_weights: Tensor, swiglu: tuple[float, float] | None, block_n: int,
                block_k: int, num_warps: int, num_stages: int) -> None:
    """moe_gemv_kernel over (pair, column block): words `blocks` [E, out, in / 8] and their scale words (or scale
    bytes); `swiglu` (alpha, limit) selects gate_up's epilogue. expert_ids: [P] the expert of each pair."""
    num_pairs = expert_ids.numel()
    n = blocks.shape[1]
    if a.dtype != torch.bfloat16 or not takes_k_step(block_k) or a.stride(1) != 1 or block_n % 2:
        raise ValueError(f"the MoE's matrix-vector kernel takes contiguous bf16 activations, an even block of "
                         f"columns and K steps of a multiple of {CHUNK} up to {MAX_K_STEP}: got {a.dtype}, "
                         f"{block_n} columns, K steps of {block_k}")
    if num_pairs == 0:
        return
    alpha, limit = swiglu or (0.0, 0.0)
    moe_gemv_kernel[(num_pairs, triton.cdiv(n, block_n))](
        a, blocks, scales, bias, out, expert_ids, pair_weights,
        blocks.shape[2] * 8, n, top_k, alpha, limit,
        a.stride(0), blocks.stride(0), blocks.stride(1), scales.stride(0), scales.stride(2), scales.stride(1),
        bias.stride(0), bias.stride(1), out.stride(0),
        SWIGLU=swiglu is not None, ASM=not interpreted(), BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages)
