"""engine.kernels.moe_gemv: the MoE of the smallest steps as a program per (token, expert) pair, on words.

Without CUDA the kernel runs in Triton's interpreter (the words decoded by Triton's own operations); with CUDA the
same tests run the PTX.
"""

import pytest
import torch

from engine.kernels import require_triton, triton_available

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)  # CPU: the interpreter, chosen before triton is first imported
from engine.kernels import moe, moe_gemv  # noqa: E402
from tests.engine.test_triton_moe_words import experts_as_blocks_and_words  # noqa: E402

ALPHA, LIMIT = 1.702, 7.0
on_gpu = pytest.mark.gpu if DEVICE == "cuda" else (lambda test: test)  # the GPU check runs it natively: the PTX


def small_moe(num_tokens, hidden, inter, seed, scale_bytes=False, num_experts=4, top_k=2):
    """Random MXFP4 experts as blocks and as words, biases, bf16 tokens, their experts (tokens share some) and
    router weights, and the MoE's fp32 reference: (words, blocks, inputs, reference)."""
    gen = torch.Generator().manual_seed(seed)
    gate_up, gate_up_words, gate_up_fp32 = experts_as_blocks_and_words(num_experts, hidden, 2 * inter, gen,
                                                                       scale_bytes)
    down, down_words, down_fp32 = experts_as_blocks_and_words(num_experts, inter, hidden, gen, scale_bytes)
    gate_up_bias, down_bias = torch.randn(num_experts, 2 * inter, generator=gen), torch.randn(num_experts, hidden,
                                                                                              generator=gen)
    x = (2 * torch.randn(num_tokens, hidden, generator=gen)).bfloat16()
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), -1).bfloat16()
    # the reference in fp32, the activations rounded to bf16 between the projections as the kernels store them
    experts = ids.reshape(-1)
    h = torch.einsum("pk,pkn->pn", x.float().repeat_interleave(top_k, 0), gate_up_fp32[experts]) + gate_up_bias[experts]
    gate, up = h[:, ::2].clamp(max=LIMIT), h[:, 1::2].clamp(-LIMIT, LIMIT)
    activated = ((up + 1) * gate * torch.sigmoid(ALPHA * gate)).bfloat16().float()
    per_pair = torch.einsum("pk,pkn->pn", activated, down_fp32[experts]) + down_bias[experts]
    reference = (per_pair * weights.float().reshape(-1, 1)).reshape(num_tokens, top_k, hidden).sum(1)
    inputs = [t.to(DEVICE) for t in (x, ids, weights, gate_up_bias, down_bias)]
    return (gate_up_words, down_words), (gate_up, down), inputs, reference


def run(experts, inputs, tiles):
    x, ids, weights, gate_up_bias, down_bias = inputs
    gate_up, down = experts
    return moe.fused_experts(x, ids, weights, gate_up, gate_up_bias, down, down_bias, ALPHA, LIMIT,
                             tiles=moe.GemmTiles.parse(tiles) if isinstance(tiles, str) else tiles)


@on_gpu
@pytest.mark.parametrize("num_tokens,tiles,hidden,inter,scale_bytes,top_k", [
    (1, "gemv16x128w4s1", 192, 64, False, 2),  # K 192 in steps of 128: a step and a chunk left over
    (3, "gemv16x256w4s1", 192, 64, False, 2),  # no whole step at all: chunks only
    (2, "gemv32x256w4s1", 256, 128, False, 2),  # two scale words a step
    (2, "gemv128x64w4s1", 192, 64, False, 2),  # down's 192 columns: the second block half masked
    (3, "gemv16x128w2s1", 192, 64, True, 2),  # the checkpoint's scale bytes
    (2, "gemv16x64w4s1", 64, 64, False, 1), (3, "gemv16x64w4s1", 64, 64, False, 3),  # other experts a token
])
def test_the_gemv_gives_the_moe_of_the_reference_and_of_the_gemm(num_tokens, tiles, hidden, inter, scale_bytes,
                                                                   top_k):
    words, _, inputs, reference = small_moe(num_tokens, hidden, inter, num_tokens + hidden, scale_bytes, top_k=top_k)
    if top_k == 3:  # the routing kernel's expert ids are int32 (engine.kernels.moe_route)
        inputs[1] = inputs[1].int()
    gemv = run(words, inputs, tiles)
    gemm = run(words, inputs, "64x64w4s3")
    assert gemv.dtype == torch.bfloat16 and gemv.shape == reference.shape
    assert reference.abs().max() > 10.0  # the weights' scales leave the output well away from zero
    # bf16 out (a step of 1 at the largest outputs): sums in another order round to within a step or two of each
    # other, and of the fp32 reference
    step = float(reference.abs().max()) * 2**-7
    torch.testing.assert_close(gemv.cpu().float(), reference, rtol=2**-7, atol=step)
    torch.testing.assert_close(gemv.cpu().float(), gemm.cpu().float(), rtol=2**-7, atol=step)


