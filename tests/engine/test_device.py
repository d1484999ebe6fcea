"""--device / --kernels resolution and the KV-cache budget on a GPU (with made-up memory figures)."""

import pytest
import torch

from engine.checkpoint import tiny_config
from engine.config import EngineConfig, ModelConfig, activation_bytes, sampling_reserve_bytes
from engine.device import (ForwardTimer, cuda_index, gpu_kv_cache_budget, kv_cache_budget, relative_diff,
                           resolve_device, resolve_kernels, step_size_label, use_device)
from engine.kernels import triton_available
from engine.kv_cache import num_blocks_for_budget

GIB = 2**30
HAS_CUDA = torch.cuda.is_available()


def test_auto_picks_cuda_only_when_torch_sees_one():
    assert resolve_device("auto") == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")


@pytest.mark.skipif(HAS_CUDA, reason="the error is for machines without CUDA")
def test_cuda_without_a_gpu_is_one_clear_line():
    with pytest.raises(ValueError) as error:
        EngineConfig("unused", device="cuda")
    message = str(error.value)
    assert message.startswith("--device cuda:") and "sees no CUDA device" in message and "\n" not in message


def test_auto_kernels_are_triton_on_cuda_only():
    assert resolve_kernels("auto", "cpu") == "torch"
    assert resolve_kernels("auto", "cuda") == ("triton" if triton_available() else "torch")
    assert resolve_kernels("triton", "cpu") == "triton"  # asked for: the interpreter, for tests
    config = EngineConfig("unused", device="auto", kernels="auto")
    assert (config.device, config.kernels) == (("cuda", "triton") if HAS_CUDA and triton_available()
                                               else (resolve_device("auto"), "torch"))


def test_the_gpu_budget_is_the_fraction_less_what_is_in_use_and_the_reserve():
    # 80 GiB device, 20 GiB in use (the model, others), 2 GiB reserved: 0.9 * 80 - 20 - 2 = 50 GiB
    assert gpu_kv_cache_budget(60 * GIB, 80 * GIB, 0.9, 2 * GIB) == 50 * GIB
    assert gpu_kv_cache_budget(60 * GIB, 80 * GIB, 0.5, 2 * GIB) == 18 * GIB
    with pytest.raises(ValueError, match="--gpu-memory-utilization 0.25: .* leaves no room"):
        gpu_kv_cache_budget(60 * GIB, 80 * GIB, 0.25, 2 * GIB)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        gpu_kv_cache_budget(60 * GIB, 80 * GIB, 1.5, 0)


def test_a_20b_shape_on_an_h100_gets_a_cache_of_millions_of_tokens():
    config = ModelConfig.from_hf(tiny_config(hidden_size=2880, num_hidden_layers=24, num_attention_heads=64,
                                             num_key_value_heads=8, head_dim=64, intermediate_size=2880,
                                             num_local_experts=32, num_experts_per_tok=4))
    reserve = activation_bytes(config, 8192) + sampling_reserve_bytes(config, 256)
    assert GIB // 4 < reserve < 4 * GIB
    # ~13 GiB of MXFP4 weights loaded on an 80 GiB GPU
    budget = gpu_kv_cache_budget(67 * GIB, 80 * GIB, 0.9, reserve)
    block_bytes = 2 * 24 * 16 * 8 * 64 * 2  # K and V, 24 layers, 16 tokens, 8 KV heads of 64, bf16
    tokens = num_blocks_for_budget(budget, block_bytes) * 16
    assert 1_000_000 < tokens < 3_000_000


def test_on_cpu_the_budget_is_kv_cache_gb():
    assert kv_cache_budget("cpu", 0.5, 0.9, reserve_bytes=10 * GIB) == GIB // 2


class CachingAllocator:
    """torch.cuda's memory figures as the driver sees them: blocks freed by tensors stay reserved by torch's
    caching allocator (counted in use) until empty_cache(); an object in a reference cycle (an engine) frees
    its tensors only when the garbage collector runs."""

    def __init__(self, total: int, base: int) -> None:
        self.total, self.base, self.live, self.cached = total, base, 0, 0

    def hold(self, num_bytes: int) -> object:
        """A cyclic owner of `num_bytes`, already unreachable: its bytes turn cached when gc collects it."""
        import weakref

        class Owner:
            pass

        owner = Owner()
        owner.self = owner  # type: ignore[attr-defined]
        self.live += num_bytes
        weakref.finalize(owner, self._free, num_bytes)
        return weakref.ref(owner)

    def _free(self, num_bytes: int) -> None:
        self.live, self.cached = self.live - num_bytes, self.cached + num_bytes

    def empty_cache(self) -> None:
        self.cached = 0

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return self.total - self.base - self.live - self.cached, self.total


