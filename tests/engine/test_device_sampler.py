"""The batched device sampler: greedy as on CPU, the CPU path's filters, real draws, batch independence.

Its tensor ops run on any device, so the algorithm is checked here on CPU tensors;
the gpu-marked tests run it where it is meant to run.
"""

import pytest
import torch

from engine.api import SamplingParams
from engine.device_sampler import filtered_probs, sample_on_device
from engine.sampler import Sampler, keep_top_k, keep_top_p

VOCAB = 300
HAS_CUDA = torch.cuda.is_available()


def params(**kwargs) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 1, **kwargs})


def logits_for(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_are_the_cpu_samplers_tokens_and_draw_nothing():
    logits = logits_for(0, 6)
    logits[2, 10] = logits[2, 20] = logits[2].max() + 1  # a tie: both take the first
    greedy = [params(temperature=0)] * 6
    generators = [torch.Generator().manual_seed(i) for i in range(6)]
    states = [g.get_state() for g in generators]
    on_device = sample_on_device(logits, greedy, generators)
    assert on_device.tolist() == Sampler().sample(logits, greedy, generators)
    assert on_device[2] == 10
    assert all(torch.equal(g.get_state(), s) for g, s in zip(generators, states))


@pytest.mark.parametrize("top_k,top_p,temperature", [(0, 1.0, 1.0), (7, 1.0, 0.8), (0, 0.6, 1.3), (20, 0.9, 0.5)])
def test_the_filters_are_the_cpu_paths(top_k, top_p, temperature):
    logits = logits_for(1, 3)
    logits[1, :5] = logits[1].max()  # ties at the top: top-k keeps every tie of the k-th
    row_params = [params(temperature=temperature, top_k=top_k, top_p=top_p)] * 3
    for row, probs in enumerate(filtered_probs(logits, row_params)):
        expected = logits[row] / temperature
        if top_k:
            expected = keep_top_k(expected, top_k)
        if top_p < 1.0:
            expected = keep_top_p(expected, top_p)
        torch.testing.assert_close(probs, torch.softmax(expected, dim=-1))


def test_draws_follow_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -9.0]])
    generator = torch.Generator().manual_seed(3)
    counts = torch.zeros(6)
    for _ in range(3000):
        counts[sample_on_device(logits, [params(temperature=1.0)], [generator])[0]] += 1
    assert torch.allclose(counts / 3000, torch.softmax(logits[0], dim=0), atol=0.03)
    restricted = [int(sample_on_device(logits, [params(top_k=2)], [generator])[0]) for _ in range(200)]
    assert set(restricted) == {0, 1}


def test_a_seeded_row_draws_the_same_alone_and_in_a_batch():
    logits = logits_for(2, 8)
    target = params(temperature=1.0, top_p=0.95, top_k=40)
    crowd = [params(temperature=0), params(temperature=1.2), params(top_k=3), params(top_p=0.3)] * 2
    crowd[5] = target
    alone, crowded = [], []
    alone_generator = torch.Generator().manual_seed(11)
    crowd_generators = [torch.Generator().manual_seed(50 + i) for i in range(8)]
    crowd_generators[5] = torch.Generator().manual_seed(11)
    for _ in range(20):
        alone.append(int(sample_on_device(logits[5:6], [target], [alone_generator])[0]))
        crowded.append(int(sample_on_device(logits, crowd, crowd_generators)[5]))
    assert alone == crowded and len(set(alone)) > 3  # reproduced, and really sampled


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_on_cuda_greedy_equals_cpu_and_seeds_reproduce():
    logits = logits_for(4, 16)
    greedy = [params(temperature=0)] * 16
    assert Sampler().sample(logits.cuda(), greedy, [None] * 16) == Sampler().sample(logits, greedy, [None] * 16)
    sampled = [params(temperature=1.0, top_p=0.9)] * 16

    def draw() -> list[int]:
        generators = [torch.Generator(device="cuda").manual_seed(i) for i in range(16)]
        return Sampler().sample(logits.cuda(), sampled, generators)

    assert draw() == draw()
