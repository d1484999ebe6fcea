"""The benchmark's workloads and latency figures: ShareGPT-like lengths, the random mix, TTFT/TPOT."""

import statistics

import pytest
import torch

from engine import workloads
from engine.api import RequestOutput, SamplingParams
from engine.workloads import (SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL, BenchResult, make_workloads, percentiles,
                              random_mix, run_backend, sharegpt_mix)


def test_the_sharegpt_mix_has_the_length_profile_of_vllms_sharegpt_sample():
    convs = sharegpt_mix(2000, seed=0).conversations
    prompts = [len(c.prompt_token_ids) for c in convs]
    outputs = [c.output_lens[0] for c in convs]
    # vLLM's 1,000-prompt ShareGPT sample: ~215 prompt and ~198 output tokens per request
    assert 195 < statistics.mean(prompts) < 240 and 180 < statistics.mean(outputs) < 220
    # long-tailed: the median well under the mean, the longest near vLLM's caps
    assert statistics.median(prompts) < 0.75 * statistics.mean(prompts)
    assert statistics.median(outputs) < 0.75 * statistics.mean(outputs)
    assert max(prompts) == SHAREGPT_MAX_PROMPT and max(outputs) > 1000
    assert min(prompts) >= 4 and min(outputs) >= 4
    assert all(p + o <= SHAREGPT_MAX_TOTAL for p, o in zip(prompts, outputs))


def test_the_random_mix_and_fixed_sharegpt_outputs_take_their_lengths_from_options():
    [mix, share] = make_workloads(["random", "sharegpt"], 3, seed=1,
                                  options={"random": {"input_len": 7, "output_len": 5},
                                           "sharegpt": {"output_len": 9}})
    assert [(len(c.prompt_token_ids), c.output_lens) for c in mix.conversations] == [(7, [5])] * 3
    assert [c.output_lens for c in share.conversations] == [[9]] * 3
    assert random_mix(2, seed=1) == random_mix(2, seed=1) != random_mix(2, seed=2)
    assert len(random_mix(1).conversations[0].prompt_token_ids) == 1000  # vLLM's 1,000 in / 1,000 out


def test_percentiles_interpolate_as_numpy_and_vllm_do():
    values = [float(v) for v in torch.randn(37, generator=torch.Generator().manual_seed(0)).exp()]
    expected = torch.quantile(torch.tensor(values, dtype=torch.float64), torch.tensor([0.5, 0.9, 0.99],
                              dtype=torch.float64)).tolist()  # linear interpolation, numpy's default
    assert percentiles(values) == pytest.approx(expected)
    assert percentiles([2.0]) == [2.0, 2.0, 2.0]
    assert percentiles([]) == [None, None, None]
    result = BenchResult.measured("s", "w", 2, 10, 10, 1, 1.0, [1.0, 3.0], [])
    assert (result.ttft_s, result.ttft_p50_s, result.tpot_p50_s) == (2.0, 2.0, None)
    assert result.ttft_p99_s == pytest.approx(2.98)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _OneTokenPerStep:
    """A Backend whose every step takes 1 s of the fake clock and gives each running request one token."""

    model_name, max_model_len = "fake", 1000

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.running: dict[str, list[int]] = {}  # request id -> [tokens left, prompt length]

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams) -> None:
        self.running[request_id] = [sampling.max_tokens, len(prompt_token_ids)]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list[RequestOutput]:
        self.clock.now += 1.0
        outputs = []
        for request_id, state in list(self.running.items()):
            state[0] -= 1
            done = state[0] == 0
            outputs.append(RequestOutput(request_id, [7], "length" if done else None, state[1], 0, 0.0, 0.0))
            if done:
                del self.running[request_id]
        return outputs

    def abort(self, request_id: str) -> None:
        self.running.pop(request_id, None)


def test_run_backend_measures_ttft_from_submission_and_tpot_after_the_first_token(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(workloads.time, "perf_counter", clock)
    load = make_workloads(["random"], 2, seed=0, options={"random": {"input_len": 4, "output_len": 5}})[0]
    load.conversations[1].output_lens = [1]  # one token: a TTFT, no TPOT
    result = run_backend("fake", _OneTokenPerStep(clock), load)
    assert (result.num_requests, result.output_tokens, result.wall_s) == (2, 6, 5.0)
    assert result.ttft_p50_s == result.ttft_p99_s == 1.0  # both submitted at 0, first tokens at step 1
    assert result.tpot_p50_s == result.tpot_p99_s == 1.0  # 5 tokens over steps 1..5: 4 s / 4
    assert result.row()["total_tok_s"] == (8 + 6) / 5.0
