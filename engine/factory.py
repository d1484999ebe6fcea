"""Builds a `Backend` (engine.api) by name on a local gpt-oss checkpoint.

The one module that knows every backend. No backend imports it (that would be
a cycle): they read config.json through `engine.config`, which it re-uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.api import Backend, ModelLoadError
from engine.config import EngineConfig
from engine.device import batch_size_on
from engine.model_dir import check_model_dir

BACKENDS = ("engine", "transformers")  # the first is `batchrun submit`'s default

__all__ = ["BACKENDS", "ModelLoadError", "check_model_dir", "load_backend"]


def load_backend(name: str, model_dir: str | Path, **options: Any) -> Backend:
    """Load the backend `name` on the checkpoint in `model_dir`; options go to its constructor.

    Raises ModelLoadError for a directory that is not a loadable gpt-oss checkpoint,
    ValueError for an unknown backend name.
    """
    if name == "engine":
        from engine.llm_engine import LLMEngine

        check_model_dir(model_dir)
        if options.get("max_num_seqs") is None:  # not named: the device's default (a GPU batches more)
            options["max_num_seqs"] = batch_size_on(options.get("device", "cpu"))
        return LLMEngine(EngineConfig(Path(model_dir), **options))
    if name == "transformers":
        from engine.reference import TransformersBackend

        return TransformersBackend(model_dir, **options)
    raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