def test_on_cuda_the_budget_counts_neither_a_dead_engine_nor_the_allocators_cache(monkeypatch):
    # An earlier engine in the same process (tests, a bench's systems) left 70 GiB of KV cache in a
    # reference cycle, and the loader 3 GiB of freed temporaries in the allocator's cache: neither is in use.
    import gc

    allocator = CachingAllocator(total=80 * GIB, base=GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", allocator.mem_get_info)
    monkeypatch.setattr(torch.cuda, "empty_cache", allocator.empty_cache)
    gc.collect()
    gc.disable()  # the collector runs when the budget asks for it, not by chance
    try:
        dead = allocator.hold(70 * GIB)
        allocator.cached = 3 * GIB
        assert kv_cache_budget("cuda", 0.01, 0.9, reserve_bytes=2 * GIB) == int(0.9 * 80 * GIB) - GIB - 2 * GIB
        assert dead() is None
    finally:
        gc.enable()


def test_cuda_n_names_a_device_index():
    assert cuda_index("cuda:3") == 3 and cuda_index("cuda:0") == 0
    assert cuda_index("cuda") is None and cuda_index("cpu") is None
    for bad in ("cuda:x", "cuda:-1", "cuda:1.5"):
        with pytest.raises(ValueError, match="cuda:N"):
            resolve_device(bad)


def test_use_device_sets_the_current_cuda_device_for_cuda_n_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    for name in ("cpu", "cuda", "cuda:2"):
        use_device(name)
    assert calls == [2]


class FakeEvent:
    """A CUDA event on a fake clock: recorded at `now`, done once the clock passes `done_at`."""

    clock = {"now": 0.0, "done_at": 0.0}

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self) -> None:
        self.at = self.clock["now"]

    def query(self) -> bool:
        return self.clock["done_at"] >= self.at

    def synchronize(self) -> None:
        self.clock["done_at"] = max(self.clock["done_at"], self.at)

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) * 1000


def test_on_cuda_forward_time_comes_from_events_read_without_blocking_the_step(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.clock.update(now=0.0, done_at=0.0)
    timer = ForwardTimer(torch.device("cuda"))
    for start, end in [(1.0, 1.5), (2.0, 2.25)]:
        FakeEvent.clock["now"] = start
        timer.start()
        FakeEvent.clock["now"] = end
        timer.stop()
    assert FakeEvent.clock["done_at"] == 0.0  # stop() never waited for the GPU
    assert timer.seconds == pytest.approx(0.75) and FakeEvent.clock["done_at"] == 2.25


def test_forward_time_is_split_by_step_size(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.clock.update(now=0.0, done_at=0.0)
    timer = ForwardTimer(torch.device("cuda"))
    for num_tokens, start, end in [(1, 1.0, 1.5), (5, 2.0, 2.25), (8, 3.0, 3.5), (2048, 4.0, 6.0), (1, 7.0, 7.25)]:
        FakeEvent.clock["now"] = start
        timer.start(num_tokens)
        FakeEvent.clock["now"] = end
        timer.stop()
    assert timer.by_step_size == "1:2/0.75s 3-8:2/0.75s 1025+:1/2s"
    assert timer.seconds == pytest.approx(3.5)
    assert [step_size_label(n) for n in (1, 2, 3, 16, 17, 64, 65, 1024, 1025)] == [
        "1", "2", "3-8", "9-16", "17-64", "17-64", "65-256", "257-1024", "1025+"]


def test_off_cuda_forward_time_is_the_wall_clock():
    timer = ForwardTimer(torch.device("cpu"))
    timer.start()
    timer.stop()
    assert 0 < timer.seconds < 5


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_events_time_the_gpu_work_not_its_launch():
    timer = ForwardTimer(torch.device("cuda"))
    timer.start()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time, queued in microseconds
    timer.stop()
    assert timer.seconds > 0.02


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_an_engine_on_cuda_1_runs_there(tiny_model_dir):
    from engine.api import SamplingParams
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(tiny_model_dir, device="cuda:1", kernels="triton", kv_cache_gb=0.05))
    assert torch.cuda.current_device() == 1
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4, temperature=0))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.runner.kv_caches[0][0].device == torch.device("cuda:1")


def test_median_us_warms_once_then_times_each_call():
    from engine.device import median_us

    calls = []
    assert median_us(lambda: calls.append(1), "cpu", repeats=5) > 0
    assert len(calls) == 6  # the first call compiles or warms; the median is over the other five


def test_graphed_is_the_call_itself_off_cuda():
    from engine.device import graphed

    def call():
        return 1

    assert graphed(call, "cpu") is call


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: a CUDA graph")
def test_graphed_replays_the_captured_work_on_the_inputs_current_values():
    from engine.device import graphed

    x, out = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
    replay = graphed(lambda: out.copy_(x * 2), "cuda")
    x.fill_(3)
    replay()
    torch.cuda.synchronize()
    assert out.tolist() == [6.0] * 8


def test_relative_diff_is_inf_with_a_nan():
    reference = torch.ones(3)
    assert relative_diff(reference, reference) == 0
    assert relative_diff(torch.tensor([1.0, 1.0, 1.5]), reference) == pytest.approx(0.5)
    assert relative_diff(torch.tensor([1.0, float("nan"), 1.0]), reference) == float("inf")
