"""The engine's only public entry: add_request / step / abort, streaming RequestOutputs.

Each step reads as schedule -> run -> postprocess: the scheduler picks decode
rows and prefill chunks under the token budget, the model runner forwards them
over the paged KV cache and samples, the scheduler appends tokens, finishes and
frees sequences. Implements `engine.api.Backend`.
"""

from __future__ import annotations

import platform
import time
from functools import partial

import torch

from engine.api import RequestOutput, SamplingParams
from engine.config import EngineConfig, ModelConfig
from engine.device import kv_cache_budget, use_device
from engine.graph_memory import kv_reserve_bytes
from engine.kv_cache import BlockManager, num_blocks_for_budget
from engine.kv_layout import KVLayout
from engine.loader import load_model
from engine.model import GptOssModel, kv_cache_bytes_per_block
from engine.model_runner import LaunchedStep, ModelRunner
from engine.sampler import request_seed
from engine.scheduler import PLACEHOLDER, ScheduledBatch, Scheduler, StepOutput
from engine.sequence import Sequence
from engine.step_inputs import ExternalTokens


class LLMEngine:
    """Continuous-batching gpt-oss decoder with a paged, prefix-cached KV cache."""

    def __init__(self, config: EngineConfig, built: tuple[GptOssModel, ModelConfig] | None = None):
        """Load config.model_dir, or take the `built` model (the GPU benchmark makes one in memory)."""
        self.config = config
        use_device(config.device)  # cuda:N: Triton launches and graph capture follow the current device
        model, self.model_config = built or load_model(config)
        self.dtype = next(model.parameters()).dtype
        self.cache_dtype = config.cache_dtype(self.dtype)
        self.kv_layout = KVLayout.for_model(self.model_config, config.hybrid_kv_cache)
        block_bytes = kv_cache_bytes_per_block(self.model_config, config.block_size, self.cache_dtype, self.kv_layout)
        # On CUDA: what --gpu-memory-utilization leaves once the model is in memory; on CPU: --kv-cache-gb.
        # CUDA graphs: their static buffers and memory pool are reserved too, sized from the plan's shapes
        positions = self.model_config.max_position_embeddings
        configured_len = min(config.max_model_len or positions, positions)
        reserve_for = partial(kv_reserve_bytes, self.model_config, max_num_batched_tokens=config.max_num_batched_tokens,
                              max_num_seqs=config.max_num_seqs, block_size=config.block_size, dtype=self.dtype,
                              max_model_len=configured_len, hybrid=self.kv_layout.is_hybrid)
        reserve = reserve_for(cuda_graphs=config.captures_graphs)
        # the graphs' part, set beside what capturing them took (stats(), on CUDA)
        self.graph_reserve_bytes = reserve - reserve_for(cuda_graphs=False)
        budget = kv_cache_budget(config.device, config.kv_cache_gb, config.gpu_memory_utilization, reserve)
        self.num_blocks = num_blocks_for_budget(budget, block_bytes)
        self.kv_cache_bytes = self.num_blocks * block_bytes
        self.block_manager = BlockManager(self.num_blocks, config.block_size, config.enable_prefix_caching,
                                          self.kv_layout.window)
        # A sequence can never outgrow the cache: clamp the context to what the budget holds.
        limit = min(configured_len, self.block_manager.token_capacity(config.step_tokens))
        self.max_model_len = limit
        self.model_name = config.model_dir.name
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=config.max_num_seqs,
                                   max_num_batched_tokens=config.step_tokens,
                                   max_model_len=limit)
        self.runner = ModelRunner(model, self.model_config, config, self.num_blocks, self.cache_dtype, limit,
                                  self.kv_layout)
        self.step_s = 0.0
        self.num_steps = 0
        # async scheduling (default on CUDA): the step launched last, its tokens not yet read back
        self.async_scheduling = config.device.startswith("cuda") if config.async_scheduling is None \
            else config.async_scheduling
        self.in_flight: tuple[ScheduledBatch, LaunchedStep, list[int]] | None = None
        self.num_sync_steps = 0  # async scheduling: steps run synchronously for a constraint or logprobs

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams) -> None:
        """Queue a request; ValueError if the id is in flight or the prompt does not fit."""
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError(f"request {request_id!r}: empty prompt")
        if min(prompt) < 0 or max(prompt) >= self.model_config.vocab_size:
            raise ValueError(f"request {request_id!r}: prompt token ids must be in "
                             f"[0, {self.model_config.vocab_size})")
        self.scheduler.add(Sequence(request_id, prompt, sampling, request_seed(sampling, self.config.seed, request_id)))

    def step(self) -> list[RequestOutput]:
        """One scheduling step: new tokens (and finish reasons) of the requests that advanced."""
        start = time.perf_counter()
        if self.async_scheduling:
            batch, outputs = self._step_async()
        else:
            batch = self.scheduler.schedule()
            if batch.is_empty:
                self.runner.release(batch.released)
            token_ids, logprobs = ([], None) if batch.is_empty else self.runner.run(batch)
            self._add_times(batch, start)
            outputs = self.scheduler.postprocess(batch, token_ids, logprobs)
        self.step_s += time.perf_counter() - start
        self.num_steps += not batch.is_empty
        return [output.to_request_output() for output in outputs]

    def _step_async(self) -> tuple[ScheduledBatch, list[StepOutput]]:
        """Schedule and launch step N, then read back and record step N-1, whose tokens N's decode rows
        took on the device: the host's work for N+1 overlaps the device's for N.

        A request with a constraint or logprobs needs its last token on the host before its next step:
        while one is unfinished, every step is read back before the next is scheduled (counted).
        """
        start = time.perf_counter()
        outputs: list[StepOutput] = []
        synchronous = bool(self.scheduler.sync_ids)
        if synchronous and self.in_flight is not None:
            outputs += self._resolve_in_flight()
        batch = self.scheduler.schedule()
        launched = None
        if batch.is_empty:
            self.runner.release(batch.released)
        else:
            launched = self.runner.launch(batch, self._device_tokens(batch))
        outputs += self._resolve_in_flight() if self.in_flight is not None else self.scheduler.take_aborted()
        if launched is not None:
            self._add_times(batch, start)
            self.in_flight = (batch, launched, self.scheduler.advance(batch))
            self.num_sync_steps += synchronous
            if synchronous:
                outputs += self._resolve_in_flight()
        return batch, outputs

    def _device_tokens(self, batch: ScheduledBatch) -> ExternalTokens | None:
        """Decode rows whose input token is the in-flight step's sample, still on the device."""
        if self.in_flight is None:
            return None
        previous, launched, _ = self.in_flight
        index = {id(item.seq): row for row, item in enumerate(previous.sampled)}
        rows, source = [], []
        for row, item in enumerate(batch.items):
            if item.seq.token_ids[item.start] == PLACEHOLDER:
                rows.append(row)
                source.append(index[id(item.seq)])
        if not rows or launched.tokens is None:
            return None
        return ExternalTokens(launched.tokens, rows, source)

    def _resolve_in_flight(self) -> list[StepOutput]:
        if self.in_flight is None:
            return []
        batch, launched, live = self.in_flight
        self.in_flight = None
        token_ids, logprobs = self.runner.collect(launched)
        return self.scheduler.resolve(batch, live, token_ids, logprobs)

    @staticmethod
    def _add_times(batch: ScheduledBatch, start: float) -> None:
        elapsed = time.perf_counter() - start
        for item in batch.items:
            if item.is_prefill:
                item.seq.prefill_s += elapsed
            else:
                item.seq.decode_s += elapsed

    def abort(self, request_id: str) -> None:
        """Stop a request; its last output (finish_reason "abort") comes from the next step."""
        self.scheduler.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> dict:
        """Step and model time so far, prefix-cache hits, preemptions, decode tokens in CUDA graphs."""
        bm = self.block_manager
        return {"num_steps": self.num_steps, "step_s": self.step_s, "forward_s": self.runner.forward_s,
                "overhead_frac": 1 - self.runner.forward_s / self.step_s if self.step_s else 0.0,
                "prefix_hit_rate": bm.hit_rate, "num_preemptions": self.scheduler.num_preemptions,
                # how full the KV cache got: the most blocks held at once, and their share of the cache
                "kv_peak_blocks": bm.peak_used_blocks, "kv_peak_usage": bm.peak_used_blocks / bm.num_blocks,
                "async_scheduling": self.async_scheduling, "num_sync_steps": self.num_sync_steps,
                # decode tokens computed in a CUDA graph: replayed on CUDA, counted by the same plan on CPU
                **self.runner.counts.stats(), **self.runner.capture_stats,
                **({"graph_reserve_gb": self.graph_reserve_bytes / 2**30} if self.runner.capture_stats else {}),
                # model time by step size (new tokens): "3-8:916/3.7s" is 916 steps of 3 to 8 tokens, 3.7 s in all
                "forward_by_tokens": self.runner.timer.by_step_size}

    def describe(self) -> dict:
        """Configuration for the runs table."""
        c = self.config
        on_cuda = c.device.startswith("cuda")
        return {"backend": "engine", "model": str(c.model_dir), "model_name": self.model_name,
                "dtype": str(self.dtype).removeprefix("torch."), "device": c.device, "kernels": c.kernels,
                "moe_weights": c.moe_weights,  # and what it came to: experts held packed, or dense
                "mxfp4_experts": any(name.endswith("_blocks") for name, _ in self.runner.model.named_parameters()),
                "block_size": c.block_size, "num_blocks": self.num_blocks, "kv_layout": self.kv_layout.describe(),
                "kv_cache_dtype": str(self.cache_dtype).removeprefix("torch."),
                # on CUDA the cache is sized from free memory: record what it came to
                "kv_cache_gb": round(self.kv_cache_bytes / 2**30, 3) if on_cuda else c.kv_cache_gb,
                "gpu_memory_utilization": c.gpu_memory_utilization if on_cuda else None,
                "cuda_graphs": self.runner.graphs is not None, "async_scheduling": self.async_scheduling,
                "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.step_tokens,  # at least max_num_seqs
                "max_model_len": self.max_model_len, "enable_prefix_caching": c.enable_prefix_caching,
                "seed": c.seed, "deterministic": c.deterministic, "torch_version": torch.__version__,
                # what --deterministic's same tokens also depend on: the Triton build and the device itself
                "triton_version": _triton_version() if c.kernels == "triton" else None,
                "device_name": torch.cuda.get_device_name(torch.device(c.device)) if on_cuda else platform.machine()}


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)
