"""engine.kernels.top_p: top-p thresholds by search equal the sort's (engine.device_sampler.row_thresholds).

Without CUDA the kernel runs in Triton's interpreter on CPU tensors.
"""

import pytest
import torch

from engine.api import SamplingParams
from engine.device_sampler import kth_floors, row_thresholds
from engine.kernels import require_triton, triton_available

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)  # CPU: the interpreter, chosen before triton is first imported
from engine.kernels.top_p import top_p_thresholds  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
VOCAB = 3001  # not a multiple of the kernel's block


def sampled(**filters) -> SamplingParams:
    return SamplingParams(max_tokens=1, **filters)


def sorted_thresholds(scores, params):
    kth, mass = zip(*(p.filter_bounds(scores.shape[1]) for p in params))
    return row_thresholds(scores, torch.tensor(kth)[:, None].to(scores.device),
                          torch.tensor(mass)[:, None].to(scores.device))[:, 0]


def searched_thresholds(scores, params):
    kth, mass = zip(*(p.filter_bounds(scores.shape[1]) for p in params))
    floors = kth_floors(scores, torch.tensor(kth, device=scores.device), params)
    return top_p_thresholds(scores, floors, torch.tensor(mass, device=scores.device))


@pytest.mark.parametrize("spread", [1.0, 8.0])  # flat rows (top-p keeps thousands) and peaked ones (a few)
def test_the_search_finds_the_sorts_threshold(spread):
    gen = torch.Generator().manual_seed(int(spread))
    params = [sampled(top_p=0.9), sampled(top_p=0.5, top_k=40), sampled(top_p=0.99),
              sampled(top_k=7, top_p=0.999), sampled(top_p=0.01), sampled(top_k=3)]
    scores = (spread * torch.randn(len(params), VOCAB, generator=gen)).to(DEVICE)
    want, got = sorted_thresholds(scores, params), searched_thresholds(scores, params)
    assert torch.equal(got, want), (got, want)
    kept = (scores >= want[:, None]).sum(dim=1).tolist()
    assert kept[3] <= 7 and kept[5] == 3 and kept[4] >= 1 and kept[2] > kept[0] > 1  # a real spread of cuts


def test_ties_nan_infinite_and_masked_rows_take_what_the_sort_takes():
    params = [sampled(top_p=0.9)] * 5
    ties = torch.randint(0, 4, (VOCAB,)).float()  # four distinct values: the threshold keeps a value's every tie
    nan = torch.randn(VOCAB)
    nan[17] = float("nan")
    inf = torch.randn(VOCAB)
    inf[[5, 900]] = float("inf")
    masked = torch.full((VOCAB,), float("-inf"))
    masked[1234] = 2.0  # one token left (an earlier mask): the threshold is its logit
    negative = -1000 + torch.randn(VOCAB)  # far below zero: only the differences matter
    scores = torch.stack([ties, nan, inf, masked, negative]).to(DEVICE)
    want, got = sorted_thresholds(scores, params), searched_thresholds(scores, params)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan()[1]
    assert torch.equal(got[~got.isnan()], want[~want.isnan()]), (got, want)
    assert got[2] == float("inf") and got[3] == 2.0


def test_a_top_p_below_fp32s_range_keeps_the_top_token_as_the_sort_does():
    # 1e-50 is 0 in fp32: no value's mass above it is below 0, and the threshold stays at the largest logit
    gen = torch.Generator().manual_seed(3)
    params = [sampled(top_p=1e-50), sampled(top_p=1e-50, top_k=VOCAB + 5)]  # a top_k past the vocabulary: off
    scores = torch.randn(2, VOCAB, generator=gen).to(DEVICE)
    want, got = sorted_thresholds(scores, params), searched_thresholds(scores, params)
    assert torch.equal(got, want) and torch.equal(got, scores.max(dim=1).values)


def test_slices_of_a_row_add_up_as_one(monkeypatch):
    # on a GPU a row is many slices (the interpreter's 32,768-logit slices hold this vocabulary in one): narrow
    # ones here, the last short, give the one-slice threshold
    from engine.kernels import top_p

    gen = torch.Generator().manual_seed(11)
    params = [sampled(top_p=0.9), sampled(top_p=0.5, top_k=40), sampled(top_p=0.999)]
    scores = (3 * torch.randn(len(params), VOCAB, generator=gen)).to(DEVICE)
    whole = searched_thresholds(scores, params)
    monkeypatch.setattr(top_p, "ROW_SLICE", 1024)
    monkeypatch.setattr(top_p, "SEARCH_SLICE", 256)
    sliced = searched_thresholds(scores, params)
    assert torch.equal(sliced, whole) and torch.equal(sliced, sorted_thresholds(scores, params))


def test_a_malformed_scores_tensor_is_refused():
    with pytest.raises(ValueError, match="contiguous fp32"):
        top_p_thresholds(torch.zeros(2, 8, dtype=torch.float64, device=DEVICE), torch.zeros(2), torch.ones(2))
