"""ModelConfig from transformers' GptOssConfig, across the transformers versions the engine meets."""

from engine.checkpoint import tiny_config
from engine.config import ModelConfig


class ConfigWithoutSwigluFields:
    """A GptOssConfig as transformers 5.17 (the GPU machines' image) has it: no swiglu_alpha / swiglu_limit
    fields (its model hard-codes 1.702 and 7.0); later versions declare them with those defaults."""

    def __init__(self, config) -> None:
        self._config = config

    def __getattr__(self, name: str):
        if name.startswith("swiglu_"):
            raise AttributeError(f"'GptOssConfig' object has no attribute {name!r}")
        return getattr(self._config, name)


def test_a_config_without_swiglu_fields_gets_gpt_oss_constants():
    config = ModelConfig.from_hf(ConfigWithoutSwigluFields(tiny_config()))
    assert (config.swiglu_alpha, config.swiglu_limit) == (1.702, 7.0)
    assert config == ModelConfig.from_hf(tiny_config())


def test_a_config_that_sets_swiglu_fields_keeps_them():
    config = ModelConfig.from_hf(tiny_config(swiglu_limit=5.0))
    assert config.swiglu_limit == 5.0
