"""batchrun on a checkpoint in openai/gpt-oss-20b's published layout, against transformers.

transformers' GptOssForCausalLM with Mxfp4Config(dequantize=True) is the oracle: it reads the
same shards, pairs the MXFP4 blocks and scales itself and dequantises them its own way.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import GptOssForCausalLM, Mxfp4Config

from engine.api import SamplingParams
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.loader import checkpoint_files, load_model
from engine.real_layout import SHAPES, write_checkpoint
from tests.engine.test_model import PagedRun
from tests.support.triton_mode import needs_interpreter

NEW_TOKENS = 8
_rng = random.Random(0)
# 7 tokens, and two prompts longer than the 128-token sliding window
PROMPTS = {f"p{n}": [_rng.randrange(200000) for _ in range(n)] for n in (7, 150, 220)}


@pytest.fixture(scope="module")
def real_dir(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("gpt-oss-real-layout"), "tiny", seed=0)


@pytest.fixture(scope="module")
def hf_model(real_dir):
    return GptOssForCausalLM.from_pretrained(real_dir, dtype=torch.float32, attn_implementation="eager",
                                             quantization_config=Mxfp4Config(dequantize=True)).eval()


def hf_greedy(model, ids: list[int]) -> list[int]:
    ids, out = list(ids), []
    with torch.inference_mode():
        for _ in range(NEW_TOKENS):
            out.append(int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
            ids.append(out[-1])
    return out


def engine_greedy(real_dir, kernels: str) -> dict[str, list[int]]:
    engine = LLMEngine(EngineConfig(str(real_dir), device="cpu", kernels=kernels, dtype=torch.float32,
                                    kv_cache_gb=0.02, max_model_len=1024))
    for rid, ids in PROMPTS.items():
        engine.add_request(rid, ids, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_the_layout_is_the_published_one(real_dir):
    config = json.loads((real_dir / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    assert config["rope_scaling"]["rope_type"] == "yarn" and "torch_dtype" not in config
    weight_map = json.loads((real_dir / "model.safetensors.index.json").read_text())["weight_map"]
    # layer 1's gate_up blocks and scales live in different shards; the loader must pair them
    assert (weight_map["model.layers.1.mlp.experts.gate_up_proj_blocks"]
            != weight_map["model.layers.1.mlp.experts.gate_up_proj_scales"])
    assert (real_dir / "original" / "model.safetensors").is_file()
    assert all(path.parent == real_dir for path in checkpoint_files(real_dir))  # original/ never read


def test_experts_dequantise_as_transformers_does(real_dir, hf_model):
    # held dense (dequantised on load) and held packed (decoded per expert as a step runs): the same weights
    dense, _ = load_model(EngineConfig(str(real_dir), device="cpu", kernels="torch", dtype=torch.float32,
                                       moe_weights="dense"))
    packed, _ = load_model(EngineConfig(str(real_dir), device="cpu", kernels="torch", dtype=torch.float32))
    for layer in range(SHAPES["tiny"]["layers"]):
        theirs = hf_model.model.layers[layer].mlp.experts
        held_dense, held_packed = (m.model.layers[layer].mlp.experts for m in (dense, packed))
        assert held_packed.is_mxfp4 and not held_dense.is_mxfp4
        for proj in ("gate_up_proj", "down_proj"):
            want = getattr(theirs, proj).detach().float()
            assert torch.equal(getattr(held_dense, proj), want), (layer, proj)
            decoded = torch.stack([held_packed._expert_weight(proj, e, torch.float32) for e in range(len(want))])
            assert torch.equal(decoded, want), (layer, proj)


def test_prefill_logits_match_transformers(real_dir, hf_model):
    model, config = load_model(EngineConfig(str(real_dir), device="cpu", kernels="torch", dtype=torch.float32))
    ids = PROMPTS["p220"]
    hidden = PagedRun(model, config, block_size=16).step({"p": ids})["p"]  # shuffled physical blocks
    with torch.inference_mode():
        ours = model.compute_logits(hidden).float()
        theirs = hf_model(torch.tensor([ids]), use_cache=False).logits[0].float()
    assert (ours - theirs).abs().max().item() < 1e-4


def test_greedy_tokens_match_transformers(real_dir, hf_model):
    expected = {rid: hf_greedy(hf_model, ids) for rid, ids in PROMPTS.items()}
    assert engine_greedy(real_dir, "torch") == expected


@pytest.mark.slow
@needs_interpreter
def test_greedy_tokens_match_transformers_with_packed_experts_in_triton(real_dir, hf_model):
    pytest.importorskip("triton", reason="the Triton path needs triton (pip install 'batchrun[gpu]')")
    expected = {rid: hf_greedy(hf_model, ids) for rid, ids in PROMPTS.items()}
    assert engine_greedy(real_dir, "triton") == expected
