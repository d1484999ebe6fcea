"""The batched sampler: greedy exact, filters as the row-by-row reference, draws that follow the
distribution and depend only on (seed, position), and a launch count that does not grow with the batch.

Its tensor ops run on any device, so the algorithm is checked here on CPU tensors;
the gpu-marked tests run it where it is meant to run.
"""

import numpy as np
import pytest
import torch

from engine.api import SamplingParams
from engine.device_sampler import (NOISE_CHUNKS, mask_below_threshold_, mix32, mix32_host, row_keys, sample_tokens,
                                   sampler_temporary_bytes, token_salts, uniform_bits)
from engine.op_trace import count_ops
from engine.sampler_costs import UNIFORM, bytes_per_logit, temporaries

VOCAB = 300
HAS_CUDA = torch.cuda.is_available()
MIX = [SamplingParams(max_tokens=1, temperature=0), SamplingParams(max_tokens=1, temperature=0.7),
       SamplingParams(max_tokens=1, top_k=40), SamplingParams(max_tokens=1, top_p=0.9),
       SamplingParams(max_tokens=1, temperature=1.2, top_k=20, top_p=0.8)]


def params(**kwargs) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 1, **kwargs})


def logits_for(seed: int, rows: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Reference, one row: mask all but the k largest logits; ties with the k-th stay in."""
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Reference, one row: keep the most likely tokens, one at a time, until their mass reaches top_p
    (and every token tied with the last one kept)."""
    probs = torch.softmax(logits, dim=-1)
    order = torch.argsort(logits, descending=True).tolist()
    mass, last = 0.0, None
    for token in order:
        if mass >= top_p:
            break
        mass, last = mass + float(probs[token]), token
    return logits.masked_fill(logits < logits[last], float("-inf"))


def test_greedy_rows_are_the_first_largest_logit():
    logits = logits_for(0, 6)
    logits[2, 10] = logits[2, 20] = logits[2].max() + 1  # a tie: the first wins
    token_ids = sample_tokens(logits, [params(temperature=0)] * 6, list(range(6)), [0] * 6)
    assert token_ids.tolist() == logits.argmax(dim=-1).tolist() and token_ids[2] == 10


def mask_below(logits, top_k, top_p, width=None):
    """A copy of `logits` masked as sample_tokens masks its filtered rows (top_k: vocab when off, top_p: 1)."""
    return mask_below_threshold_(logits.clone(), top_k - 1, top_p.masked_fill(top_p >= 1.0, float("inf")), width)


@pytest.mark.parametrize("top_k,top_p,temperature", [(0, 1.0, 1.0), (7, 1.0, 0.8), (0, 0.6, 1.3), (20, 0.9, 0.5),
                                                     (1, 1.0, 1.0), (0, 0.05, 1.0)])
def test_the_filters_are_the_row_by_row_references(top_k, top_p, temperature):
    logits = logits_for(1, 4) / temperature
    logits[1, :5] = logits[1].max()  # ties at the top: top-k keeps every tie of the k-th
    k = torch.full((4, 1), top_k or VOCAB)
    p = torch.full((4, 1), top_p)
    for width in (None, top_k or None):  # the whole sort, and the partial one top-k alone allows
        masked = mask_below(logits, k, p, width if top_p >= 1.0 else None)
        for row in range(4):
            expected = logits[row]
            if top_k:
                expected = keep_top_k(expected, top_k)
            if top_p < 1.0:
                expected = keep_top_p(expected, top_p)
            assert torch.equal(torch.isfinite(masked[row]), torch.isfinite(expected))
            assert torch.equal(masked[row][torch.isfinite(masked[row])], logits[row][torch.isfinite(expected)])


@pytest.mark.parametrize("sampling", [params(top_k=5), params(top_p=0.9), params(top_k=3, top_p=0.5)])
def test_a_filtered_row_of_nan_or_inf_logits_draws_a_token_not_an_index_error(sampling):
    # a diverging model's row: its softmax is NaN, nothing was "kept", and the threshold was gathered at -1 (an
    # IndexError here, a device-side assert that poisons the process on CUDA)
    nan, inf = torch.zeros(1, 50), torch.zeros(1, 50)
    nan[0, 17], inf[0, 23] = float("nan"), float("inf")
    assert sample_tokens(nan, [sampling], [1], [1]).tolist() == [17]  # NaN ranks first, as torch.argmax ranks it
    assert sample_tokens(inf, [sampling], [1], [1]).tolist() == [23]
    blocked = torch.full((1, 50), float("-inf"))
    assert sample_tokens(blocked, [sampling], [1], [1]).tolist() == [0]  # nothing allowed: argmax's first


def test_top_p_keeps_the_smallest_set_that_reaches_the_mass():
    logits = logits_for(2, 1)
    for top_p in (0.05, 0.5, 0.9, 0.99):
        kept = torch.isfinite(mask_below(logits, torch.tensor([[VOCAB]]), torch.tensor([[top_p]])))[0]
        probs = torch.softmax(logits[0], -1)
        kept_probs = probs[kept].sort(descending=True).values
        assert kept_probs.sum() >= top_p - 1e-6 and kept_probs[:-1].sum() < top_p
        assert probs[~kept].max() <= kept_probs.min()


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("sampling,support", [(params(), 6), (params(temperature=0.5), 6), (params(top_k=3), 3),
                                              (params(top_p=0.7), 2)])
def test_draws_follow_the_distribution(sampling, support):
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -2.0]]).repeat(20_000, 1)
    token_ids = sample_tokens(logits, [sampling] * 20_000, [3] * 20_000, list(range(20_000)))
    counts = torch.bincount(token_ids, minlength=6).double()
    kept = logits[0] / sampling.temperature
    kept[support:] = float("-inf")
    probs = torch.softmax(kept, dim=0).double()
    assert counts[support:].sum() == 0
    # support - 1 degrees of freedom: the 1e-6 quantile is below 30; a biased sampler lands in the hundreds
    assert chi_square(counts[:support], probs[:support]) < 30


