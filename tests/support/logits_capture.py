"""Decode requests on an LLMEngine and keep every logits row it sampled from, keyed by (request, position).

For the batch-invariance tests: the same request must see the same logits bits whatever else ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.api import SamplingParams
from engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class Request:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    arrival_step: int = 0  # added before this engine step (0: before the first)


def capture_logits(llm: LLMEngine) -> dict[tuple[str, int], torch.Tensor]:
    """Record, from now on, the logits row of every sampled (request id, position of the new token)."""
    runner, model = llm.runner, llm.runner.model
    captured: dict[tuple[str, int], torch.Tensor] = {}
    last: list[torch.Tensor] = []
    compute_logits, launch = model.compute_logits, runner.launch

    def recording_compute_logits(hidden):
        last[:] = [compute_logits(hidden)]
        return last[0]

    def recording_launch(batch, external=None):
        last.clear()
        launched = launch(batch, external)
        for row, item in enumerate(batch.sampled):
            captured[(item.seq.request_id, item.seq.num_tokens)] = last[0][row].clone()
        return launched

    model.compute_logits = recording_compute_logits
    runner.launch = recording_launch
    return captured


def decode_capturing(llm: LLMEngine, requests: list[Request]) -> tuple[dict, dict]:
    """Run `requests` (each added at its arrival step) to the end: (tokens by request, logits by key)."""
    captured = capture_logits(llm)
    pending = sorted(requests, key=lambda r: r.arrival_step)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    step = 0
    while pending or llm.has_unfinished_requests():
        while pending and pending[0].arrival_step <= step:
            request = pending.pop(0)
            llm.add_request(request.request_id, request.prompt, request.sampling)
        for output in llm.step():
            tokens[output.request_id] += output.new_token_ids
        step += 1
    return tokens, captured
