"""What a piece of tensor code costs on a device, counted on CPU: its aten ops and its peak temporaries.

Both run the code under a TorchDispatchMode, which sees every aten op (each a kernel launch on a GPU,
but for views) and every tensor an op returns. The same ops allocate the same sizes on CUDA (CUDA's
caching allocator rounds each up to 512 bytes), so the CPU count predicts the device's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

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


class LaunchCounter(TorchDispatchMode):
    """Counts what would launch a kernel on a GPU inside it: aten ops that neither return a view nor only
    allocate (the bodies of Python custom ops, such as the MoE, counted op by op), and Triton launches
    (counted while `triton_launches` patches Triton; `count_launches` does both)."""

    ALLOCATIONS = ("empty.memory_format", "empty_like.default", "empty_strided.default")

    def __init__(self) -> None:
        super().__init__()
        self.aten = 0
        self.triton = 0
        self.in_kernel = False  # the interpreter runs a kernel with torch ops of its own: not launches

    @property
    def launches(self) -> int:
        return self.aten + self.triton

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        from torch._library.custom_ops import OPDEFS

        opdef = OPDEFS.get(func._schema.name)
        if opdef is not None and not self.in_kernel:  # a Python custom op: count what its body runs
            with self:
                return opdef._init_fn(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if not self.in_kernel and func.__name__ not in self.ALLOCATIONS and not _returns_view(func, args, out):
            self.aten += 1
            self.launched((args, kwargs, out))
        return out

    def launched(self, tensors: Any) -> None:
        """A launch's arguments and results (a pytree), as a subclass counts them."""


class TrafficCounter(LaunchCounter):
    """LaunchCounter that also adds up the memory a GPU's launches would move: every tensor argument read once
    and every result written once (an in-place op's tensor twice), a Triton kernel's distinct tensors once each.
    An upper bound where an op reads part of an input (an index_select of a few rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def launched(self, tensors: Any) -> None:
        self.bytes += sum(t.nbytes for t in tree_leaves(tensors) if isinstance(t, torch.Tensor))


@contextmanager
def triton_launches(counter: LaunchCounter, run_kernels: bool = True) -> Iterator[None]:
    """Count every Triton kernel launch (compiled or interpreted) into `counter.triton` while inside; without
    `run_kernels`, count them only (their outputs keep what their allocation held)."""
    patched = [(cls, cls.run) for cls in _triton_kernel_classes()]

    def counting(run: Any) -> Any:
        def counted(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            counter.triton += 1
            # a kernel reads or writes each tensor once, however many of its pointers name it (unused placeholders)
            counter.launched(list({a.data_ptr(): a for a in args if isinstance(a, torch.Tensor)}.values()))
            if not run_kernels:
                return None
            outer, counter.in_kernel = counter.in_kernel, True
            try:
                return run(kernel, *args, **kwargs)
            finally:
                counter.in_kernel = outer
        return counted

    for cls, run in patched:
        cls.run = counting(run)
    try:
        yield
    finally:
        for cls, run in patched:
            cls.run = run


def count_launches(fn: Callable[[], object], run_kernels: bool = True) -> LaunchCounter:
    """What `fn()` would launch on a GPU: its counter (`aten`, `triton`, `launches`). run_kernels=False skips the
    Triton kernels (counted, not run): for code whose later ops never read their results' values."""
    return _counted(fn, run_kernels, LaunchCounter())


def count_traffic(fn: Callable[[], object], run_kernels: bool = True) -> TrafficCounter:
    """count_launches with the memory those launches would move (`bytes`)."""
    return _counted(fn, run_kernels, TrafficCounter())


_Counter = TypeVar("_Counter", bound=LaunchCounter)


def _counted(fn: Callable[[], object], run_kernels: bool, counter: _Counter) -> _Counter:
    with triton_launches(counter, run_kernels), counter:
        fn()
    return counter


def _returns_view(func: Any, args: tuple, out: Any) -> bool:
    """Whether an op returned views of its first input (in-place ops and copies, e.g. `to` another dtype, do not)."""
    infos = [r.alias_info for r in func._schema.returns]
    if not infos or any(i is None or i.is_write for i in infos):
        return False
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return first is None or all(not isinstance(o, torch.Tensor)
                                or o.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for o in outs)


def _triton_kernel_classes() -> list[Any]:
    """The classes whose `run` launches a Triton kernel (compiled or interpreted); none without triton."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    return [JITFunction, InterpretedFunction]
