"""The reference backend: transformers' eager `GptOssForCausalLM`, one request at a time.

Exactness over speed: every forward is batch size 1 with the request's own
`DynamicCache` (no padding, no batching), so a request's tokens cannot depend
on what else is in flight. This is the oracle and the baseline the paged engine
is measured against.

Sampling happens on the CPU in fp32 with a per-request `torch.Generator` that
draws exactly one sample per sampled token, so seeded requests reproduce alone,
among others, and on any device.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch
import transformers
from transformers import DynamicCache, GptOssConfig, GptOssForCausalLM
from transformers.utils import logging as hf_logging

from engine.api import FinishReason, ModelLoadError, RequestOutput, SamplingParams, TokenLogprob
from engine.compact import compact_file, load_compact
from engine.config import DTYPES
from engine.model_dir import check_model_dir
from engine.device import resolve_device
from engine.sampler import apply_bitmask, bitmask_words, request_seed, token_logprobs
from engine.sampler import sample_one as sample  # one sampling implementation, shared with the engine


@dataclass
class _Request:
    """One request in flight; only the backend edits it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    seed: int  # draws keyed by (seed, position), as in the engine
    output_token_ids: list[int] = field(default_factory=list)
    cache: DynamicCache | None = None  # None until prefilled
    prefill_s: float = 0.0
    decode_s: float = 0.0
    is_aborted: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class TransformersBackend:
    """`engine.api.Backend` on transformers' eager gpt-oss, bs-1 forwards per request.

    Options: `dtype` ("auto": the checkpoint's; or "bfloat16", "float32", a torch.dtype),
    `device` ("cpu", "cuda" or "auto": engine.device), `seed` (derives per-request seeds when a request has none),
    `max_model_len` (default and upper bound: the config's max_position_embeddings).

    `abort(id)` marks the request; the next `step()` reports it once with no new
    tokens and finish_reason "abort", then forgets it. Unknown or finished ids are ignored.
    """

    def __init__(self, model_dir: str | Path, *, dtype: str | torch.dtype = "auto", device: str = "cpu",
                 seed: int = 0, max_model_len: int | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.model_name = self.model_dir.name
        self.seed = seed
        self.device = torch.device(resolve_device(device))
        self.model = _load_model(self.model_dir, _resolve_dtype(dtype), self.device)
        self.vocab_size = self.model.config.vocab_size
        limit = self.model.config.max_position_embeddings
        if max_model_len is not None and not 1 < max_model_len <= limit:
            raise ValueError(f"max_model_len must be in [2, {limit}] for this model, got {max_model_len}")
        self.max_model_len = max_model_len or limit
        self.requests: dict[str, _Request] = {}

    # -- the Backend interface ---------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams) -> None:
        """Queue a request; it is prefilled at the next step. ValueError if it cannot run."""
        prompt = [int(t) for t in prompt_token_ids]
        self._check_new_request(request_id, prompt)
        seed = request_seed(sampling, self.seed, request_id)
        self.requests[request_id] = _Request(request_id, prompt, sampling, seed)

    def step(self) -> list[RequestOutput]:
        """Advance every unfinished request by one token (prefill first for new ones)."""
        outputs = []
        for request in list(self.requests.values()):
            if request.is_aborted:
                outputs.append(_output(request, [], FinishReason.ABORT, None))
            else:
                outputs.append(self._advance(request))
            if outputs[-1].finish_reason is not None:
                del self.requests[request.request_id]  # frees its cache
        return outputs

    def abort(self, request_id: str) -> None:
        """Finish a request with "abort" at the next step (no more tokens)."""
        request = self.requests.get(request_id)
        if request is not None:
            request.is_aborted = True
            request.cache = None

    def has_unfinished_requests(self) -> bool:
        """True while some request has not reported its finish_reason."""
        return bool(self.requests)

    def describe(self) -> dict:
        """Configuration for the runs table."""
        return {
            "backend": "transformers",
            "model": str(self.model_dir),
            "model_name": self.model_name,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "device": str(self.device),
            "max_model_len": self.max_model_len,
            "attn_implementation": "eager",
            "experts_implementation": "eager",
            "seed": self.seed,
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
        }

    # -- internals -----------------------------------------------------------
    def _check_new_request(self, request_id: str, prompt: list[int]) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        if not prompt:
            raise ValueError(f"request {request_id!r}: empty prompt")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"request {request_id!r}: prompt has {len(prompt)} tokens; the model's context is "
                             f"{self.max_model_len} tokens and must leave room for at least one output token")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"request {request_id!r}: prompt token ids must be in [0, {self.vocab_size})")

    def _advance(self, request: _Request) -> RequestOutput:
        start = time.perf_counter()
        is_prefill = request.cache is None
        logits = self._next_logits(request)
        constraint = request.sampling.constraint
        if constraint is not None:
            bitmask = torch.full((1, bitmask_words(logits.shape[-1])), -1, dtype=torch.int32)
            constraint.fill_bitmask(bitmask, 0)
            logits = logits[None].clone()
            apply_bitmask(logits, [0], bitmask)
            logits = logits[0]
        token_id = sample(logits, request.sampling, request.seed, request.num_tokens)
        if constraint is not None:
            constraint.accept(token_id)
        logprobs = None
        if request.sampling.logprobs is not None:
            logprobs = token_logprobs(logits[None], [token_id], [request.sampling.logprobs])
        request.output_token_ids.append(token_id)
        elapsed = time.perf_counter() - start
        if is_prefill:
            request.prefill_s += elapsed
        else:
            request.decode_s += elapsed
        return _output(request, [token_id], self._finish_reason(request, token_id), logprobs)

    def _next_logits(self, request: _Request) -> torch.Tensor:
        """Logits for the next token, [vocab] fp32 on the CPU; runs prefill or one decode step."""
        if request.cache is None:
            new_ids = request.prompt_token_ids
        else:
            new_ids = request.output_token_ids[-1:]
        input_ids = torch.tensor([new_ids], dtype=torch.long, device=self.device)  # [1, num_new]
        with torch.inference_mode():
            # logits_to_keep=1: a long prompt would otherwise materialise [len, 201088] logits.
            out = self.model(input_ids=input_ids, past_key_values=request.cache, use_cache=True,
                             logits_to_keep=1)
        request.cache = out.past_key_values
        return out.logits[0, -1].float().cpu()

    def _finish_reason(self, request: _Request, token_id: int) -> FinishReason | None:
        # A stop token sampled on the last allowed step is "stop": the answer is complete.
        params = request.sampling
        if not params.ignore_eos and token_id in params.stop_token_ids:
            return FinishReason.STOP
        if len(request.output_token_ids) >= params.max_tokens or request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None


