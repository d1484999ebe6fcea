"""Triton's interpreter without the work it repeats at every device-function call.

Interpreted, a kernel calls each of its nested `@triton.jit` functions (`rounded`, `_rotate`, `_attend_keys`, ...)
through `InterpretedFunction.__call__`, which patches triton.language for the callee at every call (triton 3.6 and
3.9: `inspect.getmembers` over tl, tl.tensor and tl.math, a few hundred setattr), though the launch around it
patched the same modules already and keeps them patched until it returns. On CPU that was most of an interpreted
engine step: 40% of the Triton batch-invariance test went to the rope kernel, whose program makes ~20 such calls.

`install` makes a call inside a launch skip it when the launch patched every language module the callee can see;
any other call (outside a launch, or a callee that sees a module the launch did not patch) goes the original way.
Compiled kernels (a GPU) never come here. A triton whose interpreter lacks these classes is left as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_INSTALLED_FLAG = "_batchrun_direct_device_calls"


class _Launches(threading.local):
    """The language modules each launch running on this thread patched, the innermost launch last."""

    def __init__(self) -> None:
        self.stack: list[frozenset[int]] = []


_active = _Launches()
_languages_cache: dict[Callable[..., Any], frozenset[int]] = {}


def _languages(fn: Callable[..., Any]) -> frozenset[int]:
    """The triton.language modules (tl, tl.core) `fn`'s globals hold: those the interpreter patches for it."""
    found = _languages_cache.get(fn)
    if found is None:
        import triton.language as tl

        found = frozenset(id(value) for value in fn.__globals__.values() if value is tl or value is tl.core)
        _languages_cache[fn] = found
    return found


def install() -> bool:
    """Route device-function calls inside a launch past the interpreter's re-patching; True if installed (now or
    before), False if this triton's interpreter is not the one this was written against."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    grid_executor = getattr(interpreter, "GridExecutor", None)
    device_function = getattr(interpreter, "InterpretedFunction", None)
    error = getattr(interpreter, "InterpreterError", None)
    if grid_executor is None or device_function is None or error is None or not hasattr(device_function, "rewrite"):
        return False
    if getattr(interpreter, _INSTALLED_FLAG, False):
        return True
    launch_call, device_call = grid_executor.__call__, device_function.__call__

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        _active.stack.append(_languages(self.fn))
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            _active.stack.pop()

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _active.stack or not _languages(self.fn) <= _active.stack[-1]:
            return device_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as the original call reports a callee's failure
            raise error(repr(e)) from e

    grid_executor.__call__ = launch
    device_function.__call__ = call
    setattr(interpreter, _INSTALLED_FLAG, True)
    return True
