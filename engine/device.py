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

import gc
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from engine.api import default_max_num_seqs
from engine.kernels import triton_available

DEVICES = ("auto", "cpu", "cuda")
KERNEL_CHOICES = ("auto", "torch", "triton")


def batch_size_on(name: str) -> int:
    """The engine's default batch size (engine.api.default_max_num_seqs) on the device `name` names: "auto"
    asks torch; a cuda name needs no GPU here (the engine's own resolution says when there is none)."""
    return default_max_num_seqs("cuda" if name == "auto" and torch.cuda.is_available() else name)


def resolve_device(name: str) -> str:
    """"auto" -> "cuda" when torch sees a CUDA device, else "cpu"; ValueError for cuda without one.

    "cuda:N" names one device of several (ValueError when there is no device N)."""
    if name.split(":")[0] not in DEVICES:
        raise ValueError(f"unknown device {name!r}; use one of {', '.join(DEVICES)}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    index = cuda_index(name)
    if name.startswith("cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"--device cuda: torch {torch.__version__} ({build}) sees no CUDA device; "
                         "use --device cpu (or auto)")
    if index is not None and index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s), "
                         f"numbered from 0")
    return name


def cuda_index(name: str) -> int | None:
    """N of "cuda:N"; None for "cuda" (the current device) and other devices. ValueError if N is no index."""
    kind, _, index = name.partition(":")
    if kind != "cuda" or not index:
        return None
    if not index.isdigit():
        raise ValueError(f"--device {name}: a CUDA device is cuda or cuda:N with N a device number")
    return int(index)


def use_device(name: str) -> None:
    """Make "cuda:N" the current CUDA device: Triton launches, CUDA graph capture and CUDA events go to
    the current device, not to the one a tensor names. No-op for "cuda" and non-CUDA devices."""
    index = cuda_index(name)
    if index is not None:
        torch.cuda.set_device(index)


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
    # The driver counts what torch's caching allocator keeps reserved as in use: blocks the loader's
    # temporaries freed, and a dropped engine's KV cache (with some torch builds a dropped engine stays in
    # a reference cycle until the collector runs). Both would shrink this cache, or leave it no room at all.
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return gpu_kv_cache_budget(free, total, utilization, reserve_bytes)


# Upper bounds of the step sizes (new tokens a step) forward time is split by. A ShareGPT-like run spends most of
# its steps in a tail of small ones (512 requests at 256 sequences: 1,147 of 2,030 steps have <= 16 tokens), so
# where its time goes is a question of step size as much as of kernels.
STEP_SIZE_BOUNDS = (1, 2, 8, 16, 64, 256, 1024)


def step_size_label(num_tokens: int) -> str:
    """The STEP_SIZE_BOUNDS bucket of a step of `num_tokens` (>= 1) new tokens: "1", "2", "3-8", ..., "1025+"."""
    low = 1
    for high in STEP_SIZE_BOUNDS:
        if num_tokens <= high:
            return str(high) if low == high else f"{low}-{high}"
        low = high + 1
    return f"{low}+"


class ForwardTimer:
    """Model seconds, summed over steps, and split by step size (`by_step_size`). On CUDA the host only queues the
    launches, so a wall clock around them measures the queueing: there a pair of CUDA events brackets each forward,
    read once the GPU is past them (`seconds` waits for the last). Elsewhere, a wall clock."""

    def __init__(self, device: torch.device) -> None:
        self.is_cuda = device.type == "cuda"
        self._seconds = 0.0
        self._started: Any = None
        self._label = step_size_label(1)
        # (start, end, step size label): events the GPU may not have reached
        self._pending: deque[tuple[Any, Any, str]] = deque()
        self._by_size: dict[str, list[float]] = {}  # label -> [steps, seconds]

    def start(self, num_tokens: int = 1) -> None:
        """Start timing a forward of `num_tokens` new tokens (what `by_step_size` files it under)."""
        self._label = step_size_label(num_tokens)
        if self.is_cuda:
            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record()
        else:
            self._started = time.perf_counter()

    def stop(self) -> None:
        if not self.is_cuda:
            self._add(self._label, time.perf_counter() - self._started)
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((self._started, end, self._label))
        self._collect(wait=False)  # never blocks the step

    @property
    def seconds(self) -> float:
        self._collect(wait=True)
        return self._seconds

    @property
    def by_step_size(self) -> str:
        """Steps and seconds by step size, smallest first: "1:19/0.071s 3-8:916/3.7s ..." (waits like `seconds`)."""
        self._collect(wait=True)
        order = [step_size_label(bound) for bound in STEP_SIZE_BOUNDS] + [step_size_label(STEP_SIZE_BOUNDS[-1] + 1)]
        return " ".join(f"{label}:{int(self._by_size[label][0])}/{self._by_size[label][1]:.3g}s"
                        for label in order if label in self._by_size)

    def _add(self, label: str, seconds: float) -> None:
        self._seconds += seconds
        counts = self._by_size.setdefault(label, [0, 0.0])
        counts[0] += 1
        counts[1] += seconds

    def _collect(self, wait: bool) -> None:
        while self._pending and (wait or self._pending[0][1].query()):
            start, end, label = self._pending.popleft()
            end.synchronize()
            self._add(label, start.elapsed_time(end) / 1000)  # milliseconds


def graphed(fn: Callable[[], object], device: str | torch.device) -> Callable[[], object]:
    """`fn` as the replay of a CUDA graph of it on a CUDA device, else `fn` itself: timed so, a few kernels cost
    what they cost inside the engine's graphs, not the Python and launch latency of calling them one by one (an
    eager MoE layer took ~335 us at batch 1 whatever its launch shape; the graphed step's two GEMMs ~76 us). `fn`
    must do device work only, on tensors it allocates or that outlive the graph."""
    if torch.device(device).type != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm outside the capture: compiles, and settles the allocator
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn()

    def replay() -> object:
        graph.replay()
        return captured  # held with `fn` (and what it holds) for as long as the replays are

    return replay


# A launch shape's output further than this from the default's (the largest difference over the largest magnitude)
# is wrong: a tile or partition size only regroups fp32 sums, then each rounds to the output's dtype.
MAX_RELATIVE_DIFF = 2e-2


def relative_diff(out: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest |out - reference| over the largest |reference| (NaN anywhere: inf)."""
    diff = (out.float() - reference.float()).abs().max().item()
    scale = reference.float().abs().max().item()
    return float("inf") if diff != diff or scale != scale else diff / max(scale, 1e-30)


def median_us(fn: Callable[[], object], device: str | torch.device, repeats: int = 20) -> float:
    """Microseconds `fn()` takes on `device`: the median of `repeats` calls after a first one (compiles, warms),
    each timed by a ForwardTimer (CUDA events on a GPU)."""
    fn()
    times = []
    for _ in range(repeats):
        timer = ForwardTimer(torch.device(device))
        timer.start()
        fn()
        timer.stop()
        times.append(timer.seconds * 1e6)
    return statistics.median(times)
