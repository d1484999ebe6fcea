"""The Triton MoE (engine.kernels.moe) against the torch GptOssExperts and transformers' MXFP4 dequantisation.

Without CUDA the kernels run in Triton's interpreter (small shapes); with CUDA the same tests run natively.
"""

from functools import partial

import pytest
import torch
from safetensors.torch import load_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from engine import mxfp4
from engine.checkpoint import tiny_config
from engine.config import EngineConfig, ModelConfig
from engine.kernels import require_triton, triton_available
from engine.experts import GptOssExperts

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)  # CPU: the interpreter, chosen before triton is first imported
from engine.kernels import moe, moe_route  # noqa: E402

CONFIG = ModelConfig.from_hf(tiny_config())  # 4 experts, hidden 64, intermediate 64, top_k 2


def routed(num_tokens, *, seed=0, experts=(0, 1, 3), top_k=2):
    """expert_ids [T, top_k] drawn from `experts` only (the others get no tokens) and softmaxed weights."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor(experts)
    ids = torch.stack([pool[torch.randperm(len(pool), generator=gen)[:top_k]] for _ in range(num_tokens)])
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), -1)
    return ids.to(DEVICE), weights.to(DEVICE)


def random_experts(config=CONFIG, kernels="torch", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    experts = GptOssExperts(config, kernels)
    for name, param in experts.named_parameters():
        param.data.normal_(0, 0.1 if name.endswith("bias") else config.hidden_size**-0.5)
    return experts.to(DEVICE, dtype)


# -- routing --------------------------------------------------------------------------
@pytest.mark.parametrize("num_tokens,block_m", [(1, 16), (13, 16), (40, 16), (40, 32)])
def test_route_offsets_equal_bincount_and_tiles_cover_each_expert_once(num_tokens, block_m):
    ids, _ = routed(num_tokens)
    routing = moe.route(ids, 4, block_m)
    flat = ids.reshape(-1).cpu()
    offsets, pairs = routing.expert_offsets.cpu(), routing.sorted_pairs.cpu().long()
    assert torch.equal(offsets.diff(), torch.bincount(flat, minlength=4).int())
    assert torch.equal(pairs.sort().values, torch.arange(flat.numel()))  # a permutation of the pairs
    assert torch.equal(flat[pairs], flat.sort().values)  # grouped by expert
    covered = torch.zeros(flat.numel(), dtype=torch.int)
    assert routing.tile_expert.numel() == moe.max_tiles(flat.numel(), 4, block_m)
    for expert, start in zip(routing.tile_expert.tolist(), routing.tile_row_start.tolist()):
        if expert == 4:  # the unused tail
            continue
        end = min(start + block_m, offsets[expert + 1].item())
        assert offsets[expert] <= start < end
        covered[start:end] += 1
    assert torch.equal(covered, torch.ones_like(covered))


@pytest.mark.parametrize("num_tokens", [64, 128, 256, 512])
def test_rows_per_tile_give_nearly_every_hit_expert_one_tile(num_tokens):
    # Each tile decodes its expert's weights (the MXFP4 MoE's cost on an H100): at gpt-oss-20b's routing (4 of
    # 32 experts a token, drawn uniformly here), a tile as tall as the mean would give ~45% of experts two.
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(32, generator=gen)[:4] for _ in range(num_tokens)])
    counts = torch.bincount(ids.reshape(-1), minlength=32)
    block_m = moe.block_m_for(ids.numel(), 32)
    tiles = int(((counts + block_m - 1) // block_m).sum())
    assert tiles <= 1.1 * int((counts > 0).sum()), (block_m, counts.tolist())
    assert block_m <= 2 * counts.float().mean() * 2  # and no taller than it needs


def test_rows_per_tile_stay_between_16_and_the_tallest_tile_that_does_not_spill():
    assert moe.block_m_for(1, 32) == moe.block_m_for(4, 32) == 16
    assert moe.block_m_for(8 * 2048, 32) == moe.MAX_BLOCK_M == 128


@(pytest.mark.gpu if DEVICE == "cuda" else lambda test: test)  # the GPU check runs it natively
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 4, 2), (37, 32, 4), (300, 32, 4), (70, 128, 4),
                                                          (5, 6, 3)])  # 6 experts, top 3: padded shapes
def test_route_logits_equals_topk_softmax_then_the_reference_routing(dtype, num_tokens, num_experts, top_k):
    gen = torch.Generator().manual_seed(num_tokens)
    # distinct in every row (torch.topk orders ties its own way), and exact in bf16: multiples of 1/8 below 16
    logits = torch.stack([torch.randperm(num_experts, generator=gen) for _ in range(num_tokens)]).float()
    logits = (logits / 8 - num_experts / 16).to(dtype)
    ids, weights, *routing = moe_route.route_logits(logits.to(DEVICE), top_k, 16,
                                                    moe.max_tiles(num_tokens * top_k, num_experts, 16))
    top, want_ids = torch.topk(logits, top_k, dim=-1)
    assert torch.equal(ids.cpu(), want_ids.int())
    assert weights.dtype == dtype
    # the softmax of the top logits, in fp32 rounded to their dtype; torch's exp may differ in its last bit
    torch.testing.assert_close(weights.cpu(), torch.softmax(top, dim=-1), rtol=2**-8 if dtype == torch.bfloat16
                               else 1e-6, atol=0)
    want = moe.route_reference(want_ids.to(DEVICE), num_experts, 16)
    for got, name in zip(routing, ("sorted_pairs", "expert_offsets", "tile_expert", "tile_row_start")):
        assert torch.equal(got.cpu(), getattr(want, name).cpu()), name


def test_route_logits_takes_the_lowest_expert_of_a_tie():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0, 2.0]])
    ids, weights, *_ = moe_route.route_logits(logits.to(DEVICE), 4, 16, moe.max_tiles(4, 6, 16))
    assert ids.tolist() == [[1, 2, 4, 5]]
    torch.testing.assert_close(weights.cpu(), torch.softmax(torch.tensor([[3.0, 3.0, 3.0, 2.0]]), dim=-1))


def test_route_logits_gives_real_experts_and_nan_weights_for_a_nan_or_minus_inf_row():
    # a diverging sequence: torch ranks NaN first and its softmax is NaN; the ids must stay real experts (an
    # id past the last would be a row the GEMMs read out of bounds)
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    logits[0, 4] = float("nan")
    logits[1] = float("-inf")
    ids, weights, sorted_pairs, offsets, *_ = moe_route.route_logits(logits.to(DEVICE), 4, 16,
                                                                     moe.max_tiles(12, 6, 16))
    assert ids.min() >= 0 and ids.max() < 6 and all(len(set(row)) == 4 for row in ids.tolist())
    assert ids[0, 0] == 4 and ids[1].tolist() == [0, 1, 2, 3]
    assert weights[:2].isnan().all() and not weights[2].isnan().any()
    assert offsets[-1] == 12 and sorted(sorted_pairs.tolist()) == list(range(12))


def test_route_reference_traces_without_host_sync():
    ids, _ = routed(9)
    traced = torch.compile(moe.route_reference, fullgraph=True, backend="eager")(ids, 4, 16)
    eager = moe.route_reference(ids, 4, 16)
    for name in ("sorted_pairs", "expert_offsets", "tile_expert", "tile_row_start"):
        assert torch.equal(getattr(traced, name), getattr(eager, name)), name


@(pytest.mark.gpu if DEVICE == "cuda" else lambda test: test)  # the GPU check runs it natively
@pytest.mark.parametrize("num_tokens,num_experts,top_k,block_m", [
    (0, 4, 2, 16), (1, 4, 2, 16), (13, 4, 2, 16), (40, 4, 2, 32), (300, 32, 4, 64),  # 300 x 4: several chunks
    (70, 128, 4, 16),  # 120b's experts: most get none
    (1100, 32, 4, 16),  # more tiles than a chunk holds
])
def test_route_kernel_equals_the_torch_reference_entry_for_entry(num_tokens, num_experts, top_k, block_m):
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]) \
        if num_tokens else torch.empty(0, top_k, dtype=torch.long)
    if num_tokens == 300:
        ids[:200] = ids[:200] % 3  # uneven: three experts take most pairs (top_k may repeat one: fine here)
    got = moe_route.route_pairs(ids.to(DEVICE), num_experts, block_m,
                                moe.max_tiles(ids.numel(), num_experts, block_m))  # the kernel at any size
    want = moe.route_reference(ids.to(DEVICE), num_experts, block_m)
    for tensor, name in zip(got, ("sorted_pairs", "expert_offsets", "tile_expert", "tile_row_start")):
        assert tensor.dtype == torch.int32, name
        assert torch.equal(tensor.cpu(), getattr(want, name).cpu()), name


def logits_layer(seed, hidden=64, inter=96, num_tokens=9):
    """A 4-expert MXFP4 layer (gate_up, down, their biases), inputs x and router logits for `num_tokens` tokens."""
    gen = torch.Generator().manual_seed(seed)
    (gate_up, _), (down, _) = random_mxfp4(4, hidden, 2 * inter, gen), random_mxfp4(4, inter, hidden, gen)
    biases = torch.randn(4, 2 * inter, generator=gen).to(DEVICE), torch.randn(4, hidden, generator=gen).to(DEVICE)
    x, logits = (torch.randn(num_tokens, n, generator=gen).to(DEVICE) for n in (hidden, 4))
    return gate_up, down, biases, x, logits, gen


def test_past_the_kernels_size_the_moe_routes_and_takes_its_top_k_with_torch(monkeypatch):
    # the same experts, weights and output either way (fp32: the softmax may differ in its last bit at most)
    gate_up, down, biases, x, logits, _ = logits_layer(7)
    kernel = moe.fused_experts_from_logits(x, logits, 2, gate_up, biases[0], down, biases[1], 1.702, 7.0)
    monkeypatch.setattr(moe, "ROUTE_KERNEL_MAX_PAIRS", 8)

    def no_kernel(*args, **kwargs):
        raise AssertionError("the routing kernel ran past its size")

    monkeypatch.setattr(moe, "route_logits", no_kernel)
    monkeypatch.setattr(moe, "route_pairs", no_kernel)
    torch_path = moe.fused_experts_from_logits(x, logits, 2, gate_up, biases[0], down, biases[1], 1.702, 7.0)
    torch.testing.assert_close(torch_path, kernel, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("max_pairs", [moe.ROUTE_KERNEL_MAX_PAIRS, 8])  # the routing kernel, then torch's top-k
def test_the_moe_with_the_next_norm_gives_its_sum_and_that_sums_norm(monkeypatch, max_pairs):
    from engine.kernels import fused

    monkeypatch.setattr(moe, "ROUTE_KERNEL_MAX_PAIRS", max_pairs)
    gate_up, down, biases, x, logits, gen = logits_layer(8)
    residual, weight = torch.randn(9, 64, generator=gen).to(DEVICE), torch.rand(64, generator=gen).to(DEVICE)
    stream, normed = moe.fused_experts_from_logits_norm(x, logits, 2, gate_up, biases[0], down, biases[1], 1.702,
                                                        7.0, 0, residual, weight, 1e-5)
    expected = moe.fused_experts_from_logits(x, logits, 2, gate_up, biases[0], down, biases[1], 1.702, 7.0,
                                             residual=residual)
    assert torch.equal(stream, expected)
    assert torch.equal(normed, fused.rms_norm(expected, weight, 1e-5))


def test_the_engines_moe_takes_the_launch_shape_of_its_tile_height(monkeypatch):
    gate_up, down, biases, x, logits, _ = logits_layer(9, hidden=128)
    run = partial(moe.fused_experts_from_logits, x, logits, 2, gate_up, biases[0], down, biases[1], 1.702, 7.0)
    unsplit = run()
    launched = spy_launches(monkeypatch)
    monkeypatch.setitem(moe.TILES_BY_BLOCK_M, 16, moe.GemmTiles(split_k=2))
    torch.testing.assert_close(run(), unsplit, rtol=1e-5, atol=1e-5)
    assert launched == [moe.GemmTiles(split_k=2)] * 2  # 9 tokens: 16-row tiles
    launched.clear()
    run(block_m=32)  # another height: the default
    run(block_m=16)  # a forced height (a batch-invariant run's, at any step size): the default too
    assert launched == [moe.DEFAULT_TILES] * 4


def test_the_smallest_steps_split_k_and_dense_experts_keep_the_default(monkeypatch):
    gate_up, down, biases, x, logits, _ = logits_layer(10, hidden=128, num_tokens=5)
    args = (gate_up, biases[0], down, biases[1], 1.702, 7.0)
    with monkeypatch.context() as unsplit:
        unsplit.setattr(moe, "SPLIT_K_MAX_PAIRS", 0)
        one_token = moe.fused_experts_from_logits(x[:1], logits[:1], 2, *args)  # 2 pairs, K unsplit
    five_tokens = moe.fused_experts_from_logits(x, logits, 4, *args)  # 20 pairs: past SPLIT_K_MAX_PAIRS
    launched = spy_launches(monkeypatch)
    torch.testing.assert_close(moe.fused_experts_from_logits(x[:1], logits[:1], 2, *args), one_token,
                               rtol=1e-5, atol=1e-5)
    assert launched == [moe.SPLIT_K_TILES] * 2 and moe.SPLIT_K_TILES.split_k > 1
    launched.clear()
    moe.fused_experts_from_logits(x, logits, 4, *args)
    assert launched == [moe.TILES_BY_BLOCK_M[16]] * 2 != [moe.SPLIT_K_TILES] * 2
    launched.clear()
    dense = [moe.ExpertWeight(dense=mxfp4.dequantize(w.blocks.cpu(), w.scales.cpu()).to(DEVICE))
             for w in (gate_up, down)]
    dense_out = moe.fused_experts_from_logits(x, logits, 4, dense[0], biases[0], dense[1], biases[1], 1.702, 7.0)
    assert launched == [moe.DEFAULT_TILES] * 2
    torch.testing.assert_close(dense_out, five_tokens, rtol=1e-5, atol=1e-5)


def spy_launches(monkeypatch) -> list:
    """The launch shape of each grouped GEMM the MoE launches from here on."""
    launched = []
    real_launch = moe._launch
    monkeypatch.setattr(moe, "_launch", lambda *args, tiles, **kw: launched.append(tiles) or real_launch(
        *args, tiles=tiles, **kw))
    return launched


# -- dense expert weights ------------------------------------------------------------------
@pytest.mark.parametrize("num_tokens", [1, 7, 40])
def test_triton_experts_equal_torch_experts_fp32(num_tokens):
    reference = random_experts()
    triton_experts = random_experts(kernels="triton")
    triton_experts.load_state_dict(reference.state_dict())
    x = 4 * torch.randn(num_tokens, 64, device=DEVICE)  # wide enough that the SwiGLU clamps some of it
    ids, weights = routed(num_tokens, seed=num_tokens)
    with torch.inference_mode():
        want, got = reference(x, ids, weights), triton_experts(x, ids, weights)
    assert (x @ reference.gate_up_proj[0]).abs().max() > CONFIG.swiglu_limit
    assert got.dtype == torch.float32 and want.abs().max() > 0.1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_triton_experts_equal_torch_experts_bf16_every_expert_hit():
    reference = random_experts(dtype=torch.bfloat16)
    triton_experts = random_experts(kernels="triton", dtype=torch.bfloat16)
    triton_experts.load_state_dict(reference.state_dict())
    x = torch.randn(24, 64, device=DEVICE, dtype=torch.bfloat16)
    ids, weights = routed(24, experts=(0, 1, 2, 3))
    fp32 = random_experts()
    fp32.load_state_dict({k: v.float() for k, v in reference.state_dict().items()})
    with torch.inference_mode():
        want = fp32(x.float(), ids, weights)
        got, torch_bf16 = triton_experts(x, ids, weights.bfloat16()), reference(x, ids, weights.bfloat16())
    # bf16 rounds in different places on the two paths: each must be as close to fp32 as the other.
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 2 * (torch_bf16.float() - want).abs().max() + 1e-2


# -- MXFP4 expert weights ------------------------------------------------------------------
def packed_experts(reference):
    """A kernels='triton' MXFP4 GptOssExperts holding `reference`'s weights quantised; `reference` gets
    transformers' dequantisation of them."""
    config = ModelConfig.from_hf(tiny_config(quantization_config={"quant_method": "mxfp4"}))
    packed = GptOssExperts(config, "triton").to(DEVICE)
    assert packed.is_mxfp4 and not hasattr(packed, "gate_up_proj")
    for name in ("gate_up_proj", "down_proj"):
        blocks, scales = mxfp4.quantize(getattr(reference, name).detach().cpu())
        getattr(packed, name + "_blocks").copy_(blocks)
        getattr(packed, name + "_scales").copy_(scales)
        getattr(reference, name).data.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
        getattr(packed, name + "_bias").data.copy_(getattr(reference, name + "_bias"))
    return packed


