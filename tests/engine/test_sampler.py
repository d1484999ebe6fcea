"""Sampler: greedy rows, draws keyed by (seed, position), top-k/top-p, one implementation with the reference."""

import math

import pytest
import torch

from engine.api import SamplingParams, derive_seed
from engine.sampler import Sampler, allowed_tokens, apply_bitmask, bitmask_words, request_seed, sample_one

VOCAB = 500


def logits_for(step: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(1000 + step)) * 3


def params(**kwargs) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 1, **kwargs})


def test_greedy_rows_are_argmax_whatever_their_seed():
    logits = logits_for(0, rows=4)
    mixed = [params(temperature=0), params(temperature=1.0), params(temperature=0), params(temperature=0.7)]
    for seed in (0, 1, 99):
        token_ids = Sampler().sample(logits, mixed, [seed] * 4, [seed] * 4)
        assert token_ids[0] == int(logits[0].argmax()) and token_ids[2] == int(logits[2].argmax())


def test_a_seeded_row_samples_the_same_alone_and_in_a_batch_of_32():
    target = params(temperature=1.0, top_p=0.9, top_k=50)
    others = [params(temperature=0), params(temperature=1.3), params(temperature=0.5, top_k=5),
              params(temperature=1.0, top_p=0.5)]
    crowd_params = [others[i % len(others)] for i in range(32)]
    crowd_params[13] = target
    crowd_seeds = [100 + i for i in range(32)]
    crowd_seeds[13] = 7
    alone, crowd = [], []
    for step in range(20):
        logits = logits_for(step, rows=32)
        alone += Sampler().sample(logits[13:14], [target], [7], [step])
        positions = [step + 3 * i for i in range(32)]
        positions[13] = step
        crowd.append(Sampler().sample(logits, crowd_params, crowd_seeds, positions)[13])
    assert alone == crowd
    assert len(set(alone)) > 1  # it really sampled


def test_batched_sampling_draws_exactly_what_the_single_row_sampler_draws():
    rows = [params(temperature=0.8), params(temperature=0), params(temperature=1.0, top_k=3),
            params(temperature=1.2, top_p=0.3)]
    for step in range(10):
        logits = logits_for(step, rows=4)
        batched = Sampler().sample(logits, rows, [0, 1, 2, 3], [step] * 4)
        single = [sample_one(logits[i], rows[i], i, step) for i in range(4)]
        assert batched == single


def test_the_reference_backend_uses_the_same_sampling_code():
    from engine import reference

    assert reference.sample is sample_one and reference.request_seed is request_seed


def test_sampled_tokens_stay_inside_top_k_and_top_p():
    logits = logits_for(3, rows=1).repeat(64, 1)
    probs = torch.softmax(logits[0], -1)
    top5 = set(logits[0].topk(5).indices.tolist())
    order = probs.argsort(descending=True)
    nucleus = set(order[:int((probs[order].cumsum(0) < 0.6).sum()) + 1].tolist())
    positions = list(range(64))
    assert set(Sampler().sample(logits, [params(top_k=5)] * 64, [1] * 64, positions)) <= top5
    assert set(Sampler().sample(logits, [params(top_p=0.6)] * 64, [1] * 64, positions)) <= nucleus
    assert len(set(Sampler().sample(logits, [params()] * 64, [1] * 64, positions))) > 5


def test_a_low_temperature_samples_the_argmax():
    logits = logits_for(4, rows=8)
    assert Sampler().sample(logits, [params(temperature=1e-4)] * 8, list(range(8)), [0] * 8) == \
        logits.argmax(-1).tolist()


def test_draws_are_a_function_of_seed_and_position_only():
    logits = logits_for(5, rows=3)
    first = Sampler().sample(logits, [params()] * 3, [4, 4, 4], [10, 11, 12])
    assert Sampler().sample(logits, [params()] * 3, [4, 4, 4], [10, 11, 12]) == first  # no hidden state
    flat = torch.zeros(64, 1000)  # uniform rows: any difference in the draws shows
    by_seed = Sampler().sample(flat, [params()] * 64, list(range(64)), [0] * 64)
    by_position = Sampler().sample(flat, [params()] * 64, [0] * 64, list(range(64)))
    assert len(set(by_seed)) > 55 and len(set(by_position)) > 55


def test_logprobs_are_of_the_raw_distribution_for_the_rows_that_ask():
    logits = logits_for(6, rows=3)
    asked = [params(temperature=2.0, logprobs=0), params(), params(temperature=0, logprobs=0)]
    token_ids = [3, 4, 5]
    values = Sampler().logprobs(logits, token_ids, asked)
    assert values[1] is None
    assert values[0].logprob == pytest.approx(torch.log_softmax(logits[0], -1)[3].item(), abs=1e-6)
    assert values[2].logprob == pytest.approx(torch.log_softmax(logits[2], -1)[5].item(), abs=1e-6)
    assert values[0].top == values[2].top == ()  # logprobs=0: the sampled token's alone


