# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""A decoder layer's elementwise work in one launch each: RMSNorm (after the residual add), RoPE with the K/V write,
the MoE's sum over a token's experts with the residual add after it and the next layer's input norm.

On the torch path each is a chain of small ops (a norm 7 launches, an add and a norm 8, RoPE on q and k with the
cache write 20, the MoE's sum, cast and add 3), each a kernel of its own on a GPU: ~45 of a layer's 72 launches
on a bf16 decode step. Inside a CUDA
graph a launch still costs ~1-2 us however little it does, which at batch 1 is more than the step's reads take.

Each kernel keeps the torch path's roundings: the residual sum is rounded to the activations' dtype before the
norm reads it; RoPE casts cos and sin to the activations' dtype and rounds each product and sum to it, as
`engine.model.apply_rotary` does; the norm sums the squares in fp32 (in another order than torch's `mean`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernels import require_triton

require_triton("cuda" if torch.cuda.is_available() else "cpu")  # see engine.kernels.moe: before triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """fp32 x rounded to nearest (even) in `dtype`, as an fp32: one op of torch's in that dtype. Spelled out
    because Triton's interpreter (3.9) computes 16-bit floats wrongly and truncates fp32 to bf16."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        # exactly a bf16 (any later cast to it is exact); a NaN stays one (the GPU's 0x7FFFFFFF would carry to -0)
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif dtype == tl.float8e4nv:
        return _e4m3_rounded(x)
    elif dtype == tl.float32:
        return x
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def _e4m3_rounded(x):
    """fp32 x rounded to nearest (even) float8 e4m3, saturated at +-448 as an fp8 KV cache stores it
    (engine.attention.to_cache_dtype), as an fp32 that is exactly an e4m3. Spelled out because the interpreter's
    cast rounds wrongly across a power of two (1.9986 to 1.0) and wraps past 448. Power-of-two scalings are
    exact, and adding then taking away 2^23 rounds a float below 2^23 to its nearest even integer. The sign goes
    back as a bit (compiled, -x of a +0 is +0: a negative value rounded to zero would lose it); a NaN stays one
    (compiled, min(NaN, 448) is 448)."""
    bits = x.to(tl.uint32, bitcast=True)
    magnitude = tl.minimum(tl.abs(x), 448.0)
    exponent = ((magnitude.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32)
    step_exponent = tl.maximum(exponent - 3, 127 - 9)  # 3 mantissa bits; subnormals step by 2^-9
    step = (step_exponent.to(tl.uint32) << 23).to(tl.float32, bitcast=True)
    per_step = ((254 - step_exponent).to(tl.uint32) << 23).to(tl.float32, bitcast=True)  # 1 / step, exactly
    steps = (magnitude * per_step + 8388608.0) - 8388608.0
    signed = ((steps * step).to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, signed)


@triton.jit
def cache_value(x, dtype: tl.constexpr):
    """fp32 x (exactly a value of the model's dtype) as a KV cache of `dtype` stores it."""
    if dtype == tl.float8e4nv:
        nan = tl.full(x.shape, 0x7F, tl.uint8).to(dtype, bitcast=True)
        return tl.where(x != x, nan, rounded(x, dtype).to(dtype))  # the interpreter casts a NaN to a number
    else:
        return x.to(dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, hidden, eps,
                     stride_x, stride_delta, stride_sum, stride_out, ADD: tl.constexpr, BLOCK_H: tl.constexpr):
    """One row: out = weight * norm(x [+ delta]), the sum stored first when ADD."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if ADD:
        delta = tl.load(delta_ptr + row * stride_delta + cols, mask=mask, other=0.0)
        x = rounded(x.to(tl.float32) + delta.to(tl.float32), x.dtype)
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    y = _norm_row(x.to(tl.float32), weight_ptr, cols, mask, hidden, eps, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_row(t, weight_ptr, cols, mask, hidden, eps, dtype: tl.constexpr):
    """weight * t / rms(t) for one row t (fp32; 0 past `hidden`), rounded to `dtype`: every norm's arithmetic."""
    # tl.sum's combine through tl.reduce, not tl.sum: see engine.kernels.moe_route._sum
    t = t * (1.0 / tl.sqrt(tl.reduce(t * t, 0, tl.standard._sum_combine) / hidden + eps))
    return rounded(tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32) * t, dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x [T, hidden] -> weight * x / rms(x), in x's dtype (engine.model.RMSNorm)."""
    out = torch.empty_like(x)
    _launch_norm(x, x, weight, x, out, eps, add=False)
    return out


def add_rms_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x, delta [T, hidden] -> (x + delta, its RMSNorm): the residual add and the next norm in one launch."""
    total, out = torch.empty_like(x), torch.empty_like(x)
    _launch_norm(x, delta, weight, total, out, eps, add=True)
    return total, out


def _launch_norm(x: Tensor, delta: Tensor, weight: Tensor, total: Tensor, out: Tensor, eps: float, add: bool) -> None:
    num_tokens, hidden = x.shape
    if num_tokens == 0:
        return
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_tokens,)](x, delta, weight, total, out, hidden, eps, x.stride(0), delta.stride(0),
                                    total.stride(0), out.stride(0), ADD=add, BLOCK_H=block,
                                    num_warps=min(16, max(1, block // 256)))


@triton.jit
def _rotate(x_ptr, out_ptr, heads, head_mask, d, cos, sin, stride_xh, stride_oh, HALF: tl.constexpr):
    """Rotate one token's heads ([heads, 2 * HALF] at x_ptr) into out_ptr, each product and sum in x's dtype."""
    offs = heads[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x_ptr + offs, mask=head_mask[:, None])
    dtype: tl.constexpr = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(x_ptr + offs + HALF, mask=head_mask[:, None]).to(tl.float32)
    out = out_ptr + heads[:, None] * stride_oh + d[None, :]
    first = rounded(rounded(x1 * cos, dtype) - rounded(x2 * sin, dtype), dtype)
    second = rounded(rounded(x2 * cos, dtype) + rounded(x1 * sin, dtype), dtype)
    tl.store(out, cache_value(first, out_ptr.dtype.element_ty), mask=head_mask[:, None])
    tl.store(out + HALF, cache_value(second, out_ptr.dtype.element_ty), mask=head_mask[:, None])


# slot_mapping is a view into the step's one host-to-device buffer, at an offset that moves with the batch: its
# alignment, specialised, would be a compile of its own mid-run (see engine.kernels.attention.STEP_POINTERS)
@triton.jit(do_not_specialize_on_alignment=("slot_ptr",))
def _rope_write_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                       num_heads, num_kv_heads, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_cos, stride_sin, stride_qot, stride_qoh, stride_sm, stride_slot, stride_ch,
                       HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr):
    """One token: its rotated queries into q_out, its rotated key and its value into the cache at its slot."""
    token = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)
    # cast to q's dtype, as apply_rotary does, and computed with in fp32 (see rounded)
    cos = rounded(tl.load(cos_ptr + token * stride_cos + d), q_ptr.dtype.element_ty)[None, :]
    sin = rounded(tl.load(sin_ptr + token * stride_sin + d), q_ptr.dtype.element_ty)[None, :]
    heads = tl.arange(0, BLOCK_HEADS)
    _rotate(q_ptr + token * stride_qt, q_out_ptr + token * stride_qot, heads, heads < num_heads, d, cos, sin,
            stride_qh, stride_qoh, HALF)
    slot = tl.load(slot_ptr + token * stride_sm).to(tl.int64)
    kv_heads = tl.arange(0, BLOCK_KV_HEADS)
    kv_mask = kv_heads < num_kv_heads
    _rotate(k_ptr + token * stride_kt, k_cache_ptr + slot * stride_slot, kv_heads, kv_mask, d, cos, sin,
            stride_kh, stride_ch, HALF)
    v_offs = kv_heads[:, None] * stride_vh + tl.arange(0, 2 * HALF)[None, :]
    v = tl.load(v_ptr + token * stride_vt + v_offs, mask=kv_mask[:, None])
    cache_offs = slot * stride_slot + kv_heads[:, None] * stride_ch + tl.arange(0, 2 * HALF)[None, :]
    tl.store(v_cache_ptr + cache_offs, cache_value(v.to(tl.float32), v_cache_ptr.dtype.element_ty),
             mask=kv_mask[:, None])


def rope_write_kv(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                  slot_mapping: Tensor) -> Tensor:
    """q [T, heads, d], k, v [T, kv_heads, d], cos, sin [T, d / 2] -> the rotated q; the rotated k and v are
    written into k_cache, v_cache ([blocks, block_size, kv_heads, d]) at slot_mapping [T]
    (engine.model.apply_rotary, then engine.attention.write_kv)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if head_dim % 2 or head_dim & (head_dim - 1) or k_cache.shape[-2:] != (num_kv_heads, head_dim):
        raise ValueError(f"head_dim {head_dim} must be a power of two matching the cache's {tuple(k_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == v_cache.shape) \
            or any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("the caches must be contiguous and alike, and q, k, v contiguous along head_dim")
    q_out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return q_out
    _rope_write_kernel[(num_tokens,)](
        q, k, v, cos, sin, q_out, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        q_out.stride(0), q_out.stride(1), slot_mapping.stride(0), k_cache.stride(1), k_cache.stride(2),
        HALF=head_dim // 2, BLOCK_HEADS=triton.next_power_of_2(num_heads),
        BLOCK_KV_HEADS=triton.next_power_of_2(num_kv_heads),
        enable_fp_fusion=False)  # no a * b - c * d as one FMA: torch rounds each product (fp32 models too)
    return q_out


@triton.jit
def _moe_combine_kernel(per_pair_ptr, residual_ptr, out_ptr, weight_ptr, normed_ptr, hidden, eps, stride_pair,
                        stride_residual, stride_out, stride_normed, stride_split,
                        TOP_K: tl.constexpr, ADD: tl.constexpr, NORM: tl.constexpr, BLOCK_H: tl.constexpr,
                        SPLITS: tl.constexpr):
    """One token: the sum of its TOP_K experts' rows (fp32, in slot order; each row the sum of its SPLITS
    partial sums when the down GEMM split K), in out's dtype [+ the residual] [and, NORM, its RMSNorm: the next
    layer's input norm]."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < hidden
    total = tl.zeros([BLOCK_H], tl.float32)
    for slot in tl.static_range(TOP_K):
        for split in tl.static_range(SPLITS):
            total += tl.load(per_pair_ptr + split * stride_split + (token * TOP_K + slot) * stride_pair + cols,
                             mask=mask, other=0.0)
    dtype: tl.constexpr = out_ptr.dtype.element_ty
    total = rounded(total, dtype)
    if ADD:
        residual = tl.load(residual_ptr + token * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        total = rounded(residual + total, dtype)
    tl.store(out_ptr + token * stride_out + cols, total.to(dtype), mask=mask)
    if NORM:
        y = _norm_row(total, weight_ptr, cols, mask, hidden, eps, dtype)
        tl.store(normed_ptr + token * stride_normed + cols, y.to(dtype), mask=mask)


def moe_combine(per_pair: Tensor, top_k: int, dtype: torch.dtype, residual: Tensor | None = None) -> Tensor:
    """per_pair [T * top_k, hidden] fp32 -> [T, hidden] in `dtype`: each token's experts summed, as
    `per_pair.view(T, top_k, hidden).sum(1).to(dtype)` [+ residual, the residual stream's add after the MoE].
    per_pair [splits, T * top_k, hidden]: a down GEMM's partial sums over K, each pair's added first."""
    out = torch.empty(per_pair.shape[-2] // top_k, per_pair.shape[-1], dtype=dtype, device=per_pair.device)
    _launch_combine(per_pair, top_k, residual, out, None, None, 0.0)
    return out


def moe_combine_norm(per_pair: Tensor, top_k: int, residual: Tensor, weight: Tensor,
                     eps: float) -> tuple[Tensor, Tensor]:
    """`moe_combine` with the residual add, and the sum's RMSNorm (`weight`, `eps`: the next layer's input norm,
    or the model's final one) in the same launch: (residual stream, its norm), as add_rms_norm gives them."""
    out = torch.empty(per_pair.shape[-2] // top_k, per_pair.shape[-1], dtype=residual.dtype,
                      device=per_pair.device)
    normed = torch.empty_like(out)
    _launch_combine(per_pair, top_k, residual, out, weight, normed, eps)
    return out, normed


def _launch_combine(per_pair: Tensor, top_k: int, residual: Tensor | None, out: Tensor, weight: Tensor | None,
                    normed: Tensor | None, eps: float) -> None:
    hidden = per_pair.shape[-1]
    if residual is not None and (residual.shape != out.shape or residual.dtype != out.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} does not match {tuple(out.shape)} "
                         f"{out.dtype}")
    if out.shape[0] == 0:
        return
    block = triton.next_power_of_2(hidden)
    _moe_combine_kernel[(out.shape[0],)](
        per_pair, out if residual is None else residual, out, out if weight is None else weight,
        out if normed is None else normed, hidden, eps, per_pair.stride(-2),
        0 if residual is None else residual.stride(0), out.stride(0), 0 if normed is None else normed.stride(0),
        per_pair.stride(0) if per_pair.dim() == 3 else 0,
        TOP_K=top_k, ADD=residual is not None, NORM=normed is not None, BLOCK_H=block,
        SPLITS=per_pair.shape[0] if per_pair.dim() == 3 else 1,
        num_warps=min(16, max(1, block // 256)))
