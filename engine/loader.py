"""Checkpoint -> GptOssModel: safetensors (one file or sharded), fp32/bf16, MXFP4 experts.

The model is built on the meta device in the target dtype (no memory, no init),
given uninitialised storage on the target device, and every parameter is then
filled from the checkpoint tensor of the same name, one tensor at a time. MXFP4
experts (`*_blocks` + `*_scales`, as the published gpt-oss checkpoints ship
them) stay packed unless moe_weights="dense" dequantises them into the target
dtype on load (engine.experts.GptOssExperts decodes packed ones as it runs).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.api import ModelLoadError
from engine.compact import is_compact, load_compact
from engine.config import EngineConfig, ModelConfig, held_model_config
from engine.kernels import require_triton
from engine.model import GptOssModel
from engine.model_dir import check_model_dir
from engine.mxfp4 import dequantize


def load_model(config: EngineConfig) -> tuple[GptOssModel, ModelConfig]:
    """Build the model on `config.device` in the resolved dtype and load its weights.

    Raises ModelLoadError for a directory that is not a loadable gpt-oss checkpoint
    (missing files, names or shapes that do not match the config).
    """
    model_dir = config.model_dir
    check_model_dir(model_dir)
    model_config = ModelConfig.from_pretrained(model_dir)
    if config.moe_weights == "mxfp4" and model_config.quant_method != "mxfp4":
        raise ModelLoadError(f"--moe-weights mxfp4: --model {model_dir} holds its experts dense (config.json has no "
                             "mxfp4 quantization_config), so there is nothing to keep packed; use --moe-weights auto")
    dtype, device = config.resolve_dtype(model_config), torch.device(config.device)
    if config.kernels == "triton":
        require_triton(device)  # before a kernel module loads: names the extra if missing, the interpreter on CPU
    with _default_dtype(dtype), torch.device("meta"):
        model = GptOssModel(held_model_config(model_config, config.moe_weights), kernels=config.kernels)
    model = model.to_empty(device=device).eval().requires_grad_(False)
    params = dict(model.named_parameters())
    keep_mxfp4 = any(name.endswith("_blocks") for name in params)
    loaded = set()
    for name, tensor in read_checkpoint(model_dir, device, dtype, keep_mxfp4=keep_mxfp4):
        if name not in params:
            raise ModelLoadError(f"--model {model_dir}: unexpected tensor {name!r} in the checkpoint")
        param = params[name]
        if tensor.shape != param.shape:
            raise ModelLoadError(f"--model {model_dir}: {name} has shape {tuple(tensor.shape)}, "
                                 f"the config gives {tuple(param.shape)}")
        param.copy_(tensor)
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelLoadError(f"--model {model_dir}: weights missing from the checkpoint: {shown}")
    params.clear()  # re-packing replaces the experts' scales: the old ones must not stay referenced here meanwhile
    model.pack_expert_words()
    return model, model_config


def read_checkpoint(model_dir: Path, device: torch.device, dtype: torch.dtype = torch.float32,
                    keep_mxfp4: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(parameter name, tensor) for every weight; MXFP4 pairs come out dequantised to `dtype`, or as they are."""
    pending: dict[str, dict[str, torch.Tensor]] = {}  # MXFP4 base name -> its blocks/scales seen so far
    for path in checkpoint_files(model_dir):
        for key, tensor in _file_tensors(model_dir, path, device):
            base, suffix = _split_mxfp4(key)
            if suffix is None or keep_mxfp4:
                yield key, tensor
                continue
            parts = pending.setdefault(base, {})
            parts[suffix] = tensor
            if len(parts) == 2:
                del pending[base]
                yield base, dequantize_mxfp4(parts["blocks"], parts["scales"], dtype)
    if pending:
        raise ModelLoadError(f"--model {model_dir}: MXFP4 tensors without their blocks/scales pair: "
                             f"{sorted(pending)[:3]}")


def _file_tensors(model_dir: Path, path: Path, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of one weights file, read one tensor at a time; a compact file (the shipped demo
    model: vocabulary matrices by live rows, engine/compact.py) comes out expanded."""
    try:
        if is_compact(path):
            yield from load_compact(path, device).items()
            return
        with safe_open(path, framework="pt", device=str(device)) as f:
            for key in f.keys():
                yield key, f.get_tensor(key)
    except (SafetensorError, OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"--model {model_dir}: cannot read {path.name}: {exc}") from exc


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files: those named by model.safetensors.index.json, else every *.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        return sorted(model_dir.glob("*.safetensors"))
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"--model {model_dir}: {index.name} is not a valid index: {exc}") from exc
    missing = [n for n in names if not (model_dir / n).is_file()]
    if missing:
        raise ModelLoadError(f"--model {model_dir}: shards named in {index.name} are missing: {missing[:3]}")
    return [model_dir / n for n in names]


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """MXFP4 expert weights -> `dtype` in the model's [experts, in, out] layout (exact in fp32 and bf16).

    Layout: engine.mxfp4. ModelLoadError if blocks and scales do not fit together.
    """
    try:
        return dequantize(blocks, scales, dtype)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from exc


def _split_mxfp4(key: str) -> tuple[str, str | None]:
    """'x.gate_up_proj_blocks' -> ('x.gate_up_proj', 'blocks'); other names -> (key, None)."""
    for suffix in ("blocks", "scales"):
        if key.endswith("_" + suffix):
            return key[: -len(suffix) - 1], suffix
    return key, None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
