"""engine.kernels: kernels='triton' without triton installed is one clear error naming the extra."""

import pytest

import engine.kernels
from engine.config import EngineConfig
from engine.loader import load_model


def test_triton_kernels_without_triton_name_the_extra(monkeypatch, tiny_model_dir):
    monkeypatch.setattr(engine.kernels, "triton_available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install 'batchrun\[gpu\]'"):
        load_model(EngineConfig(tiny_model_dir, kernels="triton"))
    load_model(EngineConfig(tiny_model_dir, kernels="torch"))  # the torch path never asks for triton