def test_top_logprobs_are_each_rows_most_likely_tokens_as_many_as_it_asks():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    asked = [params(logprobs=3), params(logprobs=0), params(logprobs=5)]
    values = Sampler().logprobs(logits, [7, 8, 9], asked)
    for row, count in ((0, 3), (2, 5)):
        expected = torch.log_softmax(logits[row], -1).topk(count)
        assert [token for token, _ in values[row].top] == expected.indices.tolist()
        assert [value for _, value in values[row].top] == pytest.approx(expected.values.tolist(), abs=1e-6)
    assert values[1].top == () and values[1].logprob == pytest.approx(torch.log_softmax(logits[1], -1)[8].item())


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="params"):
        Sampler().sample(logits_for(0, rows=2), [params()], [0], [0])
    with pytest.raises(ValueError, match="positions"):
        Sampler().sample(logits_for(0, rows=2), [params()] * 2, [0, 0], [0])
    with pytest.raises(ValueError, match="num_rows, vocab"):
        Sampler().sample(logits_for(0)[0], [params()], [0], [0])
    with pytest.raises(ValueError, match="tokens"):
        Sampler().logprobs(logits_for(0, rows=2), [1], [params(), params()])


def test_a_request_draws_with_its_own_seed_else_one_derived_from_the_backend_seed():
    assert request_seed(params(seed=5), 0, "a") == request_seed(params(seed=5), 1, "b") == 5
    assert request_seed(params(), 0, "a") == derive_seed(0, "a")
    assert request_seed(params(), 0, "a") != request_seed(params(), 0, "b") != request_seed(params(), 1, "a")
    assert derive_seed(0, "a") == 0x678FEFB8FAC5F39D  # stable across processes and releases: traces replay


def test_a_vanishing_temperature_is_greedy_not_a_nan():
    logits = logits_for(3, rows=2)
    tiny = [params(temperature=1e-40), params(temperature=1e-6)]
    assert Sampler().sample(logits, tiny, [0, 1], [0, 0]) == logits.argmax(dim=-1).tolist()


# --- token masks (TokenConstraint) -----------------------------------------

class ScriptedConstraint:
    """Allows exactly the next token of a script; records what the engine sampled."""

    def __init__(self, script: list[int]):
        self.script, self.accepted = script, []

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row] = 0
        token = self.script[len(self.accepted) % len(self.script)]
        bitmask[row, token // 32] = torch.tensor(1 << (token % 32), dtype=torch.int64).to(torch.int32)

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)


def test_allowed_tokens_reads_bit_t_of_word_t_over_32_on_both_paths():
    vocab = 100
    allowed = torch.rand(3, vocab) < 0.3
    allowed[1, 31] = allowed[1, 95] = True  # the sign bit of a word, and the last partial word
    words = torch.zeros(3, bitmask_words(vocab), dtype=torch.int64)
    for row, token in allowed.nonzero().tolist():
        words[row, token // 32] |= 1 << (token % 32)
    bitmask = words.to(torch.int32)  # wraps bit 31 to the sign, as llguidance writes it
    assert torch.equal(allowed_tokens(bitmask, vocab), allowed)
    shifts = torch.arange(32, dtype=torch.int32)  # the device path, checked on CPU
    by_shift = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(3, -1)[:, :vocab].bool()
    assert torch.equal(by_shift, allowed)


def test_apply_bitmask_masks_only_the_listed_rows_and_spares_a_row_that_allows_nothing():
    logits = torch.randn(3, 64)
    before = logits.clone()
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    bitmask[0, 0] = 1 << 5  # row 0 may only sample token 5
    apply_bitmask(logits, [0, 2], bitmask)  # mask row 1 (bitmask row 1: nothing allowed) is row 2
    assert torch.argmax(logits[0]) == 5 and torch.isinf(logits[0]).sum() == 63
    assert torch.equal(logits[1], before[1]) and torch.equal(logits[2], before[2])


@pytest.mark.parametrize("backend_name", ["engine", "transformers"])
def test_a_constrained_request_samples_only_what_its_constraint_allows(tiny_model_dir, backend_name):
    from engine.factory import load_backend

    backend = load_backend(backend_name, tiny_model_dir, **({"kv_cache_gb": 0.05} if backend_name == "engine" else {}))
    script = [4000, 17, 200005, 9]
    constraints = {"greedy": ScriptedConstraint(script), "hot": ScriptedConstraint(script)}
    backend.add_request("greedy", [1, 2, 3], params(max_tokens=6, temperature=0.0, constraint=constraints["greedy"]))
    backend.add_request("hot", [1, 2, 3], params(max_tokens=6, temperature=1.8, seed=3,
                                                 constraint=constraints["hot"]))
    backend.add_request("free", [1, 2, 3], params(max_tokens=6, temperature=0.0))
    out = {"greedy": [], "hot": [], "free": []}
    while backend.has_unfinished_requests():
        for o in backend.step():
            out[o.request_id] += o.new_token_ids
    expected = (script * 2)[:6]
    assert out["greedy"] == out["hot"] == expected
    assert constraints["greedy"].accepted == constraints["hot"].accepted == expected
    assert out["free"] != expected


def test_tokens_a_constraint_masked_out_are_not_among_the_top_logprobs():
    logits = torch.full((1, 50), -math.inf)
    logits[0, [4, 9]] = torch.tensor([1.0, 2.0])  # two tokens allowed
    [value] = Sampler().logprobs(logits, [9], [params(logprobs=5)])
    assert [token for token, _ in value.top] == [9, 4] and all(math.isfinite(top) for _, top in value.top)
    assert value.logprob == pytest.approx(math.log(math.e ** 2 / (math.e + math.e ** 2)))


@pytest.mark.parametrize("field, value", [("temperature", float("inf")), ("temperature", float("nan")),
                                          ("top_p", float("nan"))])
def test_sampling_params_refuse_a_value_that_is_not_a_finite_number(field, value):
    # an infinite temperature divided every logit to 0 and sampled the whole vocabulary uniformly
    with pytest.raises(ValueError, match=field):
        SamplingParams(max_tokens=1, **{field: value})
