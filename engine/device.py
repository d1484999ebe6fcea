"""Where the engine runs: `--device` and `--kernels` resolved, and the KV-cache budget on a GPU.

`auto` means the best the machine has: CUDA when torch sees a device, and on
CUDA the Triton kernels when triton is importable. On CPU the torch path stays
the default (the Triton kernels run there only in the interpreter, for tests).

On CUDA the KV cache takes what is left of `gpu_memory_utilization` of the
device's memory once the model is loaded, less a reserve for one step's
activations (vLLM's `--gpu-memory-utilization` means the same fraction). On CPU
the cache is the fixed `--kv-cache-gb`.
"""

from __future__ import annotations

import torch

from engine.kernels import triton_available

DEVICES = ("auto", "cpu", "cuda")
KERNEL_CHOICES = ("auto", "torch", "triton")


def resolve_device(name: str) -> str:
    """"auto" -> "cuda" when torch sees a CUDA device, else "cpu"; ValueError for cuda without one.

    "cuda:N" names one device of several."""
    if name.split(":")[0] not in DEVICES:
        raise ValueError(f"unknown device {name!r}; use one of {', '.join(DEVICES)}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"--device cuda: torch {torch.__version__} ({build}) sees no CUDA device; "
                         "use --device cpu (or auto)")
    return name


def resolve_kernels(name: str, device: str) -> str:
    """"auto" -> "triton" on CUDA when triton is importable, else "torch"; other names as they are."""
    if name not in KERNEL_CHOICES:
        raise ValueError(f"unknown kernels {name!r}; use one of {', '.join(KERNEL_CHOICES)}")
    if name == "auto":
        return "triton" if device.startswith("cuda") and triton_available() else "torch"
    return name


def gpu_kv_cache_budget(free_bytes: int, total_bytes: int, utilization: float, reserve_bytes: int) -> int:
    """Bytes the KV cache may take: `utilization` of the device less what is in use (the model, other
    processes) and the activation reserve. ValueError naming the option when nothing is left."""
    if not 0 < utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
    in_use = total_bytes - free_bytes
    budget = int(utilization * total_bytes) - in_use - reserve_bytes
    if budget <= 0:
        gib = 2**30
        raise ValueError(f"--gpu-memory-utilization {utilization}: {utilization * total_bytes / gib:.1f} GiB of "
                         f"{total_bytes / gib:.1f} GiB leaves no room for a KV cache ({in_use / gib:.1f} GiB in use, "
                         f"{reserve_bytes / gib:.1f} GiB reserved for activations); raise it or free the GPU")
    return budget


def kv_cache_budget(device: str, kv_cache_gb: float, utilization: float, reserve_bytes: int) -> int:
    """The KV-cache budget in bytes: from free GPU memory on CUDA (call after the model is loaded),
    else `kv_cache_gb`."""
    if torch.device(device).type != "cuda":
        return int(kv_cache_gb * 2**30)
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return gpu_kv_cache_budget(free, total, utilization, reserve_bytes)
