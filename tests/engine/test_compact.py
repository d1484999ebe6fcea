"""Compact checkpoints (engine/compact.py): the vocabulary matrices by live rows, expanded on load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.compact import COMPACT_NAME, load_compact, save_compact
from engine.config import EngineConfig
from engine.loader import load_model
from engine.reference import _load_model

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "models" / "batchrun-tiny"


def test_round_trip_is_exact_and_stores_only_live_rows(tmp_path):
    embed = torch.zeros(1000, 8, dtype=torch.bfloat16)
    embed[[3, 17, 999]] = torch.randn(3, 8).to(torch.bfloat16)
    tensors = {"model.embed_tokens.weight": embed, "lm_head.weight": embed * 2,
               "model.norm.weight": torch.randn(8), "model.layers.0.mlp.experts.down_proj_blocks":
               torch.randint(0, 256, (2, 8, 1, 16), dtype=torch.uint8)}
    path = save_compact(tensors, tmp_path)
    stored = load_file(path)
    assert stored["model.embed_tokens.weight.live_ids"].tolist() == [3, 17, 999]
    assert "model.embed_tokens.weight" not in stored
    loaded = load_compact(path)
    assert sorted(loaded) == sorted(tensors)
    assert all(torch.equal(loaded[k], tensors[k]) and loaded[k].dtype == tensors[k].dtype for k in tensors)


def test_the_shipped_checkpoint_is_compact_and_small():
    assert (SHIPPED / COMPACT_NAME).is_file() and not (SHIPPED / "model.safetensors").exists()
    assert (SHIPPED / COMPACT_NAME).stat().st_size < 8 * 2 ** 20  # the repository's per-file limit


@pytest.fixture(scope="module")
def expanded_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("expanded")
    subprocess.run([sys.executable, "-m", "engine.compact", "expand", str(SHIPPED), str(out)], check=True,
                   capture_output=True)
    return out


def test_engine_loads_the_compact_checkpoint_as_the_expanded_one(expanded_dir):
    assert (expanded_dir / "model.safetensors").is_file() and not (expanded_dir / COMPACT_NAME).exists()
    compact, _ = load_model(EngineConfig(str(SHIPPED)))
    full, _ = load_model(EngineConfig(str(expanded_dir)))
    full_params = dict(full.named_parameters())
    for name, param in compact.named_parameters():
        assert torch.equal(param, full_params[name]), name


def test_the_transformers_reference_loads_the_compact_checkpoint(expanded_dir):
    compact = _load_model(SHIPPED, "auto", torch.device("cpu"))
    full = _load_model(expanded_dir, "auto", torch.device("cpu"))
    full_state = full.state_dict()
    for name, tensor in compact.state_dict().items():
        assert torch.equal(tensor, full_state[name]), name
