"""Checkpoint -> GptOssModel: safetensors (one file or sharded), fp32/bf16, MXFP4 experts.

The model is built on the meta device in the target dtype (no memory, no init),
given uninitialised storage on the target device, and every parameter is then
filled from the checkpoint tensor of the same name, one tensor at a time. MXFP4
experts (`*_blocks` + `*_scales`, as the published gpt-oss checkpoints ship
them) are dequantised into the target dtype on load.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.api import ModelLoadError
from engine.config import EngineConfig, ModelConfig, check_model_dir
from engine.kernels import require_triton
from engine.model import GptOssModel

# e2m1 (FP4) code -> value: sign bit, 2 exponent bits, 1 mantissa bit.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
MXFP4_BLOCK = 32  # values sharing one e8m0 scale


def load_model(config: EngineConfig) -> tuple[GptOssModel, ModelConfig]:
    """Build the model on `config.device` in the resolved dtype and load its weights.

    Raises ModelLoadError for a directory that is not a loadable gpt-oss checkpoint
    (missing files, names or shapes that do not match the config).
    """
    model_dir = config.model_dir
    check_model_dir(model_dir)
    model_config = ModelConfig.from_pretrained(model_dir)
    dtype, device = config.resolve_dtype(model_config), torch.device(config.device)
    with _default_dtype(dtype), torch.device("meta"):
        model = GptOssModel(model_config)
    model = model.to_empty(device=device).eval().requires_grad_(False)
    params = dict(model.named_parameters())
    loaded = set()
    for name, tensor in read_checkpoint(model_dir, device, dtype):
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
    if config.kernels == "triton":
        require_triton(device)
        from engine.kernels.attention import use_triton_attention

        use_triton_attention(model)
    return model, model_config


def read_checkpoint(model_dir: Path, device: torch.device,
                    dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
    """(parameter name, tensor) for every weight; MXFP4 pairs come out dequantised to `dtype`."""
    pending: dict[str, dict[str, torch.Tensor]] = {}  # MXFP4 base name -> its blocks/scales seen so far
    for path in checkpoint_files(model_dir):
        try:
            with safe_open(path, framework="pt", device=str(device)) as f:
                for key in f.keys():
                    base, suffix = _split_mxfp4(key)
                    if suffix is None:
                        yield key, f.get_tensor(key)
                        continue
                    parts = pending.setdefault(base, {})
                    parts[suffix] = f.get_tensor(key)
                    if len(parts) == 2:
                        del pending[base]
                        yield base, dequantize_mxfp4(parts["blocks"], parts["scales"], dtype)
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"--model {model_dir}: cannot read {path.name}: {exc}") from exc
    if pending:
        raise ModelLoadError(f"--model {model_dir}: MXFP4 tensors without their blocks/scales pair: "
                             f"{sorted(pending)[:3]}")


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

    blocks: [E, out, G, 16] uint8, two e2m1 codes per byte (low nibble first) for G groups of 32
    input features; scales: [E, out, G] uint8, e8m0 (power-of-two exponent + 127) per group.
    Dequantised one expert at a time, so the transient tensors stay one expert's size.
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape \
            or blocks.ndim != 4 or blocks.shape[-1] * 2 != MXFP4_BLOCK:
        raise ModelLoadError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} do not match "
                             f"scales {tuple(scales.shape)} {scales.dtype}")
    num_experts, num_out, num_groups, _ = blocks.shape
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    out = torch.empty(num_experts, num_groups * MXFP4_BLOCK, num_out, dtype=dtype, device=blocks.device)
    for e in range(num_experts):
        codes = torch.stack((blocks[e] & 0x0F, blocks[e] >> 4), dim=-1).flatten(-2).int()  # [out, G, 32]
        values = torch.ldexp(lut[codes], scales[e].int()[..., None] - 127)
        out[e] = values.flatten(-2).T  # [in, out]
    return out


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
