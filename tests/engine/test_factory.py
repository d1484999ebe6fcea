"""engine.factory: the backend by name, and the engine's batch size by device when none is named."""

import torch

import engine.factory as factory
from engine.api import CPU_MAX_NUM_SEQS, CUDA_MAX_NUM_SEQS, default_max_num_seqs
from engine.device import batch_size_on


def test_the_default_batch_size_follows_the_device(monkeypatch):
    assert default_max_num_seqs("cpu") == batch_size_on("cpu") == CPU_MAX_NUM_SEQS == 64
    assert default_max_num_seqs("cuda:1") == batch_size_on("cuda") == CUDA_MAX_NUM_SEQS == 256
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert batch_size_on("auto") == 64
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert batch_size_on("auto") == 256


def test_an_engine_loaded_without_a_batch_size_takes_its_devices(tiny_model_dir, monkeypatch):
    assert factory.load_backend("engine", tiny_model_dir, kv_cache_gb=0.01).describe()["max_num_seqs"] == 64
    named = factory.load_backend("engine", tiny_model_dir, kv_cache_gb=0.01, max_num_seqs=5, device="cpu")
    assert named.describe()["max_num_seqs"] == 5
    # The device is asked (faked: as a GPU's would answer; the engine itself still runs on the CPU).
    asked = []
    monkeypatch.setattr(factory, "batch_size_on", lambda name: asked.append(name) or 256)
    on_gpu = factory.load_backend("engine", tiny_model_dir, kv_cache_gb=0.01, device="cpu", max_num_seqs=None)
    assert asked == ["cpu"] and on_gpu.describe()["max_num_seqs"] == 256
