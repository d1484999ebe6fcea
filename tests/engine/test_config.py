"""engine/config.py: reading a transformers GptOssConfig."""

import pytest

from engine.checkpoint import tiny_config
from engine.config import ModelConfig


class _ConfigWithoutSwiglu(type(tiny_config())):  # type: ignore[misc]
    """A GptOssConfig as transformers 5.17 (the GPU image's; 5.24 has the fields) builds it: the SwiGLU's alpha and
    clamp are constants of its modeling code, not attributes of the config."""

    def __getattribute__(self, name: str):
        if name.startswith("swiglu_"):
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_a_config_without_swiglu_fields_gets_the_values_transformers_modeling_uses():
    hf = tiny_config()
    hf.__class__ = _ConfigWithoutSwiglu
    config = ModelConfig.from_hf(hf)
    assert (config.swiglu_alpha, config.swiglu_limit) == (1.702, 7.0)
    assert config.hidden_size == hf.hidden_size


def test_a_configs_own_swiglu_values_are_kept():
    config = ModelConfig.from_hf(tiny_config(swiglu_limit=5.0))
    assert config.swiglu_limit == pytest.approx(5.0)
