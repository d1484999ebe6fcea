"""Fixtures the engine's tests share."""

import pytest
from safetensors.torch import load_file, save_file

from engine import mxfp4


@pytest.fixture(scope="session")
def mxfp4_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny checkpoint with its expert weights in MXFP4, as the published checkpoints ship them."""
    from tests.engine.test_loader import copy_checkpoint

    tensors = {}
    for name, tensor in load_file(tiny_model_dir / "model.safetensors").items():
        if name.endswith(("gate_up_proj", "down_proj")):
            tensors[name + "_blocks"], tensors[name + "_scales"] = mxfp4.quantize(tensor)
        else:
            tensors[name] = tensor
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                 "model.layers.*.mlp.router", "model.embed_tokens",
                                                                 "lm_head"]}
    path = copy_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("mxfp4") / "model", config_update={
        "quantization_config": quant})
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path
