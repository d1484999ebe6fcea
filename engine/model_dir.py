"""What makes a directory a gpt-oss checkpoint: a gpt-oss config.json, and weights beside it.

Apart from engine.config (torch and transformers: seconds to import), so that `batchrun submit` refuses a bad
--model before anything heavy loads. `read_config_json` is the one reader of config.json; `check_model_dir` adds
the weights check.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.api import ModelLoadError


def read_config_json(model_dir: str | Path) -> dict:
    """The gpt-oss config.json of `model_dir`; ModelLoadError if missing, not JSON or not gpt-oss."""
    model_dir = Path(model_dir)
    where = f"--model {model_dir}"
    if not model_dir.is_dir():
        raise ModelLoadError(f"{where}: not a directory")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{where}: no config.json in {model_dir} (expected a local HF gpt-oss checkpoint)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{where}: config.json is not valid JSON: {exc}") from exc
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type != "gpt_oss":
        raise ModelLoadError(f"{where}: config.json has model_type {model_type!r}, expected 'gpt_oss'")
    return config


def check_model_dir(model_dir: str | Path) -> dict:
    """Raise ModelLoadError unless `model_dir` looks like an HF gpt-oss checkpoint; returns its config."""
    config = read_config_json(model_dir)
    if not any(Path(model_dir).glob("*.safetensors")):
        raise ModelLoadError(f"--model {model_dir}: no *.safetensors weights in {model_dir}")
    return config