@on_gpu
def test_the_engine_takes_the_gemv_up_to_gemv_max_pairs_on_words_only(monkeypatch):
    words, blocks, (x, ids, _, gate_up_bias, down_bias), _ = small_moe(2, 192, 64, seed=7)
    logits = torch.randn(2, 4, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    launched = []
    real_launch = moe_gemv.gemv_launch
    monkeypatch.setattr(moe_gemv, "gemv_launch", lambda *args, **kwargs: launched.append(kwargs["block_n"])
                        or real_launch(*args, **kwargs))

    def from_logits(experts):
        return moe.fused_experts_from_logits(x, logits, 2, experts[0], gate_up_bias, experts[1], down_bias, ALPHA,
                                             LIMIT)

    assert moe.GEMV_MAX_PAIRS == 0  # off until a GPU times it faster than the K split (engine.kernels.moe_tiles)
    gemm = from_logits(words)
    assert launched == []
    monkeypatch.setattr(moe, "GEMV_MAX_PAIRS", 4)  # 2 tokens x top 2
    gemv = from_logits(words)
    assert launched == [moe.GEMV_TILES.block_n] * 2  # gate_up, then down
    torch.testing.assert_close(gemv.float(), gemm.float(), rtol=2**-7, atol=float(gemm.abs().max()) * 2**-7)
    from_logits(blocks)  # the checkpoint's blocks: the GEMM
    assert len(launched) == 2
    monkeypatch.setattr(moe, "GEMV_MAX_PAIRS", 3)  # 4 pairs: past it
    from_logits(words)
    assert len(launched) == 2
    # a batch-invariant run's forced tile height keeps one launch shape at every step size: never the gemv
    monkeypatch.setattr(moe, "GEMV_MAX_PAIRS", 4)
    moe.fused_experts_from_logits(x, logits, 2, words[0], gate_up_bias, words[1], down_bias, ALPHA, LIMIT,
                                  block_m=moe.INVARIANT_BLOCK_M)
    assert len(launched) == 2
    assert moe.tiles_for(16, 4, words=True) == moe.GEMV_TILES and moe.tiles_for(16, 4) == moe.SPLIT_K_TILES
    assert moe.tiles_for(16, 0, words=True) == moe.SPLIT_K_TILES  # no pairs: nothing to launch either way


def test_the_gemv_refuses_what_it_cannot_take():
    words, blocks, inputs, _ = small_moe(1, 64, 64, seed=3)
    with pytest.raises(ValueError, match="matrix-vector kernel .* takes experts held as MXFP4 words"):
        run(blocks, inputs, "gemv16x64w4s1")
    x, *rest = inputs
    with pytest.raises(ValueError, match="matrix-vector kernel .* bf16 activations"):
        run(words, [x.float(), *rest], "gemv16x64w4s1")
    with pytest.raises(ValueError, match="K steps of a multiple of 64 up to 256"):
        run(words, inputs, "gemv16x512w4s1")
    with pytest.raises(ValueError, match="does not split K"):
        moe.GemmTiles.parse("gemv16x256w4s1k2")
    with pytest.raises(ValueError, match="does not split K"):
        run(words, inputs, moe.GemmTiles(16, 64, 4, 1, split_k=2, gemv=True))
    assert str(moe.GEMV_TILES) == "gemv16x256w4s1" and moe.GemmTiles.parse("gemv16x256w4s1").gemv
    assert not moe.GemmTiles.parse("16x256w4s1").gemv
