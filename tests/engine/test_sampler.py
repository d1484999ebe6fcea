"""Sampler: greedy rows, per-request generators, top-k/top-p, one implementation with the reference."""

import pytest
import torch

from engine.api import SamplingParams, derive_seed
from engine.sampler import (Sampler, allowed_tokens, apply_bitmask, bitmask_words, keep_top_k, keep_top_p,
                            make_generator, sample_one)

VOCAB = 500


def logits_for(step: int, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(1000 + step)) * 3


def params(**kwargs) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 1, **kwargs})


def test_greedy_rows_are_argmax_and_draw_no_randomness():
    logits = logits_for(0, rows=4)
    generators = [torch.Generator().manual_seed(i) for i in range(4)]
    states = [g.get_state() for g in generators]
    mixed = [params(temperature=0), params(temperature=1.0), params(temperature=0), params(temperature=0.7)]
    token_ids = Sampler().sample(logits, mixed, generators)
    assert token_ids[0] == int(logits[0].argmax()) and token_ids[2] == int(logits[2].argmax())
    assert torch.equal(generators[0].get_state(), states[0]) and torch.equal(generators[2].get_state(), states[2])
    assert not torch.equal(generators[1].get_state(), states[1])  # one draw per sampled row


def test_a_seeded_row_samples_the_same_alone_and_in_a_batch_of_32():
    target = params(temperature=1.0, top_p=0.9, top_k=50)
    others = [params(temperature=0), params(temperature=1.3), params(temperature=0.5, top_k=5),
              params(temperature=1.0, top_p=0.5)]
    alone_generator = torch.Generator().manual_seed(7)
    crowd_generators = [torch.Generator().manual_seed(100 + i) for i in range(32)]
    crowd_generators[13] = torch.Generator().manual_seed(7)
    crowd_params = [others[i % len(others)] for i in range(32)]
    crowd_params[13] = target
    alone, crowd = [], []
    for step in range(20):
        logits = logits_for(step, rows=32)
        alone += Sampler().sample(logits[13:14], [target], [alone_generator])
        crowd.append(Sampler().sample(logits, crowd_params, crowd_generators)[13])
    assert alone == crowd
    assert len(set(alone)) > 1  # it really sampled


def test_batched_sampling_draws_exactly_what_the_single_row_sampler_draws():
    rows = [params(temperature=0.8), params(temperature=0), params(temperature=1.0, top_k=3),
            params(temperature=1.2, top_p=0.3)]
    batch_generators = [torch.Generator().manual_seed(i) for i in range(4)]
    row_generators = [torch.Generator().manual_seed(i) for i in range(4)]
    for step in range(10):
        logits = logits_for(step, rows=4)
        batched = Sampler().sample(logits, rows, batch_generators)
        single = [sample_one(logits[i], rows[i], row_generators[i]) for i in range(4)]
        assert batched == single


def test_the_reference_backend_uses_the_same_sampling_code():
    from engine import reference

    assert reference.sample is sample_one and reference.derive_seed is derive_seed


def test_top_k_keeps_exactly_the_k_largest():
    logits = logits_for(1)[0]
    kept = keep_top_k(logits, 7)
    assert torch.isfinite(kept).sum() == 7
    assert set(torch.nonzero(torch.isfinite(kept)).flatten().tolist()) == set(logits.topk(7).indices.tolist())
    assert torch.equal(keep_top_k(logits, VOCAB), logits)


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_keeps_the_smallest_set_that_reaches_the_mass(top_p):
    logits = logits_for(2)[0]
    probs = torch.softmax(logits, -1)
    kept = torch.isfinite(keep_top_p(logits, top_p))
    kept_probs = probs[kept].sort(descending=True).values
    assert kept_probs.sum() >= top_p - 1e-6
    assert kept_probs[:-1].sum() < top_p  # one token fewer does not reach it
    assert probs[~kept].max() <= kept_probs.min()  # the most likely ones are the kept ones


def test_sampled_tokens_stay_inside_top_k_and_top_p():
    logits = logits_for(3, rows=1).repeat(64, 1)
    probs = torch.softmax(logits[0], -1)
    top5 = set(logits[0].topk(5).indices.tolist())
    order = probs.argsort(descending=True)
    nucleus = set(order[:int((probs[order].cumsum(0) < 0.6).sum()) + 1].tolist())
    generators = [torch.Generator().manual_seed(i) for i in range(64)]
    assert set(Sampler().sample(logits, [params(top_k=5)] * 64, generators)) <= top5
    assert set(Sampler().sample(logits, [params(top_p=0.6)] * 64, generators)) <= nucleus
    assert len(set(Sampler().sample(logits, [params()] * 64, generators))) > 5


def test_a_low_temperature_samples_the_argmax():
    logits = logits_for(4, rows=8)
    generators = [torch.Generator().manual_seed(i) for i in range(8)]
    assert Sampler().sample(logits, [params(temperature=1e-4)] * 8, generators) == logits.argmax(-1).tolist()


def test_rows_without_a_generator_use_the_global_rng():
    torch.manual_seed(0)
    first = Sampler().sample(logits_for(5, rows=3), [params()] * 3, [None] * 3)
    torch.manual_seed(0)
    assert Sampler().sample(logits_for(5, rows=3), [params()] * 3, [None] * 3) == first


def test_logprobs_are_of_the_raw_distribution_for_the_rows_that_ask():
    logits = logits_for(6, rows=3)
    asked = [params(temperature=2.0, logprobs=0), params(), params(temperature=0, logprobs=0)]
    token_ids = [3, 4, 5]
    values = Sampler().logprobs(logits, token_ids, asked)
    assert values[1] is None
    assert values[0] == pytest.approx(torch.log_softmax(logits[0], -1)[3].item(), abs=1e-6)
    assert values[2] == pytest.approx(torch.log_softmax(logits[2], -1)[5].item(), abs=1e-6)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="params"):
        Sampler().sample(logits_for(0, rows=2), [params()], [None])
    with pytest.raises(ValueError, match="num_rows, vocab"):
        Sampler().sample(logits_for(0)[0], [params()], [None])
    with pytest.raises(ValueError, match="tokens"):
        Sampler().logprobs(logits_for(0, rows=2), [1], [params(), params()])


def test_request_generators_are_seeded_once_from_the_request_or_the_backend_seed():
    draw = lambda g: torch.rand(3, generator=g).tolist()  # noqa: E731
    assert draw(make_generator(params(seed=5), 0, "a")) == draw(torch.Generator().manual_seed(5))
    assert draw(make_generator(params(seed=5), 0, "a")) == draw(make_generator(params(seed=5), 1, "b"))
    derived = draw(make_generator(params(), 0, "a"))
    assert derived == draw(torch.Generator().manual_seed(derive_seed(0, "a")))
    assert derived != draw(make_generator(params(), 0, "b")) != draw(make_generator(params(), 1, "a"))
    assert derive_seed(0, "a") == 0x678FEFB8FAC5F39D  # stable across processes and releases: traces replay


def test_a_vanishing_temperature_is_greedy_not_a_nan():
    logits = logits_for(3, rows=2)
    tiny = [params(temperature=1e-40), params(temperature=1e-6)]
    generators = [torch.Generator().manual_seed(i) for i in range(2)]
    assert Sampler().sample(logits, tiny, generators) == logits.argmax(dim=-1).tolist()


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
