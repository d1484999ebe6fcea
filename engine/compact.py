"""Checkpoints whose vocabulary matrices keep only their live rows.

The shipped demo model knows a few thousand of the 201,088 token ids; its embedding and lm_head
are otherwise zero rows, 99% of a 100 MB file. A compact checkpoint (`model.compact.safetensors`)
stores each such matrix as its live row ids and those rows, and the loaders (batchrun's engine and
its transformers reference) expand it in memory to the full [vocab, hidden] shape with zeros
elsewhere, so it decodes exactly as the full file does. `python -m engine.compact expand DIR OUT`
writes a standard Hugging Face checkpoint for tools that only read those.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

COMPACT_NAME = "model.compact.safetensors"
VOCAB_MATRICES = ("model.embed_tokens.weight", "lm_head.weight")
_META_KEY = "batchrun.compact"  # safetensors metadata: {matrix name: its full row count}
_IDS, _ROWS = ".live_ids", ".live_rows"


def save_compact(tensors: dict[str, torch.Tensor], out_dir: str | Path) -> Path:
    """Write `tensors` as out_dir/model.compact.safetensors, the vocabulary matrices by live rows."""
    stored: dict[str, torch.Tensor] = {}
    full_rows: dict[str, int] = {}
    for name, tensor in tensors.items():
        if name not in VOCAB_MATRICES:
            stored[name] = tensor.contiguous()
            continue
        live = tensor.ne(0).any(dim=1).nonzero().flatten()
        stored[name + _IDS] = live.to(torch.int32)
        stored[name + _ROWS] = tensor[live].contiguous()
        full_rows[name] = tensor.shape[0]
    path = Path(out_dir) / COMPACT_NAME
    save_file(stored, path, metadata={"format": "pt", _META_KEY: json.dumps(full_rows)})
    return path


def is_compact(path: Path) -> bool:
    return path.name == COMPACT_NAME


def load_compact(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a compact file at full shape (vocabulary matrices expanded with zero rows)."""
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        full_rows: dict[str, int] = json.loads((f.metadata() or {}).get(_META_KEY, "{}"))
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    for name, num_rows in full_rows.items():
        ids, rows = tensors.pop(name + _IDS), tensors.pop(name + _ROWS)
        full = torch.zeros((num_rows, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        full[ids.long()] = rows
        tensors[name] = full
    return tensors


def compact_file(model_dir: str | Path) -> Path | None:
    """The compact weights file of `model_dir`, or None for an ordinary checkpoint."""
    path = Path(model_dir) / COMPACT_NAME
    return path if path.is_file() else None


def _copy_side_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, dst / path.name)


def main() -> None:
    parser = argparse.ArgumentParser(description="Convert between compact and standard gpt-oss checkpoints.")
    parser.add_argument("action", choices=["compact", "expand"])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    args = parser.parse_args()
    _copy_side_files(args.src, args.dst)
    if args.action == "expand":
        source = compact_file(args.src)
        if source is None:
            parser.error(f"{args.src} has no {COMPACT_NAME}")
        save_file(load_compact(source), args.dst / "model.safetensors", metadata={"format": "pt"})
    else:
        from safetensors.torch import load_file

        save_compact(load_file(args.src / "model.safetensors"), args.dst)
    print(args.dst)


if __name__ == "__main__":
    main()
