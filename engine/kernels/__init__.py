"""Triton kernels behind `EngineConfig.kernels == "triton"` (attention here; the MoE beside it).

triton is an optional extra (`batchrun[gpu]`): nothing here imports it until a
kernel module is imported. On CPU tensors the kernels run in Triton's
interpreter, which `TRITON_INTERPRET=1` selects when the `@triton.jit`
decorators run, i.e. before a kernel module is first imported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

INSTALL_HINT = "pip install 'batchrun[gpu]'"
# The decode attention's split-K (engine.kernels.attention): here, free of triton, because the CUDA graphs' memory
# plan (engine.graph_memory) sizes the partitions' partial results from it. PARTITION_SIZE is the most keys a program
# attends. A step with few sequences halves it while it has fewer than DECODE_MIN_PROGRAMS programs, down to two key
# tiles: at batch 1 on an H200 each full layer's 8 KV heads x 3 partitions of 512 keys (24 programs on 132 SMs,
# each walking 8 tiles in turn) took ~16 us. A count, not the device's SMs: the same step splits alike on any GPU.
PARTITION_SIZE = 512
DECODE_KEY_TILE = 64  # keys the decode attention kernel reads a loop step (engine.kernels.attention)
DECODE_MIN_PROGRAMS = 2 * 132  # two an SM of an H100 or H200


def decode_partition_sizes(key_tile: int = DECODE_KEY_TILE) -> tuple[int, ...]:
    """The sizes a decode partition takes, largest first: PARTITION_SIZE halved down to two key tiles."""
    sizes = [PARTITION_SIZE]
    while sizes[-1] // 2 >= max(2 * key_tile, 1):
        sizes.append(sizes[-1] // 2)
    return tuple(sizes)


def decode_partition(num_seqs: int, num_kv_heads: int, span: int, key_tile: int = DECODE_KEY_TILE) -> int:
    """Keys a decode attention program attends in a step of `num_seqs` sequences reading up to `span` keys each
    (see PARTITION_SIZE): the largest of decode_partition_sizes that gives DECODE_MIN_PROGRAMS programs, or the
    least."""
    sizes = decode_partition_sizes(key_tile)
    return next((size for size in sizes if num_seqs * num_kv_heads * -(-span // size) >= DECODE_MIN_PROGRAMS),
                sizes[-1])


def decode_parts(num_seqs: int, num_kv_heads: int, span: int, key_tile: int = DECODE_KEY_TILE) -> int:
    """Partitions a decode sequence's keys split into (decode_partition's); 1 means no reduce."""
    return max(-(-span // decode_partition(num_seqs, num_kv_heads, span, key_tile)), 1)


def split_decode_steps(num_kv_heads: int, max_span: int, max_seqs: int,
                       key_tile: int = DECODE_KEY_TILE) -> list[tuple[int, int]]:
    """(sequences, keys) of a step that splits its keys at each partition size steps of up to `max_seqs` sequences
    and `max_span` keys can split at (decode_partition's): the fewest sequences, at the longest span that still
    splits that finely. The decode kernel compiles once per size (a constexpr: a runtime size took it from 63 to
    75 registers, sm_90), so a warm-up runs these before any request."""
    steps = []
    for partition in decode_partition_sizes(key_tile):
        if max_span <= partition:
            continue  # no step reaches two partitions of this size
        for num_seqs in range(1, max_seqs + 1):
            if decode_partition(num_seqs, num_kv_heads, partition + 1, key_tile) > partition:
                break  # more sequences only split coarser
            lo, hi = partition + 1, max_span  # the longest span this many split at `partition` or finer
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if decode_partition(num_seqs, num_kv_heads, mid, key_tile) <= partition else (
                    lo, mid - 1)
            if decode_partition(num_seqs, num_kv_heads, lo, key_tile) == partition:
                steps.append((num_seqs, lo))
                break
    return steps


def triton_available() -> bool:
    """True if triton can be imported."""
    return importlib.util.find_spec("triton") is not None


def require_triton(device: torch.device | str) -> None:
    """Get ready to import a kernel module for tensors on `device`; ImportError naming the extra if triton is missing.

    For CPU tensors it selects the interpreter (unless the caller already chose): that only
    takes effect if no kernel module has been imported yet in this process. Interpreted, the kernels' nested
    device-function calls skip the interpreter's repeated patching (engine.kernels.interpreter_calls).
    """
    if not triton_available():
        raise ImportError(f"kernels='triton' needs triton, which is not installed: {INSTALL_HINT}")
    if torch.device(device).type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if interpreted():
        from engine.kernels.interpreter_calls import install

        install()  # nested device functions called without re-patching triton.language each call


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels: what triton reads when a kernel module's decorators run
    (require_triton chooses it for CPU tensors first)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def run_json_child(module: str, args: list[str], *, interpret: bool, what: str, timeout_s: float) -> Any:
    """`python -m module args` in a child process with Triton's interpreter on or off (it must be chosen before
    triton.language first loads, so a process already running cannot switch); the JSON of its last stdout line.

    Raises RuntimeError naming `what` if the child fails.
    """
    repo_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TRITON_INTERPRET": "1" if interpret else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
