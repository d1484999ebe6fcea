"""engine.kernels.interpreter_calls: inside an interpreted launch, nested device functions are called without the
interpreter patching triton.language again at each call, and give what they gave before."""

import pytest
import torch

from engine.kernels import interpreted, require_triton, triton_available

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
if torch.cuda.is_available():
    pytest.skip("compiled kernels: no interpreter to patch", allow_module_level=True)
require_triton("cpu")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from engine.kernels import interpreter_calls  # noqa: E402


@triton.jit
def _scaled(x, factor):
    return x * factor


@triton.jit
def _scaled_twice(x, factor):
    return _scaled(_scaled(x, factor), factor)


@triton.jit
def _nested_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, _scaled_twice(x, 3.0) + _scaled(x, 0.5), mask=mask)


def launch(x):
    out = torch.empty_like(x)
    _nested_kernel[(triton.cdiv(x.numel(), 8),)](x, out, x.numel(), BLOCK=8)
    return out


def count_patches(monkeypatch):
    calls = []
    patch = interpreter._patch_lang

    def counted(fn):
        calls.append(fn.__name__)
        return patch(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counted)
    return calls


def test_the_engine_installs_it_when_interpreting():
    assert interpreted()
    assert getattr(interpreter, interpreter_calls._INSTALLED_FLAG) is True
    assert interpreter_calls.install() is True  # a second install changes nothing


def test_a_launch_patches_the_language_once_however_many_nested_calls(monkeypatch):
    calls = count_patches(monkeypatch)
    x = torch.arange(20, dtype=torch.float32)
    out = launch(x)
    torch.testing.assert_close(out, x * 9 + x * 0.5, rtol=0, atol=0)
    # 3 programs x 4 nested calls went straight to the callees: only the launch patched
    assert calls == ["_nested_kernel"]
    assert not interpreter_calls._active.stack  # popped when the launch returned


def test_a_callee_that_sees_another_language_module_is_patched_as_before(monkeypatch):
    calls = count_patches(monkeypatch)
    # as if _scaled's module held triton.language.core, which the kernel's does not: the original way for it
    seen = interpreter_calls._languages(_scaled.fn)
    monkeypatch.setitem(interpreter_calls._languages_cache, _scaled.fn, seen | {id(tl.core)})
    x = torch.arange(4, dtype=torch.float32)
    torch.testing.assert_close(launch(x), x * 9 + x * 0.5, rtol=0, atol=0)
    assert calls.count("_nested_kernel") == 1 and calls.count("_scaled") == 3  # a program's three calls of it


def test_a_callees_failure_is_reported_as_the_interpreter_reports_it():
    @triton.jit
    def _failing_kernel(x_ptr, BLOCK: tl.constexpr):
        x = tl.load(x_ptr + tl.arange(0, BLOCK))
        _scaled(x)  # a missing argument

    with pytest.raises(interpreter.InterpreterError, match="factor") as raised:
        _failing_kernel[(1,)](torch.zeros(4), BLOCK=4)
    # the launch's error wraps the call's, as when each device call went through the interpreter's own
    assert isinstance(raised.value.__cause__, interpreter.InterpreterError)
    assert isinstance(raised.value.__cause__.__cause__, TypeError)
    assert not interpreter_calls._active.stack
