"""load_model and ModelConfig: dtypes, shards, MXFP4 experts, clear errors, and the real model sizes."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GptOssForCausalLM
from transformers.integrations.mxfp4 import FP4_VALUES, convert_moe_packed_tensors

from engine.attention import AttentionMetadata
from engine.api import ModelLoadError
from engine.config import EngineConfig, ModelConfig, held_model_config
from engine.loader import dequantize_mxfp4, load_model
from engine.model import GptOssModel, allocate_kv_cache, kv_cache_bytes_per_block

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def copy_checkpoint(src, dst, tensors=None, config_update=None):
    """A copy of checkpoint src in dst, optionally with other tensors or config fields."""
    shutil.copytree(src, dst)
    if tensors is not None:
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    if config_update:
        config = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**config, **config_update}))
    return dst


# -- dtypes and layout ----------------------------------------------------------
def test_loads_every_tensor_exactly_in_the_checkpoint_dtype(tiny_model_dir):
    model, config = load_model(EngineConfig(tiny_model_dir))
    state = load_file(tiny_model_dir / "model.safetensors")
    params = dict(model.named_parameters())
    assert set(params) == set(state)
    for name, tensor in state.items():
        assert params[name].dtype == torch.float32 and params[name].device.type == "cpu"
        assert torch.equal(params[name], tensor), name
    assert config.num_hidden_layers == 2 and config.is_sliding(0) and not config.is_sliding(1)


def test_dtype_option_builds_the_model_in_that_dtype(tiny_model_dir, tiny_model_dir_bf16):
    model, _ = load_model(EngineConfig(tiny_model_dir, dtype="bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model, config = load_model(EngineConfig(tiny_model_dir_bf16))  # "auto": the checkpoint's
    assert config.torch_dtype == torch.bfloat16 and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32  # restored after the build


def test_sharded_checkpoint_loads_like_one_file(tiny_model_dir, tmp_path):
    state = load_file(tiny_model_dir / "model.safetensors")
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    sharded = copy_checkpoint(tiny_model_dir, tmp_path / "sharded")
    (sharded / "model.safetensors").unlink()
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, sharded / file, metadata={"format": "pt"})
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    model, _ = load_model(EngineConfig(sharded))
    for name, param in model.named_parameters():
        assert torch.equal(param, state[name]), name


# -- errors ------------------------------------------------------------------------
def test_missing_unexpected_and_misshapen_tensors_are_clear_errors(tiny_model_dir, tmp_path):
    state = load_file(tiny_model_dir / "model.safetensors")
    missing = {k: v for k, v in state.items() if k != "model.layers.1.self_attn.sinks"}
    with pytest.raises(ModelLoadError, match="missing.*model.layers.1.self_attn.sinks"):
        load_model(EngineConfig(copy_checkpoint(tiny_model_dir, tmp_path / "missing", missing)))
    extra = {**state, "model.layers.0.mlp.bogus": torch.zeros(2)}
    with pytest.raises(ModelLoadError, match="unexpected tensor 'model.layers.0.mlp.bogus'"):
        load_model(EngineConfig(copy_checkpoint(tiny_model_dir, tmp_path / "extra", extra)))
    narrow = copy_checkpoint(tiny_model_dir, tmp_path / "shape", config_update={"hidden_size": 32})
    with pytest.raises(ModelLoadError, match=r"lm_head.weight has shape \(201088, 64\), the config gives \(201088, 32"):
        load_model(EngineConfig(narrow))


def test_not_a_checkpoint_is_a_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(ModelLoadError, match="not a directory"):
        load_model(EngineConfig(tmp_path / "nowhere"))
    llama = copy_checkpoint(tiny_model_dir, tmp_path / "llama", config_update={"model_type": "llama"})
    with pytest.raises(ModelLoadError, match="expected 'gpt_oss'"):
        load_model(EngineConfig(llama))
    broken = copy_checkpoint(tiny_model_dir, tmp_path / "broken")
    (broken / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    with pytest.raises(ModelLoadError, match="missing.*gone.safetensors"):
        load_model(EngineConfig(broken))


def test_engine_config_rejects_bad_knobs(tiny_model_dir):
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig(tiny_model_dir, block_size=0)
    with pytest.raises(ValueError, match="unknown dtype"):
        EngineConfig(tiny_model_dir, dtype="int3").resolve_dtype(ModelConfig.from_pretrained(tiny_model_dir))


# -- MXFP4 ---------------------------------------------------------------------------
def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Model-layout weight [E, in, out] -> checkpoint blocks [E, out, in/32, 16] uint8, scales [E, out, in/32].

    Each group of 32 inputs gets the power-of-two scale that brings its largest magnitude to <= 6
    (e8m0, biased by 127); each value becomes the nearest e2m1 code, two codes per byte, low nibble first.
    """
    w = weight.transpose(1, 2).float()  # [E, out, in]
    groups = w.reshape(*w.shape[:2], -1, 32)
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=2.0**-126) / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    magnitudes = torch.tensor(FP4_VALUES[:8])
    codes = (scaled.abs()[..., None] - magnitudes).abs().argmin(-1) + 8 * (scaled < 0)  # [E, out, G, 32]
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (exponent + 127).to(torch.uint8)


