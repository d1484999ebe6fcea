"""The fused layer kernels (engine.kernels.fused) against the torch path they replace: RMSNorm (after the residual
add) and RoPE with the K/V cache write. Without CUDA they run in Triton's interpreter."""

from functools import partial

import pytest
import torch

from engine.attention import to_cache_dtype, write_kv
from engine.kernels import require_triton, triton_available
from engine.model import RMSNorm, apply_rotary

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)
from engine.kernels import fused  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # the GPU check runs them natively


def torch_norm(hidden, dtype, seed=0):
    norm = RMSNorm(hidden, 1e-5).to(DEVICE, dtype)
    norm.weight.data = torch.randn(hidden, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 72])  # 72: a masked tail
def test_rms_norm_equals_the_torch_norm(dtype, hidden):
    norm = torch_norm(hidden, dtype)
    x = (3 * torch.randn(7, hidden, generator=torch.Generator().manual_seed(1))).to(DEVICE, dtype)
    got = fused.rms_norm(x, norm.weight, norm.eps)
    assert got.dtype == dtype
    # the squares are summed in another order than torch's mean: fp32 rounding, then at most one step of dtype's
    torch.testing.assert_close(got, norm(x), rtol=2**-7 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_rounds_the_sum_before_the_norm_reads_it(dtype):
    norm = torch_norm(72, dtype)
    gen = torch.Generator().manual_seed(2)
    x, delta = (torch.randn(5, 72, generator=gen).to(DEVICE, dtype) for _ in range(2))
    total, normed = fused.add_rms_norm(x, delta, norm.weight, norm.eps)
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(normed, norm(x + delta), rtol=2**-7 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


def test_a_step_without_tokens_launches_nothing():
    norm = torch_norm(64, torch.float32)
    assert fused.rms_norm(torch.empty(0, 64, device=DEVICE), norm.weight, norm.eps).shape == (0, 64)


def rope_inputs(dtype, num_tokens=5, heads=6, kv_heads=3, head_dim=16, seed=3):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(num_tokens, h, head_dim, generator=gen).to(DEVICE, dtype)
               for h in (heads, kv_heads, kv_heads))
    angles = torch.randn(num_tokens, head_dim // 2, generator=gen) * 3
    return q, k, v, (angles.cos() * 1.1).to(DEVICE), (angles.sin() * 1.1).to(DEVICE)


FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize(("dtype", "cache_dtype"), [(torch.float32, None), (torch.bfloat16, None),
                                                    (torch.bfloat16, FP8), (torch.float32, FP8)])
def test_rope_write_kv_equals_apply_rotary_then_write_kv(dtype, cache_dtype):
    q, k, v, cos, sin = rope_inputs(dtype)
    if cache_dtype is not None:  # an fp8 cache: values past 448 saturate, tiny ones round to its subnormals
        k[0, 0, :4], v[1, 0, :4] = torch.tensor([500.0, -1e4, 3e-3, -1e-9]), torch.tensor([460.0, 1e-3, -0.0, 7.0])
    # a strided slot mapping (every other entry of a longer tensor), slots in several blocks, one reused block
    slots = torch.tensor([3, 99, 17, 40, 4, 0, 63, 1, 18, 2], device=DEVICE)[::2]
    k_cache, v_cache = (torch.randn(8, 8, 3, 16, generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)
                        .to(cache_dtype or dtype) for _ in range(2))
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_q = apply_rotary(q, cos, sin)
    write_kv(want_k, want_v, apply_rotary(k, cos, sin), v, slots)
    got_q = fused.rope_write_kv(q, k, v, cos, sin, k_cache, v_cache, slots)
    assert got_q.dtype == dtype
    # each product and sum rounded to dtype, as apply_rotary does
    assert torch.equal(got_q, want_q)
    # the other slots untouched; the bytes compared (fp8 has no torch.equal on CPU)
    assert torch.equal(k_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), want_v.view(torch.uint8))


def test_rope_write_kv_reads_q_k_v_as_views_of_one_projection():
    q, k, v, cos, sin = rope_inputs(torch.float32)
    packed = torch.cat([t.flatten(1) for t in (q, k, v)], dim=1)  # [T, (6 + 3 + 3) * 16]
    views = packed[:, :96].view(5, 6, 16), packed[:, 96:144].view(5, 3, 16), packed[:, 144:].view(5, 3, 16)
    caches = [torch.zeros(4, 4, 3, 16, device=DEVICE) for _ in range(4)]
    slots = torch.arange(5, device=DEVICE)
    assert torch.equal(fused.rope_write_kv(*views, cos, sin, *caches[:2], slots),
                       fused.rope_write_kv(q, k, v, cos, sin, *caches[2:], slots))
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_rope_write_kv_refuses_a_head_dim_it_cannot_tile():
    q, k, v, cos, sin = rope_inputs(torch.float32, head_dim=12)
    caches = [torch.zeros(4, 4, 3, 12, device=DEVICE) for _ in range(2)]
    with pytest.raises(ValueError, match="head_dim 12 must be a power of two"):
        fused.rope_write_kv(q, k, v, cos, sin, *caches, torch.arange(5, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_combine_sums_each_tokens_experts_in_slot_order_then_adds_the_residual(dtype):
    gen = torch.Generator().manual_seed(5)
    per_pair = (torch.randn(7 * 4, 72, generator=gen) * 3).to(DEVICE)
    residual = torch.randn(7, 72, generator=gen).to(DEVICE, dtype)
    summed = per_pair.view(7, 4, 72).sum(1).to(dtype)
    # torch's CPU sum adds the 4 slots in order, as the kernel does; on CUDA it may pair them otherwise
    same = torch.equal if DEVICE == "cpu" else partial(torch.testing.assert_close, rtol=2**-7, atol=1e-5)
    assert same(fused.moe_combine(per_pair, 4, dtype), summed) is not False
    assert same(fused.moe_combine(per_pair, 4, dtype, residual), residual + summed) is not False
    with pytest.raises(ValueError, match="residual"):
        fused.moe_combine(per_pair, 4, dtype, residual[:3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [64, 72])  # 72: a masked tail
def test_moe_combine_norm_is_the_sum_with_the_residual_then_the_next_norm_in_one_launch(dtype, hidden):
    gen = torch.Generator().manual_seed(6)
    per_pair = (torch.randn(5 * 4, hidden, generator=gen) * 3).to(DEVICE)
    residual = torch.randn(5, hidden, generator=gen).to(DEVICE, dtype)
    norm = torch_norm(hidden, dtype, seed=2)
    stream, normed = fused.moe_combine_norm(per_pair, 4, residual, norm.weight, norm.eps)
    # the two launches it replaces, bit for bit: the same sum, rounding and norm arithmetic
    expected = fused.moe_combine(per_pair, 4, dtype, residual)
    assert torch.equal(stream, expected)
    assert torch.equal(normed, fused.rms_norm(expected, norm.weight, norm.eps))
    torch.testing.assert_close(normed, norm(expected), rtol=2**-7 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="residual"):
        fused.moe_combine_norm(per_pair, 4, residual[:3], norm.weight, norm.eps)


def test_an_fp8_cache_value_is_the_torch_paths_to_the_byte():
    # every e4m3 value, ties, subnormals, saturation, signed zeros and NaNs: the interpreter's own cast gets some
    # wrong, and compiled, negating a zero or taking min(NaN, 448) lost the sign or the NaN
    gen = torch.Generator().manual_seed(5)
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    spread = torch.randn(3000, generator=gen) * torch.exp(3 * torch.randn(3000, generator=gen))
    edges = torch.tensor([448.0, 464.0, 480.0, 1e30, float("inf"), -float("inf"), -0.0, 2.0**-10, 3 * 2.0**-11])
    x = torch.cat([codes, spread, -spread.abs() / 1e4, edges])  # codes: the two NaNs among them
    x = torch.cat([x, torch.zeros(8192 - x.numel())]).to(DEVICE)
    v = x.view(1, 1, 8192)
    k = torch.where(v.isinf(), v.sign() * 1e30, v)  # rotated by 0 (cos 1, sin 0): x * 1 - inf * 0 would be NaN
    cos, sin = torch.ones(1, 4096, device=DEVICE), torch.zeros(1, 4096, device=DEVICE)
    k_cache, v_cache = (torch.zeros(1, 1, 1, 8192, dtype=FP8, device=DEVICE) for _ in range(2))
    fused.rope_write_kv(k, k, v, cos, sin, k_cache, v_cache, torch.zeros(1, dtype=torch.long, device=DEVICE))
    rotated = apply_rotary(k, cos, sin)  # k itself, but for the sign of a zero
    for cache, written in ((k_cache, rotated), (v_cache, v)):
        got, want = cache.flatten(), to_cache_dtype(written, FP8).flatten()
        assert torch.equal(got.float().isnan(), want.float().isnan()) and got.float().isnan().sum() >= 2
        numbers = ~want.float().isnan()  # a NaN's sign bit is the cast's own (torch's CPU and CUDA casts differ)
        assert torch.equal(got.view(torch.uint8)[numbers], want.view(torch.uint8)[numbers])


def test_rounding_keeps_a_nan_of_any_bits():
    # a GPU's arithmetic NaN is 0x7FFFFFFF: rounding by adding to its bits would carry it into -0.0
    per_pair = torch.zeros(4, 8)
    per_pair.view(torch.int32)[0, :2] = torch.tensor([0x7FFFFFFF, -1], dtype=torch.int32)  # -1: 0xFFFFFFFF
    combined = fused.moe_combine(per_pair.to(DEVICE), 4, torch.bfloat16)
    assert combined[0, :2].isnan().all() and not combined[0, 2:].isnan().any()


COMPILES_PER_STEP_SHAPE = """
import json

from engine.kernels.sm90 import _compile_only_for_sm90

launches = _compile_only_for_sm90()  # every launch compiles for sm_90, none runs

import torch

from engine.kernels import fused, moe, moe_route

bf16 = torch.bfloat16
weight, cache = torch.empty(2880, dtype=bf16), torch.empty(8, 16, 8, 64, dtype=bf16)
for tokens, offset in ((1, 0), (16, 1), (37, 1), (5, 0)):  # the step's token count, where its slots start
    x = torch.empty(tokens, 2880, dtype=bf16)
    fused.add_rms_norm(x, x, weight, 1e-5)
    q, k = torch.empty(tokens, 64, 64, dtype=bf16), torch.empty(tokens, 8, 64, dtype=bf16)
    slots = torch.zeros(64, dtype=torch.long)[offset:offset + tokens]
    fused.rope_write_kv(q, k, k, torch.empty(tokens, 32), torch.empty(tokens, 32), cache, cache, slots)
    moe_route.route_logits(torch.empty(tokens, 32, dtype=bf16), 4, 16, moe.max_tiles(tokens * 4, 32, 16))
    fused.moe_combine_norm(torch.empty(tokens * 4, 2880), 4, x, weight, 1e-5)
"""


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="compiles for an H100 in a child process; with CUDA the runs above do")
def test_the_layer_kernels_compile_once_whatever_the_steps_shape():
    # A step's token count and where its slot mapping starts in the step's buffer change every step; were they
    # specialised (ints equal to 1 or a multiple of 16, 16-byte alignment), a run would stop to compile each
    # new combination mid-run. One compile per kernel for every step shape.
    from tests.engine.test_triton_attention import compiles_per_kernel

    assert compiles_per_kernel(COMPILES_PER_STEP_SHAPE) == {"_rms_norm_kernel": 1, "_rope_write_kernel": 1,
                                                            "_route_kernel": 1, "_moe_combine_kernel": 1}
