"""The op and memory tracers the sampler's proxies rest on: they must see what they claim to see."""

import pytest
import torch

from engine.kernels import triton_available
from engine.op_trace import count_launches, count_ops, count_traffic, peak_bytes

needs_triton = pytest.mark.skipif(not triton_available(), reason="needs triton (pip install 'batchrun[gpu]')")


def test_count_ops_counts_every_aten_op_views_included():
    x = torch.ones(8)
    assert count_ops(lambda: (x + 1).view(2, 4).sum()) == 3


def test_peak_bytes_counts_live_temporaries_not_inputs_views_or_in_place_results():
    x = torch.ones(1000)  # 4,000 bytes, made outside: never counted

    def two_at_once() -> torch.Tensor:
        a = x * 2  # 4,000
        b = a + 1  # 8,000 live
        del a
        b.mul_(3).view(10, 100)  # in place and a view: nothing new
        return b + 1  # 8,000 live again: the peak stays 8,000

    assert peak_bytes(two_at_once) == 8000
    assert peak_bytes(lambda: x.double().float()) == 8000 + 4000  # the float64 copy is alive while cast down


def test_peak_bytes_sees_a_freed_temporary_go():
    x = torch.ones(1000)

    def one_at_a_time() -> None:
        for _ in range(5):
            y = x * 2  # each replaces the last: 8,000 at most (the new one made before the old one goes)
            del y

    assert peak_bytes(one_at_a_time) == 4000


def test_count_launches_counts_ops_that_launch_not_views_or_allocations():
    x = torch.randn(4, 8)
    counter = count_launches(lambda: (x.view(8, 4), x[1:], torch.empty(3), x + 1, x.mul_(2), x.to(torch.float64)))
    assert (counter.aten, counter.triton) == (3, 0)  # the add, the in-place mul, the copying cast


@needs_triton
def test_count_launches_counts_a_triton_kernel_once_and_not_the_interpreters_own_ops():
    from engine.kernels import fused

    norm, x = torch.ones(72), torch.randn(5, 72)
    counter = count_launches(lambda: fused.rms_norm(x, norm, 1e-5))
    assert (counter.aten, counter.triton) == (0, 1)
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    assert JITFunction.run.__name__ == InterpretedFunction.run.__name__ == "run"  # unpatched afterwards


@needs_triton
def test_count_launches_can_count_triton_kernels_without_running_them():
    from engine.kernels import fused

    norm, x = torch.ones(72), torch.randn(5, 72)
    out = []
    counter = count_launches(lambda: out.append(fused.rms_norm(x, norm, 1e-5)), run_kernels=False)
    assert (counter.aten, counter.triton) == (0, 1)
    assert not torch.allclose(out[0], x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt())  # never computed


def test_count_traffic_reads_each_argument_and_writes_each_result_once():
    x, y = torch.randn(4, 8), torch.randn(4, 8)  # 128 bytes each
    assert count_traffic(lambda: x + y).bytes == 3 * 128
    assert count_traffic(lambda: x.mul_(2)).bytes == 2 * 128  # in place: read and written
    assert count_traffic(lambda: (x.view(8, 4), x[1:])).bytes == 0  # views move nothing
    assert count_traffic(lambda: x.to(torch.float64)).bytes == 128 + 256


@needs_triton
def test_count_traffic_counts_a_triton_kernels_tensor_arguments_once():
    from engine.kernels import fused

    norm, x = torch.ones(72), torch.randn(5, 72)
    counter = count_traffic(lambda: fused.rms_norm(x, norm, 1e-5), run_kernels=False)
    assert counter.bytes == (72 + 2 * 5 * 72) * 4  # the weight, x read, the result written
