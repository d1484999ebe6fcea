"""The sampler's draw in Triton kernels (engine.kernels.sampler) against the torch path's tokens. Without CUDA they run
in Triton's interpreter."""

import pytest
import torch

from engine.api import SamplingParams
from engine.device_sampler import sample_tokens
from engine.kernels import require_triton, triton_available
from engine.op_trace import count_launches

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)
from engine.kernels import sampler  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []  # the GPU check runs them natively

MIX = [SamplingParams(max_tokens=1, top_p=0.9), SamplingParams(max_tokens=1, temperature=0),
       SamplingParams(max_tokens=1, temperature=0.7), SamplingParams(max_tokens=1, top_k=40),
       SamplingParams(max_tokens=1, temperature=1.2, top_k=20, top_p=0.8), SamplingParams(max_tokens=1)]


def logits_for(seed: int, rows: int, vocab: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def both(logits: torch.Tensor, rows: list[SamplingParams], seeds: list[int], positions: list[int]):
    """(the torch path's tokens on CPU, the kernels' on DEVICE)."""
    expected = sample_tokens(logits, rows, seeds, positions).tolist()
    return expected, sample_tokens(logits.to(DEVICE), rows, seeds, positions, kernels="triton").tolist()


@pytest.mark.parametrize("vocab", [300, 3 * sampler.SLICE + 77])  # one slice; several, the last one short
def test_the_kernels_draw_the_torch_paths_tokens_for_every_kind_of_row(vocab):
    rows = [MIX[i % len(MIX)] for i in range(24)]
    for step in range(3):
        expected, got = both(logits_for(step, 24, vocab), rows, [2**40 + i for i in range(24)],
                             [step * 31 + i for i in range(24)])
        assert got == expected
    assert len(set(expected)) > 12  # really drawn: rows differ


def test_from_enough_filtered_rows_top_p_searches_and_draws_the_torch_paths_tokens(monkeypatch):
    from engine import device_sampler
    from engine.kernels import top_p

    searched = []
    search = top_p.top_p_thresholds
    monkeypatch.setattr(top_p, "top_p_thresholds", lambda scores, *args: searched.append(len(scores)) or search(
        scores, *args))
    monkeypatch.setattr(device_sampler, "TOP_P_SEARCH_MIN_ROWS", 4)
    rows = [MIX[i % len(MIX)] for i in range(12)]
    num_filtered = sum(p.is_filtered for p in rows)
    assert num_filtered >= 4
    expected, got = both(logits_for(4, len(rows), 300), rows, list(range(len(rows))), [7] * len(rows))
    assert got == expected and searched == [num_filtered]
    searched.clear()
    both(logits_for(4, 2, 300), rows[:2], [0, 1], [7, 7])  # fewer filtered rows (one): the sort
    assert searched == []


def test_the_kernels_keep_the_draws_recorded_before_them():
    # test_device_sampler's recorded trace: the kernels must not move a token of it
    from tests.engine.test_device_sampler import MIX as RECORDED_MIX
    from tests.engine.test_device_sampler import RECORDED

    logits = torch.randn(20, 300, generator=torch.Generator().manual_seed(5)) * 3
    rows = [RECORDED_MIX[i % len(RECORDED_MIX)] for i in range(20)]
    drawn = sample_tokens(logits.to(DEVICE), rows, [2**40 + i for i in range(20)], [i * 13 for i in range(20)],
                          kernels="triton").tolist()
    assert drawn == RECORDED


def test_nan_ties_and_masked_rows_pick_what_torch_argmax_picks():
    vocab = 2 * sampler.SLICE + 5
    logits = logits_for(9, 8, vocab)
    logits[0, 3] = logits[0, vocab - 2] = 50.0  # a tie across slices: the first
    logits[1, vocab - 1] = logits[1, 7] = float("nan")  # NaN ranks first, the first NaN
    logits[2] = float("-inf")  # nothing allowed: the first token, as argmax gives
    logits[3] = float("-inf")
    logits[3, sampler.SLICE + 1] = 0.0  # a constraint's one allowed token, in the second slice
    logits[4, 11] = float("nan")  # a drawn row with a NaN: the NaN's token
    greedy, drawn = SamplingParams(max_tokens=1, temperature=0), SamplingParams(max_tokens=1)
    rows = [greedy, greedy, greedy, drawn, drawn, drawn, greedy, drawn]
    expected, got = both(logits, rows, list(range(8)), [0] * 8)
    assert expected[:5] == [3, 7, 0, sampler.SLICE + 1, 11]
    assert got == expected


def test_filtered_rows_of_nan_or_inf_logits_draw_what_the_torch_path_draws():
    logits = torch.zeros(3, 50)
    logits[0, 17], logits[1, 23], logits[2] = float("nan"), float("inf"), float("-inf")
    rows = [SamplingParams(max_tokens=1, top_p=0.9)] * 3
    expected, got = both(logits, rows, [1, 2, 3], [0] * 3)
    assert got == expected == [17, 23, 0]


def test_bf16_logits_are_read_as_they_are():
    logits = logits_for(4, 12, 1000).bfloat16()
    rows = [MIX[i % len(MIX)] for i in range(12)]
    expected, got = both(logits, rows, list(range(12)), list(range(12)))
    assert got == expected


def test_a_seeded_row_draws_the_same_alone_and_in_a_batch():
    target = SamplingParams(max_tokens=1, temperature=0.9)
    crowd = [MIX[i % len(MIX)] for i in range(16)]
    crowd[9] = target
    alone, crowded = [], []
    for step in range(6):
        logits = logits_for(50 + step, 16, 500).to(DEVICE)
        alone.append(sample_tokens(logits[9:10], [target], [11], [step], kernels="triton").item())
        seeds, positions = list(range(16)), [step * 3 + i for i in range(16)]
        seeds[9], positions[9] = 11, step
        crowded.append(sample_tokens(logits, crowd, seeds, positions, kernels="triton")[9].item())
    assert alone == crowded and len(set(alone)) > 2


def test_an_unfiltered_step_is_a_copy_and_two_launches_at_any_batch():
    def launches(repeats: int, rows: list[SamplingParams]):
        batch = repeats * len(rows)
        logits = logits_for(1, batch, 300).to(DEVICE)
        return count_launches(lambda: sample_tokens(logits, rows * repeats, list(range(batch)), [0] * batch,
                                                    kernels="triton"))

    for repeats in (1, 32):
        counter = launches(repeats, [SamplingParams(max_tokens=1), SamplingParams(max_tokens=1, temperature=0)])
        # the table's copy to the device (none on CPU); the slices, then the pick
        assert counter.aten <= (DEVICE != "cpu") and counter.triton == 2
    # filtered rows add their thresholds' torch ops, a fixed number whatever the batch
    assert launches(1, MIX).launches == launches(10, MIX).launches < 40


def test_the_table_holds_each_rows_draw_and_the_filtered_rows_after():
    rows = [SamplingParams(max_tokens=1, temperature=0), SamplingParams(max_tokens=1, temperature=0.5, top_k=3),
            SamplingParams(max_tokens=1, temperature=2.0), SamplingParams(max_tokens=1, top_p=0.5)]
    table, filtered = sampler.draw_table(rows, [7, 8, 9, 10], 100, torch.device("cpu"))
    assert filtered == 2
    assert table.tolist() == [[7, 1.0, 0, -1], [8, 0.5, 1, 0], [9, 2.0, 1, -1], [10, 1.0, 1, 1],
                              [1, 0.5, 2, float("inf")], [3, 1.0, 99, 0.5]]


def test_the_kernels_move_the_logits_once_where_the_torch_ops_moved_them_seventy_times():
    from engine.sampler_costs import UNIFORM, traffic_per_logit

    rows = [UNIFORM["temperature 1"]] * 16
    # the logits' 4 bytes, and each row's table entry and slices' results over 1,024 tokens
    assert traffic_per_logit(rows, "triton", vocab=1024) < 4.2
    assert traffic_per_logit(rows, "torch", vocab=1024) > 280
