"""What a piece of tensor code costs on a device, counted on CPU: its aten ops and its peak temporaries.

Both run the code under a TorchDispatchMode, which sees every aten op (each a kernel launch on a GPU,
but for views) and every tensor an op returns. The same ops allocate the same sizes on CUDA (CUDA's
caching allocator rounds each up to 512 bytes), so the CPU count predicts the device's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside it (each a kernel launch on a GPU, but for views)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """aten ops that `fn()` runs."""
    with OpCounter() as counter:
        fn()
    return counter.count


class PeakMemory(TorchDispatchMode):
    """Bytes of the storages ops allocate inside it, live at once: now (`live`) and at most (`peak`).

    A storage counts from the op that returns it first until it is freed (its last tensor and view
    gone: torch keeps one Python object per live storage, whose finalizer marks the free). Tensors
    made before the mode (the inputs) never count; views and in-place results add nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        existing = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and not tensor.is_meta:
                storage = tensor.untyped_storage()
                if id(storage) not in existing and id(storage) not in self._seen:
                    self._allocated(storage)
        return out

    def _allocated(self, storage: torch.UntypedStorage) -> None:
        key, size = id(storage), storage.nbytes()
        self._seen.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, key, size)

    def _freed(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most bytes of temporaries (and results) that `fn()` holds at once, beyond its inputs."""
    with PeakMemory() as memory:
        fn()
    return memory.peak
