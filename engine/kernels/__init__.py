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
# Keys per decode partition of the attention kernel (split-K); here, free of triton, because the CUDA
# graphs' memory plan (engine.graph_memory) sizes the partitions' partial results from it.
PARTITION_SIZE = 512
DECODE_KEY_TILE = 64  # keys the decode attention kernel reads a loop step (engine.kernels.attention)


def triton_available() -> bool:
    """True if triton can be imported."""
    return importlib.util.find_spec("triton") is not None


def require_triton(device: torch.device | str) -> None:
    """Get ready to import a kernel module for tensors on `device`; ImportError naming the extra if triton is missing.

    For CPU tensors it selects the interpreter (unless the caller already chose): that only
    takes effect if no kernel module has been imported yet in this process.
    """
    if not triton_available():
        raise ImportError(f"kernels='triton' needs triton, which is not installed: {INSTALL_HINT}")
    if torch.device(device).type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


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