def test_the_hash_bits_are_uniform_and_independent_between_neighbouring_positions():
    keys = torch.from_numpy(row_keys([9] * 2000, range(2000)).astype(np.int64))[:, None]
    bits = uniform_bits(keys, token_salts(64, "cpu")[None, :])  # [2000, 64]
    buckets = torch.bincount((bits >> 28).flatten(), minlength=16).double()
    assert chi_square(buckets, torch.full((16,), 1 / 16, dtype=torch.double)) < 60  # 15 dof
    high = (bits >> 31).double()  # one bit per (position, token): consecutive positions uncorrelated
    correlation = torch.corrcoef(torch.stack([high[:-1].flatten(), high[1:].flatten()]))[0, 1]
    assert abs(float(correlation)) < 0.02


def test_the_host_keys_hash_as_the_device_does():
    values = torch.randint(0, 2**32, (10_000,), generator=torch.Generator().manual_seed(0))
    assert mix32_host(values.numpy().astype(np.uint64)).tolist() == mix32(values.clone()).tolist()


# the tokens of test_the_draws_are_the_ones_recorded_before_the_sampler_saved_memory's step
RECORDED = [229, 244, 177, 104, 291, 209, 92, 190, 181, 153, 42, 186, 143, 293, 204, 248, 10, 181, 224, 80]


def test_the_draws_are_the_ones_recorded_before_the_sampler_saved_memory():
    # tokens the sampler drew before its noise went in slices and its keys to the host (the same algorithm):
    # a recorded trace's tokens must not move
    logits = torch.randn(20, VOCAB, generator=torch.Generator().manual_seed(5)) * 3
    rows = [MIX[i % len(MIX)] for i in range(20)]
    drawn = sample_tokens(logits, rows, [2**40 + i for i in range(20)], [i * 13 for i in range(20)]).tolist()
    assert drawn == RECORDED


def test_a_seeded_row_draws_the_same_alone_and_in_a_batch_of_mixed_rows():
    target = params(temperature=1.0, top_p=0.95, top_k=40)
    crowd = [MIX[i % len(MIX)] for i in range(64)]
    crowd[37] = target
    alone, crowded = [], []
    for step in range(20):
        logits = logits_for(100 + step, 64)
        alone.append(int(sample_tokens(logits[37:38], [target], [11], [step])[0]))
        positions = [step * 7 + i for i in range(64)]
        positions[37] = step
        seeds = list(range(64))
        seeds[37] = 11
        crowded.append(int(sample_tokens(logits, crowd, seeds, positions)[37]))
    assert alone == crowded and len(set(alone)) > 3  # reproduced, and really sampled


def test_the_ops_per_step_do_not_grow_with_the_batch():
    def ops(batch: int) -> int:
        logits = logits_for(3, batch)
        rows = [MIX[i % len(MIX)] for i in range(batch)]
        return count_ops(lambda: sample_tokens(logits, rows, list(range(batch)), [5] * batch))

    ops(5)  # the first call makes the token salts once
    assert ops(5) == ops(64) == ops(320)
    assert ops(5) < 120  # one pass of a fixed pipeline, not a loop over rows


def test_the_ops_proxy_is_registered_and_constant():
    from engine.proxies import MEASURES

    figures = dict(MEASURES)["sampler ops per step"]()
    assert [f.name for f in figures] == [f"sampler ops per step, batch {b}" for b in (1, 64, 256)]
    assert all(f.ok for f in figures) and len({f.value for f in figures}) == 1


def test_the_peak_temporaries_stay_within_what_the_kv_reserve_allows():
    vocab = 1024
    figures = temporaries(batch=64, vocab=vocab)
    assert set(figures) == {*UNIFORM, "mixed"}
    assert all(per_logit * vocab <= sampler_temporary_bytes(1, vocab) for per_logit in figures.values()), figures
    # unfiltered rows: the fp32 copy and one slice of the noise (int64 hash + shift), a few bytes a row; it was 20
    assert figures["temperature 1"] < 4 + 16 / NOISE_CHUNKS + 0.1
    # the measure is per entry: a batch 4x larger costs 4x the bytes, not more
    assert bytes_per_logit([UNIFORM["top-p 0.9"]] * 16, 1024) == figures["top-p 0.9"]


def test_the_temporaries_proxy_is_registered_and_within_its_bound():
    from engine.proxies import MEASURES

    figures = dict(MEASURES)["sampler temporaries"]()
    assert [f.name for f in figures] == [f"sampler temporaries, B=256, {kind}" for kind in (*UNIFORM, "mixed")]
    assert all(f.ok for f in figures)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_on_cuda_the_tokens_are_the_cpus():
    logits = logits_for(4, 64, vocab=201_088)
    rows = [MIX[i % len(MIX)] for i in range(64)]
    seeds, positions = list(range(64)), [17] * 64
    on_cpu = sample_tokens(logits, rows, seeds, positions).tolist()
    assert sample_tokens(logits.cuda(), rows, seeds, positions).tolist() == on_cpu
