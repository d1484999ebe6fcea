"""make_random_checkpoint: deterministic, loadable by transformers, gpt-oss shaped."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import GptOssForCausalLM

from engine.checkpoint import (
    BOS_TOKEN_ID, EOS_TOKEN_ID, PAD_TOKEN_ID, VOCAB_SIZE, make_random_checkpoint,
)

SMALL = dict(hidden_size=16, head_dim=8, intermediate_size=16)  # real vocab, fast to write


def test_same_seed_writes_the_same_bytes_and_another_seed_does_not(tmp_path):
    a = make_random_checkpoint(tmp_path / "a", seed=1, **SMALL)
    b = make_random_checkpoint(tmp_path / "b", seed=1, **SMALL)
    c = make_random_checkpoint(tmp_path / "c", seed=2, **SMALL)
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_loads_with_transformers_as_a_gpt_oss_with_the_real_vocabulary(tiny_model_dir):
    model = GptOssForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")
    config = model.config
    assert config.vocab_size == VOCAB_SIZE == 201088
    assert (config.eos_token_id, config.pad_token_id, config.bos_token_id) == (
        EOS_TOKEN_ID, PAD_TOKEN_ID, BOS_TOKEN_ID)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert config.sliding_window == 128
    assert config.rope_parameters["rope_type"] == "yarn"
    assert model.dtype == torch.float32
    saved = load_file(tiny_model_dir / "model.safetensors")
    assert set(saved) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name


def test_generation_config_stops_on_harmony_end_tokens(tiny_model_dir):
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [200002, 199999, 200012]


def test_bf16_checkpoint_loads_as_bf16_and_matches_fp32_draws(tmp_path):
    bf16 = make_random_checkpoint(tmp_path / "bf16", dtype=torch.bfloat16, **SMALL)
    fp32 = make_random_checkpoint(tmp_path / "fp32", dtype=torch.float32, **SMALL)
    assert GptOssForCausalLM.from_pretrained(bf16).dtype == torch.bfloat16
    a, b = load_file(bf16 / "model.safetensors"), load_file(fp32 / "model.safetensors")
    assert torch.equal(a["lm_head.weight"], b["lm_head.weight"].to(torch.bfloat16))


def test_weights_are_not_near_identity(tiny_model_dir):
    # Activations must be O(1) so engine-vs-reference tests can see a wrong mask or RoPE.
    saved = load_file(tiny_model_dir / "model.safetensors")
    assert saved["model.layers.0.self_attn.q_proj.weight"].std() > 0.1
    assert saved["model.layers.0.self_attn.sinks"].abs().max() > 0.5
    assert not torch.all(saved["model.norm.weight"] == 1)


def test_live_token_ids_zero_every_other_row(tmp_path):
    live = [5, 200002, 200012, 1000]
    path = make_random_checkpoint(tmp_path / "live", live_token_ids=live, **SMALL)
    saved = load_file(path / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        nonzero_rows = saved[name].abs().sum(dim=1).nonzero().flatten().tolist()
        assert nonzero_rows == sorted(live), name
    full = load_file(make_random_checkpoint(tmp_path / "full", **SMALL) / "model.safetensors")
    assert torch.equal(saved["lm_head.weight"][live], full["lm_head.weight"][live])


@pytest.mark.parametrize("live", [[], [-1], [VOCAB_SIZE]])
def test_live_token_ids_out_of_range_are_refused(tmp_path, live):
    with pytest.raises(ValueError, match="live_token_ids"):
        make_random_checkpoint(tmp_path / "bad", live_token_ids=live, **SMALL)