def _output(request: _Request, new_token_ids: list[int], finish_reason: FinishReason | None,
            logprobs: list[TokenLogprob] | None) -> RequestOutput:
    return RequestOutput(
        request_id=request.request_id, new_token_ids=new_token_ids, finish_reason=finish_reason,
        num_prompt_tokens=len(request.prompt_token_ids), num_cached_tokens=0,
        prefill_s=request.prefill_s, decode_s=request.decode_s, logprobs=logprobs)


def _resolve_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _load_model(model_dir: Path, dtype: str | torch.dtype, device: torch.device) -> GptOssForCausalLM:
    check_model_dir(model_dir)
    try:
        with _no_progress_bar():
            options: dict = dict(dtype=dtype, attn_implementation="eager", experts_implementation="eager",
                                 output_loading_info=True)
            compact = compact_file(model_dir)
            if compact is None:
                loaded = GptOssForCausalLM.from_pretrained(model_dir, **options)
            else:  # transformers reads no compact file: hand it the expanded weights
                loaded = GptOssForCausalLM.from_pretrained(
                    None, config=GptOssConfig.from_pretrained(model_dir), state_dict=load_compact(compact), **options)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ModelLoadError(f"--model {model_dir}: cannot load the checkpoint: {exc}") from exc
    model, info = cast(tuple[GptOssForCausalLM, dict], loaded)  # output_loading_info: a (model, info) pair
    # transformers fills missing weights with random values and only warns: a reference must not.
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelLoadError(f"--model {model_dir}: weights missing from the checkpoint: {shown}")
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers types `to` as unbound


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers draws a "Loading weights" bar over the runner's own; hide it, then restore."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
