"""A checkpoint's fingerprint: which weights a run decoded with, whatever the folder is called.

A run records the model by its folder's name; two checkpoints in folders of one name (two fine-tunes, a
retrained file in place) are the same name and other weights. `model_fingerprint` tells them apart in
milliseconds at any size: sha256 over config.json and, per weight file, its name, its size, its
safetensors header (every tensor's name, dtype, shape and offsets) and 32 blocks of 64 KiB spread over
its bytes (the first 16 hex digits); then every tensor's own bytes, whole up to 1 MiB (norms, biases,
routers, sinks: what a targeted edit or a small fine-tune changes) and three blocks of 4 KiB of a larger
one (its start, middle and end), so that no tensor goes unread (8 more digits, after a dot). A change of
a few bytes inside a large tensor can still go unseen, which is why it is a fingerprint and not a checksum.
Stdlib only: the CLI asks before anything heavy is imported.

A run recorded before the tensors were read holds the first 16 digits alone: `same_weights` matches it by
them, so an upgrade does not restart it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import BinaryIO

SAMPLED_BLOCKS = 32
BLOCK_BYTES = 64 * 1024
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on a header
WHOLE_TENSOR_BYTES = 2**20  # a tensor up to this size is read whole
TENSOR_BLOCK_BYTES = 4096  # else three blocks of it


def model_fingerprint(model_dir: str | Path) -> str:
    """The fingerprint of the checkpoint in `model_dir` (config.json and its *.safetensors): 16 hex digits, a
    dot and 8 more."""
    model_dir = Path(model_dir)
    digest, tensors = hashlib.sha256(), hashlib.sha256()
    digest.update((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(f"\0{path.name}\0{size}\0".encode())
        with path.open("rb") as handle:
            head = handle.read(8)
            digest.update(head)
            header = b""
            if len(head) == 8 and (header_len := struct.unpack("<Q", head)[0]) <= MAX_HEADER_BYTES:
                header = handle.read(header_len)
                digest.update(header)
            for index in range(SAMPLED_BLOCKS):
                handle.seek(size * index // SAMPLED_BLOCKS)
                digest.update(handle.read(BLOCK_BYTES))
            _read_tensors(handle, header, tensors)
    return f"{digest.hexdigest()[:16]}.{tensors.hexdigest()[:8]}"


def _read_tensors(handle: BinaryIO, header: bytes, digest: hashlib._Hash) -> None:
    """Each tensor's bytes into `digest`: whole when small, else its start, middle and end."""
    try:
        entries = json.loads(header)
    except ValueError:  # no safetensors header: the sampled blocks alone
        return
    start = 8 + len(header)
    spans = sorted(tuple(entry["data_offsets"]) for name, entry in entries.items()
                   if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2)
    for begin, end in spans:
        length = end - begin
        reads = [(begin, length)] if length <= WHOLE_TENSOR_BYTES else [
            (begin, TENSOR_BLOCK_BYTES), (begin + length // 2, TENSOR_BLOCK_BYTES), (end - TENSOR_BLOCK_BYTES,
                                                                                     TENSOR_BLOCK_BYTES)]
        for offset, count in reads:
            handle.seek(start + offset)
            digest.update(handle.read(count))


def same_weights(one: str, other: str) -> bool:
    """Whether two recorded fingerprints name the same weights: equal, or one recorded before the tensors were
    read (16 digits alone) whose digits the other begins with."""
    return one == other or (min(len(one), len(other)) == 16 and one[:16] == other[:16])


def readable_fingerprint(model_dir: str | Path | None) -> str | None:
    """`model_fingerprint` of `model_dir`, or None where no folder is named or it cannot be read here (a Ray
    driver without the workers' files; a folder that is no checkpoint fails its own check elsewhere)."""
    if model_dir is None:
        return None
    try:
        return model_fingerprint(model_dir)
    except OSError:
        return None