@pytest.mark.parametrize("num_tokens", [3, 40])
def test_mxfp4_triton_experts_equal_torch_experts_on_transformers_dequantised_weights(num_tokens):
    reference = random_experts()
    packed = packed_experts(reference)
    x = torch.randn(num_tokens, 64, device=DEVICE)
    ids, weights = routed(num_tokens, seed=num_tokens)
    with torch.inference_mode():
        want, got = reference(x, ids, weights), packed(x, ids, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # fp32: decoded per element; bf16: dot_scaled
@pytest.mark.parametrize("k", [64, 96])  # 96: a masked last K step
def test_in_kernel_mxfp4_dequantisation_equals_transformers(dtype, k):
    # Identity activations through the down kernel: each output row is one weight row, as dequantised in the kernel.
    num_experts, n = 3, 96
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (num_experts, n, k // 32, 16), dtype=torch.uint8, generator=gen)
    # Every code and a wide range of scales; 0 and 1 give subnormals, which GPUs may flush, so CPU only.
    lowest = 0 if DEVICE == "cpu" else 2
    scales = torch.randint(lowest, 200, (num_experts, n, k // 32), dtype=torch.uint8, generator=gen)
    ids = torch.arange(num_experts).repeat_interleave(k)[:, None].to(DEVICE)
    routing = moe.route(ids, num_experts, 16)
    eye = torch.eye(k, device=DEVICE, dtype=dtype).repeat(num_experts, 1)
    weight = moe.ExpertWeight(blocks=blocks.to(DEVICE), scales=scales.to(DEVICE))
    out = moe.down_weighted(eye, routing, weight, torch.zeros(num_experts, n, device=DEVICE),
                            torch.ones(num_experts * k, device=DEVICE))
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(out.view(num_experts, k, n).cpu(), want)
    assert torch.equal(want, mxfp4.dequantize(blocks, scales))


def random_mxfp4(num_experts, k, n, gen):
    """Random MXFP4 blocks and scales around 2^-4 (weights of magnitude <= 6/16), and their fp32 dequantisation."""
    blocks = torch.randint(0, 256, (num_experts, n, k // 32, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(120, 126, (num_experts, n, k // 32), dtype=torch.uint8, generator=gen)
    return moe.ExpertWeight(blocks=blocks.to(DEVICE), scales=scales.to(DEVICE)), mxfp4.dequantize(blocks, scales)


# packed at 192 slow (~10 s): the default run keeps its empty splits on dense experts and packed ones at 160
@pytest.mark.parametrize(("packed", "inter"), [(False, 192), pytest.param(True, 192, marks=pytest.mark.slow),
                                               (True, 160)])
def test_k_split_between_programs_gives_the_unsplit_result(packed, inter):
    # K = 256 (gate_up) and 192 (down) in steps of 64: split 3 ways the last split of gate_up has no step, split
    # 4 ways down's last has none (it stores zeros, and no bias); 160: down's last step masked. Each split's
    # partial sums add up to the whole
    num_experts, top_k, hidden, num_tokens = 4, 2, 256, 6
    gen = torch.Generator().manual_seed(7)
    if packed:
        (gate_up, _), (down, _) = random_mxfp4(num_experts, hidden, 2 * inter, gen), random_mxfp4(num_experts, inter,
                                                                                                 hidden, gen)
    else:
        gate_up, down = (moe.ExpertWeight(dense=(torch.randn(num_experts, k, n, generator=gen) / k**0.5).to(DEVICE))
                         for k, n in ((hidden, 2 * inter), (inter, hidden)))
    gate_up_bias, down_bias = (torch.randn(num_experts, n, generator=gen).to(DEVICE) for n in (2 * inter, hidden))
    x = (2 * torch.randn(num_tokens, hidden, generator=gen)).to(DEVICE)
    residual = torch.randn(num_tokens, hidden, generator=gen).to(DEVICE)
    ids, weights = routed(num_tokens, seed=3, experts=(0, 1, 2, 3), top_k=top_k)
    results = [moe.fused_experts(x, ids, weights, gate_up, gate_up_bias, down, down_bias, 1.702, 7.0,
                                 residual=residual, tiles=moe.GemmTiles(split_k=split)) for split in (1, 3, 4)]
    assert results[0].abs().max() > 1.0
    for split_result in results[1:]:  # fp32 sums in another order: a few units in the last place of ~1-10
        torch.testing.assert_close(split_result, results[0], rtol=1e-4, atol=1e-4)
        assert not torch.equal(split_result, 0 * results[0])
    assert str(moe.GemmTiles(split_k=4)) == "64x64w4s3k4" and moe.GemmTiles.parse("64x64w4s3k4").split_k == 4
    with pytest.raises(ValueError, match="at least 1"):
        moe.GemmTiles.parse("64x64w4s3k0")


@pytest.mark.parametrize("num_tokens,block_m", [(5, 16), (40, 16), (40, moe.MAX_BLOCK_M)])
def test_scaled_dot_moe_stages_equal_engine_mxfp4_and_torch(num_tokens, block_m):
    # bf16 activations take tl.dot_scaled: each stage equals engine.mxfp4.dequantize + torch in fp32, up to
    # summation order (and gate_up's final rounding to bf16).
    num_experts, top_k, hidden, inter = 4, 2, 64, 96
    gen = torch.Generator().manual_seed(num_tokens)
    gate_up, gate_up_fp32 = random_mxfp4(num_experts, hidden, 2 * inter, gen)
    down, down_fp32 = random_mxfp4(num_experts, inter, hidden, gen)
    gate_up_bias, down_bias = torch.randn(num_experts, 2 * inter, generator=gen), torch.randn(num_experts, hidden,
                                                                                              generator=gen)
    x = (2 * torch.randn(num_tokens, hidden, generator=gen)).bfloat16()
    ids, weights = routed(num_tokens, seed=num_tokens, top_k=top_k)
    routing = moe.route(ids, num_experts, block_m)
    activated = moe.gate_up_swiglu(x.to(DEVICE), routing, top_k, gate_up, gate_up_bias.to(DEVICE), 1.702, 7.0)
    per_pair = moe.down_weighted(activated, routing, down, down_bias.to(DEVICE), weights.reshape(-1))

    rows = routing.sorted_pairs.long().cpu()  # sorted row -> pair
    experts = ids.reshape(-1).cpu()[rows]
    h = torch.einsum("rk,rkn->rn", x.float()[rows // top_k], gate_up_fp32[experts]) + gate_up_bias[experts]
    gate, up = h[:, ::2].clamp(max=7.0), h[:, 1::2].clamp(-7.0, 7.0)
    want_activated = (up + 1) * gate * torch.sigmoid(1.702 * gate)
    assert want_activated.abs().max() > 1.0 and (h[:, ::2] > 7.0).any()  # wide enough to clamp
    torch.testing.assert_close(activated.cpu().float(), want_activated.bfloat16().float(), rtol=2**-7, atol=1e-3)
    y = torch.einsum("rk,rkn->rn", activated.cpu().float(), down_fp32[experts]) + down_bias[experts]
    want_per_pair = torch.zeros_like(y).index_copy_(0, rows, y * weights.reshape(-1).cpu()[rows, None])
    torch.testing.assert_close(per_pair.cpu(), want_per_pair, rtol=1e-5, atol=1e-5)


# -- the model --------------------------------------------------------------------------
def one_sequence_logits(model, config, dtype, num_tokens=20):
    """The logits of one sequence of `num_tokens` seeded tokens (over two cache blocks) through `model`."""
    from engine.attention import AttentionMetadata
    from engine.model import allocate_kv_cache

    ids = torch.randint(0, config.vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(0))
    meta = AttentionMetadata(
        positions=torch.arange(num_tokens, device=DEVICE), slot_mapping=torch.arange(num_tokens, device=DEVICE),
        query_start_loc=torch.tensor([0, num_tokens], device=DEVICE),
        seq_lens=torch.tensor([num_tokens], device=DEVICE), block_tables=torch.tensor([[0, 1]], device=DEVICE),
        block_size=16)
    with torch.inference_mode():
        return model.compute_logits(model(ids.to(DEVICE), meta, allocate_kv_cache(config, 2, 16, dtype, DEVICE)))


def test_triton_model_keeps_mxfp4_experts_packed_and_matches_the_torch_model(mxfp4_model_dir):
    from engine.loader import load_model

    packed, config = load_model(EngineConfig(mxfp4_model_dir, device=DEVICE, kernels="triton"))
    dequantised, _ = load_model(EngineConfig(mxfp4_model_dir, device=DEVICE, moe_weights="dense"))
    params = dict(packed.named_parameters())
    assert params["model.layers.0.mlp.experts.down_proj_blocks"].dtype == torch.uint8
    assert not any(name.endswith(("gate_up_proj", "down_proj")) for name in params)
    logits = [one_sequence_logits(model, config, torch.float32) for model in (packed, dequantised)]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_dense_moe_weights_hold_the_experts_dequantised_in_the_models_dtype(mxfp4_model_dir):
    from engine.loader import load_model

    model, _ = load_model(EngineConfig(mxfp4_model_dir, dtype="bfloat16", device=DEVICE, kernels="triton",
                                       moe_weights="dense"))
    experts = model.model.layers[0].mlp.experts
    assert experts.triton_moe is not None and not experts.is_mxfp4
    assert not any(name.endswith(("_blocks", "_scales")) for name, _ in model.named_parameters())
    checkpoint = load_file(mxfp4_model_dir / "model.safetensors")
    name = "model.layers.0.mlp.experts.down_proj"
    want = mxfp4.dequantize(checkpoint[name + "_blocks"], checkpoint[name + "_scales"], torch.bfloat16)
    assert experts.down_proj.dtype == torch.bfloat16 and torch.equal(experts.down_proj.cpu(), want)


@pytest.mark.slow  # ~17 s interpreted; the default run keeps each weight form's MoE against the torch path's (above)
def test_dense_and_packed_moe_weights_decode_the_torch_paths_tokens(mxfp4_model_dir):
    from engine.api import SamplingParams
    from engine.llm_engine import LLMEngine
    from tests.engine.test_llm_engine import decode, prompt

    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = {"r0": prompt(0, 3), "r1": prompt(1, 20)}
    tokens = {}
    for kernels, moe_weights in (("torch", "dense"), ("torch", "auto"), ("triton", "dense"), ("triton", "auto")):
        llm = LLMEngine(EngineConfig(mxfp4_model_dir, dtype="float32", device=DEVICE, kv_cache_gb=0.01,
                                     kernels=kernels, moe_weights=moe_weights))
        experts = llm.runner.model.model.layers[0].mlp.experts
        assert experts.is_mxfp4 == (moe_weights == "auto")  # auto keeps them packed, on either path
        tokens[kernels, moe_weights] = decode(llm, prompts, greedy)
        del llm  # on CUDA the next engine's cache is sized from free memory: this one's must be gone
    assert len(set(map(str, tokens.values()))) == 1, tokens


def test_moe_weights_are_checked():
    with pytest.raises(ValueError, match="unknown moe_weights 'bf8'"):
        EngineConfig("unused", moe_weights="bf8")
    assert EngineConfig("unused", kernels="torch", moe_weights="mxfp4").moe_weights == "mxfp4"  # torch holds packed too


# -- the 20b shape, natively -------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mxfp4_moe_at_the_20b_shape_on_gpu():
    config = ModelConfig.from_hf(tiny_config(hidden_size=2880, intermediate_size=2880, num_local_experts=32,
                                             num_experts_per_tok=4))
    reference = random_experts(config, dtype=torch.bfloat16)
    quantised = ModelConfig.from_hf(tiny_config(hidden_size=2880, intermediate_size=2880, num_local_experts=32,
                                                num_experts_per_tok=4, quantization_config={"quant_method": "mxfp4"}))
    packed = GptOssExperts(quantised, "triton").to(DEVICE)
    for name in ("gate_up_proj", "down_proj"):
        blocks, scales = mxfp4.quantize(getattr(reference, name).detach().float())
        getattr(packed, name + "_blocks").copy_(blocks)
        getattr(packed, name + "_scales").copy_(scales)
        getattr(reference, name).data.copy_(mxfp4.dequantize(blocks, scales, torch.bfloat16))
        getattr(packed, name + "_bias").data.copy_(getattr(reference, name + "_bias"))
    inputs = []
    for num_tokens in (1, 64, 2048):
        x = torch.randn(num_tokens, 2880, device=DEVICE, dtype=torch.bfloat16)
        ids, weights = routed(num_tokens, experts=tuple(range(0, 32, 2)), top_k=4)
        with torch.inference_mode():
            want, got = reference(x, ids, weights.bfloat16()), packed(x, ids, weights.bfloat16())
        assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max() + 0.02
        inputs.append((x, ids, weights.bfloat16(), got))
    # re-packed as words (engine.mxfp4_words), the kernels' own PTX decode gives what tl.dot_scaled's did
    assert packed.pack_words() == 2
    for x, ids, weights, from_blocks in inputs:
        with torch.inference_mode():
            from_words = packed(x, ids, weights)
        torch.testing.assert_close(from_words.float(), from_blocks.float(), rtol=2e-2, atol=2e-2)


def test_triton_experts_trace_in_one_graph():
    # moe_experts is one custom op: a decode forward with the Triton MoE can be captured whole.
    triton_experts = random_experts(kernels="triton")
    x = torch.randn(5, 64, device=DEVICE)
    ids, weights = routed(5)
    with torch.inference_mode():
        traced = torch.compile(triton_experts.forward, fullgraph=True, backend="eager")(x, ids, weights)
        torch.testing.assert_close(traced, triton_experts(x, ids, weights), rtol=0, atol=0)


def test_time_routing_times_the_kernel_and_torch_at_each_size():
    rows = moe.time_routing(DEVICE, (1, 5), num_experts=8, top_k=2, repeats=2)
    assert [row[0] for row in rows] == [1, 5] and all(us > 0 for row in rows for us in row[1:])
