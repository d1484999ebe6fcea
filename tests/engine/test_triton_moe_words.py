"""The Triton MoE on experts re-packed as words (engine.mxfp4_words), against the same experts as blocks.

Without CUDA the kernels run in Triton's interpreter, which decodes the words with Triton's own operations (the
PTX of a GPU is checked in test_mxfp4_words); with CUDA the same tests run the PTX.
"""

import pytest
import torch

from engine import mxfp4, mxfp4_words
from engine.config import EngineConfig
from engine.kernels import require_triton, triton_available

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)  # CPU: the interpreter, chosen before triton is first imported
from engine.kernels import moe  # noqa: E402


def experts_as_blocks_and_words(num_experts, k, n, gen, scale_bytes=False):
    """Random MXFP4 experts [E, in=k, out=n] (scales around 2^-4) as blocks and as words (with scale words, or
    with the checkpoint's scale bytes); their fp32 values."""
    blocks = torch.randint(0, 256, (num_experts, n, k // 32, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(120, 126, (num_experts, n, k // 32), dtype=torch.uint8, generator=gen)
    as_blocks = moe.ExpertWeight(blocks=blocks.to(DEVICE), scales=scales.to(DEVICE))
    as_words = moe.ExpertWeight(blocks=mxfp4_words.pack(blocks).to(DEVICE),
                                scales=(scales if scale_bytes else mxfp4_words.pack_scales(scales)).to(DEVICE))
    return as_blocks, as_words, mxfp4.dequantize(blocks, scales)


@(pytest.mark.gpu if DEVICE == "cuda" else lambda test: test)  # the GPU check runs it natively: the PTX
@pytest.mark.parametrize("num_tokens,block_m,tiles,hidden,inter", [
    (5, 16, "64x64w4s3", 192, 64), (40, 16, "64x64w2s3", 192, 64), (40, moe.MAX_BLOCK_M, "64x64w4s3", 192, 64),
    (3, 16, "64x64w4s3k4", 192, 64),
    (9, 16, "128x64w8s3", 192, 64),  # 128 columns a block: down's 192 leave the second block half masked
    (7, 16, "64x128w4s3", 256, 128), (4, 16, "64x128w4s3k2", 256, 128),  # two chunks a K step
    # K 192 and 64 in steps of 128: a step and a chunk left over, and no whole step at all (split 2 ways: the
    # second split of down starts past K)
    (6, 16, "64x128w4s3", 192, 64), (5, 16, "64x128w4s3k2", 192, 64), (3, 16, "64x256w4s3", 192, 64),
    (4, 16, "64x256w4s3", 256, 256)])  # two scale words a step
@pytest.mark.parametrize("scale_bytes", [False, True], ids=["scale-words", "scale-bytes"])
def test_words_give_the_moe_of_the_same_experts_as_blocks(num_tokens, block_m, tiles, hidden, inter, scale_bytes):
    num_experts, top_k = 4, 2  # K = hidden and inter: whole chunks of 64
    gen = torch.Generator().manual_seed(num_tokens)
    gate_up, gate_up_words, gate_up_fp32 = experts_as_blocks_and_words(num_experts, hidden, 2 * inter, gen,
                                                                       scale_bytes)
    down, down_words, _ = experts_as_blocks_and_words(num_experts, inter, hidden, gen, scale_bytes)
    gate_up_bias = torch.randn(num_experts, 2 * inter, generator=gen).to(DEVICE)
    down_bias = torch.randn(num_experts, hidden, generator=gen).to(DEVICE)
    x = (2 * torch.randn(num_tokens, hidden, generator=gen)).bfloat16().to(DEVICE)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]).to(DEVICE)
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), -1).to(DEVICE)
    routing = moe.route(ids, num_experts, block_m)
    shape = moe.GemmTiles.parse(tiles)
    activated, per_pair = [], []
    for w_gate_up, w_down in ((gate_up, down), (gate_up_words, down_words)):
        activated.append(moe.gate_up_swiglu(x, routing, top_k, w_gate_up, gate_up_bias, 1.702, 7.0, shape))
        per_pair.append(moe.down_weighted(activated[0], routing, w_down, down_bias, weights.reshape(-1), shape))
    # the same weights, decoded exactly either way: only the order of the fp32 sums differs
    torch.testing.assert_close(activated[1].float(), activated[0].float(), rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(per_pair[1], per_pair[0], rtol=1e-4, atol=1e-4)
    assert activated[1].abs().max() > 1.0 and per_pair[1].abs().max() > 1.0
    # and equal to the fp32 reference
    rows = routing.sorted_pairs.long().cpu()
    experts = ids.reshape(-1).cpu()[rows]
    h = torch.einsum("rk,rkn->rn", x.cpu().float()[rows // top_k], gate_up_fp32[experts]) + gate_up_bias.cpu()[experts]
    gate, up = h[:, ::2].clamp(max=7.0), h[:, 1::2].clamp(-7.0, 7.0)
    want = (up + 1) * gate * torch.sigmoid(1.702 * gate)
    torch.testing.assert_close(activated[1].cpu().float(), want.bfloat16().float(), rtol=2**-7, atol=1e-3)


def test_words_refuse_what_their_decode_cannot_take():
    gen = torch.Generator().manual_seed(0)
    gate_up, gate_up_words, _ = experts_as_blocks_and_words(2, 64, 128, gen)
    down, down_words, _ = experts_as_blocks_and_words(2, 64, 64, gen)
    bias_up, bias_down = torch.zeros(2, 128, device=DEVICE), torch.zeros(2, 64, device=DEVICE)
    ids, weights = torch.zeros(3, 1, dtype=torch.long, device=DEVICE), torch.ones(3, 1, device=DEVICE)
    for x, tiles in ((torch.randn(3, 64, device=DEVICE), moe.DEFAULT_TILES),  # fp32 activations
                     (torch.randn(3, 64, device=DEVICE).bfloat16(), moe.GemmTiles.parse("64x32w4s3")),  # half a chunk
                     (torch.randn(3, 64, device=DEVICE).bfloat16(), moe.GemmTiles.parse("64x512w4s3"))):  # 4 words
        with pytest.raises(ValueError, match="MXFP4 words take bf16 activations"):
            moe.fused_experts(x, ids, weights, gate_up_words, bias_up, down_words, bias_down, 1.702, 7.0,
                              tiles=tiles)
    with pytest.raises(ValueError, match="take scale words"):  # 2 scale words a row for 1
        moe.ExpertWeight(blocks=gate_up_words.blocks, scales=gate_up_words.scales.repeat(1, 1, 2))
    with pytest.raises(ValueError, match="take scale words"):  # the scale bytes as int32
        moe.ExpertWeight(blocks=gate_up_words.blocks, scales=gate_up.scales.int())


@(pytest.mark.gpu if DEVICE == "cuda" else lambda test: test)
def test_words_decode_every_code_at_every_scale_they_take():
    # one expert whose rows hold every code in every place (a random permutation of 4 x 16 codes a row) at scales
    # 2^(n - 127) and 2^(128 - n - 127) for row n's two groups: the MoE of one-hot tokens through it reads back
    # the weights, exactly, for every code and scale the PTX decodes
    rows = mxfp4_words.MAX_SCALE + 1
    gen = torch.Generator().manual_seed(5)
    codes = torch.stack([torch.randperm(64, generator=gen) % 16 for _ in range(rows)])  # [rows, 64]
    blocks = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8).reshape(1, rows, 2, 16)
    scales = torch.stack([torch.arange(rows), rows - 1 - torch.arange(rows)], dim=-1).to(torch.uint8)[None]
    weight = moe.ExpertWeight(blocks=mxfp4_words.pack(blocks).to(DEVICE),
                              scales=mxfp4_words.pack_scales(scales).to(DEVICE))
    routing = moe.route(torch.zeros(64, 1, dtype=torch.long, device=DEVICE), 1, 64)
    x = torch.eye(64, dtype=torch.bfloat16, device=DEVICE)  # token i reads input i of every row
    out = moe.down_weighted(x, routing, weight, torch.zeros(1, rows, device=DEVICE), torch.ones(64, device=DEVICE))
    want = mxfp4.dequantize(blocks, scales)[0]  # [in = 64, out = rows]
    assert torch.equal(out.cpu(), want)


@(pytest.mark.gpu if DEVICE == "cuda" else lambda test: test)
@pytest.mark.parametrize("tiles", ["64x64w4s3", "64x128w4s3", "64x256w4s3"])
def test_scale_bytes_with_the_top_bit_set_in_any_byte_of_a_scale_word(tiles):
    # 128 (2^1, the largest scale the words take) has its top bit set: in a scale word's top byte an arithmetic
    # shift right brings it along as a sign, which the kernel must mask off. 256 inputs: 2 scale words a row, every
    # group's scale 126..128, read back through one-hot tokens at K steps of 64, 128 and 256
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (64, 256), generator=gen)
    blocks = (codes[:, 0::2] | codes[:, 1::2] << 4).to(torch.uint8).reshape(1, 64, 8, 16)
    scales = torch.randint(126, 129, (1, 64, 8), dtype=torch.uint8, generator=gen)
    scales[0, :, 3] = scales[0, :, 7] = 128  # each word's top byte
    weight = moe.ExpertWeight(blocks=mxfp4_words.pack(blocks).to(DEVICE),
                              scales=mxfp4_words.pack_scales(scales).to(DEVICE))
    routing = moe.route(torch.zeros(256, 1, dtype=torch.long, device=DEVICE), 1, 64)
    x = torch.eye(256, dtype=torch.bfloat16, device=DEVICE)  # token i reads input i of every row
    out = moe.down_weighted(x, routing, weight, torch.zeros(1, 64, device=DEVICE), torch.ones(256, device=DEVICE),
                            moe.GemmTiles.parse(tiles))
    assert torch.equal(out.cpu(), mxfp4.dequantize(blocks, scales)[0])


# -- the model ---------------------------------------------------------------------------------------------------
def test_a_bf16_triton_model_loads_its_experts_as_words_and_decodes_as_with_blocks(mxfp4_model_dir, monkeypatch):
    from engine.loader import load_model
    from engine.model import GptOssModel
    from tests.engine.test_triton_moe import one_sequence_logits

    config = EngineConfig(mxfp4_model_dir, device=DEVICE, kernels="triton", dtype="bfloat16")
    words_model, model_config = load_model(config)
    params = dict(words_model.named_parameters())
    assert params["model.layers.0.mlp.experts.gate_up_proj_blocks"].dtype == torch.int32
    assert params["model.layers.1.mlp.experts.down_proj_blocks"].dtype == torch.int32
    monkeypatch.setattr(GptOssModel, "pack_expert_words", lambda self: 0)
    blocks_model, _ = load_model(config)
    assert dict(blocks_model.named_parameters())["model.layers.0.mlp.experts.down_proj_blocks"].dtype == torch.uint8
    torch_model, _ = load_model(EngineConfig(mxfp4_model_dir, device=DEVICE, dtype="bfloat16"))
    logits = [one_sequence_logits(model, model_config, torch.bfloat16) for model in (words_model, blocks_model)]
    torch.testing.assert_close(logits[0], logits[1], rtol=2e-2, atol=2e-2)
    assert logits[0].argmax(-1).eq(logits[1].argmax(-1)).float().mean() > 0.9
    # the torch path reads words too: each expert's weight decoded back to the same values
    experts_words = words_model.decoder_layers[0].mlp.experts
    experts_torch = torch_model.decoder_layers[0].mlp.experts
    for name in ("gate_up_proj", "down_proj"):
        assert torch.equal(experts_words._expert_weight(name, 1, torch.float32),
                           experts_torch._expert_weight(name, 1, torch.float32))


def test_experts_keep_blocks_where_a_scale_is_past_what_words_take(mxfp4_model_dir):
    from engine.loader import load_model

    model, _ = load_model(EngineConfig(mxfp4_model_dir, device=DEVICE, kernels="triton", dtype="bfloat16"))
    experts = model.decoder_layers[0].mlp.experts
    # a fresh layer with blocks, one scale byte above MAX_SCALE in down only: gate_up is re-packed, down is not
    experts.gate_up_proj_blocks = torch.nn.Parameter(mxfp4_words.unpack(experts.gate_up_proj_blocks.data),
                                                     requires_grad=False)
    experts.down_proj_blocks = torch.nn.Parameter(mxfp4_words.unpack(experts.down_proj_blocks.data),
                                                  requires_grad=False)
    for name, blocks in (("gate_up_proj", experts.gate_up_proj_blocks), ("down_proj", experts.down_proj_blocks)):
        scales = mxfp4_words.unpack_scales(getattr(experts, name + "_scales").data, blocks.shape[2])
        setattr(experts, name + "_scales", torch.nn.Parameter(scales, requires_grad=False))
    experts.down_proj_scales.data[0, 0, 0] = mxfp4_words.MAX_SCALE + 1
    assert experts.pack_words() == 1
    assert experts.gate_up_proj_blocks.dtype == torch.int32 and experts.down_proj_blocks.dtype == torch.uint8
    assert experts.gate_up_proj_scales.dtype == torch.int32 and experts.down_proj_scales.dtype == torch.uint8
    assert experts.pack_words() == 0  # already words, or never


def test_blocks_that_are_no_contiguous_tensor_are_re_packed_out_of_place(mxfp4_model_dir):
    from engine.loader import load_model

    model, _ = load_model(EngineConfig(mxfp4_model_dir, device=DEVICE, kernels="triton", dtype="bfloat16"))
    experts = model.decoder_layers[0].mlp.experts
    blocks = mxfp4_words.unpack(experts.gate_up_proj_blocks.data)
    # every expert one view of expert 0's bytes (stride 0): in place, each expert's packing would clobber the next
    shared = blocks[:1].expand_as(blocks)
    experts.gate_up_proj_blocks = torch.nn.Parameter(shared, requires_grad=False)
    experts.down_proj_blocks = torch.nn.Parameter(mxfp4_words.unpack(experts.down_proj_blocks.data),
                                                  requires_grad=False)
    for name, blocks in (("gate_up_proj", experts.gate_up_proj_blocks), ("down_proj", experts.down_proj_blocks)):
        scales = mxfp4_words.unpack_scales(getattr(experts, name + "_scales").data, blocks.shape[2])
        setattr(experts, name + "_scales", torch.nn.Parameter(scales, requires_grad=False))
    assert experts.pack_words() == 2
    assert torch.equal(experts.gate_up_proj_blocks, mxfp4_words.pack(shared.contiguous()))
    assert torch.equal(mxfp4_words.unpack(experts.gate_up_proj_blocks.data), shared)