@pytest.fixture(scope="module")
def mxfp4_dirs(tiny_model_dir, tmp_path_factory):
    """(an MXFP4 checkpoint of the tiny model, the same weights dequantised by transformers, blocks/scales)."""
    state = load_file(tiny_model_dir / "model.safetensors")
    quantised, dequantised, packed = {}, dict(state), {}
    for name, tensor in state.items():
        if name.rsplit(".", 1)[-1] in EXPERT_WEIGHTS:
            blocks, scales = quantize_mxfp4(tensor)
            quantised[name + "_blocks"], quantised[name + "_scales"] = blocks, scales
            dequantised[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            packed[name] = (blocks, scales)
        else:
            quantised[name] = tensor
    root = tmp_path_factory.mktemp("mxfp4")
    mxfp4 = copy_checkpoint(tiny_model_dir, root / "mxfp4", quantised, config_update={"quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}})
    return mxfp4, copy_checkpoint(tiny_model_dir, root / "dequantised", dequantised), packed


def test_mxfp4_dequantisation_equals_transformers(mxfp4_dirs):
    mxfp4_dir, _, packed = mxfp4_dirs
    model, config = load_model(EngineConfig(mxfp4_dir, moe_weights="dense"))  # dequantised on load
    assert config.quant_method == "mxfp4"
    params = dict(model.named_parameters())
    for name, (blocks, scales) in packed.items():
        want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert torch.equal(params[name], want), name
        assert torch.equal(dequantize_mxfp4(blocks, scales, torch.bfloat16), want.bfloat16())  # exact in bf16 too


def test_mxfp4_quantiser_in_this_test_is_faithful():
    weight = torch.randn(2, 64, 8)
    blocks, scales = quantize_mxfp4(weight)
    assert blocks.shape == (2, 8, 2, 16) and scales.shape == (2, 8, 2)
    back = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert back.shape == weight.shape
    assert ((back - weight).abs() <= weight.abs().amax() / 4).all()  # e2m1 steps are at most 1/4 of the range
    assert (back - weight).abs().mean() < 0.1 * weight.abs().mean() + 0.05


def test_mxfp4_model_logits_match_transformers_on_the_dequantised_weights(mxfp4_dirs):
    mxfp4_dir, dequantised_dir, _ = mxfp4_dirs
    model, config = load_model(EngineConfig(mxfp4_dir))
    hf = GptOssForCausalLM.from_pretrained(dequantised_dir, attn_implementation="eager",
                                           experts_implementation="eager").eval()
    ids = torch.randint(0, 201088, (150,), generator=torch.Generator().manual_seed(0))
    blocks = torch.randperm(20)[:10]  # 10 blocks of 16 for 150 tokens
    meta = AttentionMetadata(
        positions=torch.arange(150), slot_mapping=blocks.repeat_interleave(16)[:150] * 16 + torch.arange(150) % 16,
        query_start_loc=torch.tensor([0, 150]), seq_lens=torch.tensor([150]), block_tables=blocks[None],
        block_size=16)
    with torch.inference_mode():
        hidden = model(ids, meta, allocate_kv_cache(config, 20, 16, torch.float32, "cpu"))
        want = hf(ids[None]).logits[0, -3:]
        assert (model.compute_logits(hidden[-3:]) - want).abs().max() < 1e-4


# -- the published sizes, from config.json alone ---------------------------------------
def published_config(num_layers: int, num_experts: int) -> dict:
    """config.json as openai/gpt-oss-20b and -120b ship it (old rope_scaling format, MXFP4, no dtype)."""
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "attention_dropout": 0.0, "eos_token_id": 200002, "pad_token_id": 199999, "experts_per_token": 4,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
        "initializer_range": 0.02, "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * (num_layers // 2),
        "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
        "num_hidden_layers": num_layers, "num_key_value_heads": 8, "num_local_experts": num_experts,
        "output_router_logits": False, "rms_norm_eps": 1e-05, "router_aux_loss_coef": 0.9,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "use_cache": True, "vocab_size": 201088,
    }


@pytest.mark.parametrize("num_layers,num_experts,billions", [(24, 32, 20.9), (36, 128, 116.8)])
def test_published_configs_give_the_real_shapes(tmp_path, num_layers, num_experts, billions):
    (tmp_path / "config.json").write_text(json.dumps(published_config(num_layers, num_experts)))
    config = ModelConfig.from_pretrained(tmp_path)  # no weights needed
    assert (config.num_hidden_layers, config.num_local_experts, config.hidden_size) == (num_layers, num_experts, 2880)
    assert config.layer_types[:2] == ("sliding_attention", "full_attention") and config.sliding_window == 128
    assert config.rope_theta == 150000 and config.rope_parameters["factor"] == 32.0
    assert config.torch_dtype == torch.bfloat16 and config.quant_method == "mxfp4"
    assert config.eos_token_ids == (200002,) and config.pad_token_id == 199999
    # 2 (K, V) x layers x 16 tokens x 8 KV heads x 64 dims x 2 bytes
    assert kv_cache_bytes_per_block(config, 16, torch.bfloat16) == 2 * num_layers * 16 * 8 * 64 * 2
    assert config.num_params / 1e9 == pytest.approx(billions, abs=0.1)
    with torch.device("meta"):  # shapes without memory: experts held dense, and packed (the default)
        model = GptOssModel(held_model_config(config, "dense"))
        packed = GptOssModel(config).model.layers[0].mlp.experts
    assert sum(p.numel() for p in model.parameters()) == config.num_params
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape == (num_experts, 2880, 5760)
    assert experts.down_proj.shape == (num_experts, 2880, 2880)
    # [experts, out, in / 32, 16] bytes and [experts, out, in / 32] scales, as the checkpoint ships them
    assert packed.gate_up_proj_blocks.shape == (num_experts, 5760, 90, 16)
    assert packed.down_proj_scales.shape == (num_experts, 2880, 90)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (4096, 2880)
