"""A checkpoint's fingerprint: which weights a run decoded with, whatever the folder is called.

A run records the model by its folder's name; two checkpoints in folders of one name (two fine-tunes, a
retrained file in place) are the same name and other weights. `model_fingerprint` tells them apart in
milliseconds at any size: sha256 over config.json and, per weight file, its name, its size, its
safetensors header (every tensor's name, dtype, shape and offsets) and 32 blocks of 64 KiB spread over
its bytes. A retrained or fine-tuned checkpoint changes nearly every block; a change confined to a few
small tensors can go unseen, which is why it is a fingerprint and not a checksum. Stdlib only: the CLI
asks before anything heavy is imported.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

SAMPLED_BLOCKS = 32
BLOCK_BYTES = 64 * 1024
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on a header


def model_fingerprint(model_dir: str | Path) -> str:
    """The fingerprint of the checkpoint in `model_dir` (config.json and its *.safetensors): 16 hex digits."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    digest.update((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(f"\0{path.name}\0{size}\0".encode())
        with path.open("rb") as handle:
            head = handle.read(8)
            digest.update(head)
            if len(head) == 8 and (header_len := struct.unpack("<Q", head)[0]) <= MAX_HEADER_BYTES:
                digest.update(handle.read(header_len))
            for index in range(SAMPLED_BLOCKS):
                handle.seek(size * index // SAMPLED_BLOCKS)
                digest.update(handle.read(BLOCK_BYTES))
    return digest.hexdigest()[:16]


def readable_fingerprint(model_dir: str | Path | None) -> str | None:
    """`model_fingerprint` of `model_dir`, or None where no folder is named or it cannot be read here (a Ray
    driver without the workers' files; a folder that is no checkpoint fails its own check elsewhere)."""
    if model_dir is None:
        return None
    try:
        return model_fingerprint(model_dir)
    except OSError:
        return None
