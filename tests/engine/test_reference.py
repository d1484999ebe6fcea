"""TransformersBackend: exact greedy decoding, batch-independent seeded sampling, finishing rules."""

import json
import random

import pytest
import torch
from transformers import GenerationConfig, GptOssForCausalLM

from engine.api import Backend, ModelLoadError, RequestOutput, SamplingParams, derive_seed
from engine.checkpoint import make_random_checkpoint
from engine.factory import load_backend
from engine.reference import TransformersBackend, sample

GREEDY = dict(temperature=0.0)


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(201088) for _ in range(n)]


def run(backend, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[RequestOutput]]:
    """Add every request, step until done; each request's outputs in order."""
    for request_id, (prompt_ids, params) in requests.items():
        backend.add_request(request_id, prompt_ids, params)
    outputs = {request_id: [] for request_id in requests}
    for out in drain(backend):
        outputs[out.request_id].append(out)
    return outputs


def drain(backend) -> list[RequestOutput]:
    """Step until nothing is unfinished; every output in order."""
    outputs = []
    while backend.has_unfinished_requests():
        outputs.extend(backend.step())
    return outputs


def tokens(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def decode_one(backend, prompt_ids, **params) -> list[RequestOutput]:
    return run(backend, {"r": (prompt_ids, SamplingParams(**params))})["r"]


@pytest.fixture
def backend(tiny_model_dir):
    return TransformersBackend(tiny_model_dir, seed=0)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return GptOssForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()


def no_cache_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """The oracle: argmax of a full forward over the whole sequence, n times, no KV cache."""
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt_ids):]


# -- exactness ---------------------------------------------------------------
@pytest.mark.parametrize("prompt_len", [7, 140])  # 140: past the 128-token sliding window
def test_greedy_equals_a_no_cache_argmax_loop(backend, hf_model, prompt_len):
    prompt_ids = prompt(prompt_len, seed=prompt_len)
    got = tokens(decode_one(backend, prompt_ids, max_tokens=12, **GREEDY))
    assert got == no_cache_greedy(hf_model, prompt_ids, 12)


def test_greedy_equals_hf_generate(backend, hf_model):
    prompt_ids = prompt(20, seed=1)
    config = GenerationConfig(do_sample=False, max_new_tokens=30, min_new_tokens=30,
                              eos_token_id=None, pad_token_id=199999)
    with torch.inference_mode():
        expected = hf_model.generate(torch.tensor([prompt_ids]), generation_config=config)[0, 20:]
    assert tokens(decode_one(backend, prompt_ids, max_tokens=30, **GREEDY)) == expected.tolist()


def test_bf16_checkpoint_decodes_greedily_like_its_no_cache_oracle(tiny_model_dir_bf16):
    backend = TransformersBackend(tiny_model_dir_bf16)
    assert backend.describe()["dtype"] == "bfloat16"
    model = GptOssForCausalLM.from_pretrained(tiny_model_dir_bf16, attn_implementation="eager").eval()
    prompt_ids = prompt(9, seed=9)
    assert tokens(decode_one(backend, prompt_ids, max_tokens=8, **GREEDY)) == no_cache_greedy(model, prompt_ids, 8)


@pytest.mark.parametrize("params", [dict(**GREEDY), dict(temperature=1.0, seed=42),
                                    dict(temperature=0.7, top_k=50, top_p=0.9, seed=7)])
def test_a_request_decodes_the_same_alone_and_among_others(tiny_model_dir, params):
    target = (prompt(11, seed=0), SamplingParams(max_tokens=10, **params))
    alone = run(TransformersBackend(tiny_model_dir), {"target": target})["target"]
    others = {f"other{i}": (prompt(5 + 7 * i, seed=100 + i), SamplingParams(max_tokens=3 + 4 * i, seed=i))
              for i in range(4)}
    crowd = run(TransformersBackend(tiny_model_dir), {**others, "target": target})["target"]
    assert tokens(crowd) == tokens(alone)
    assert len(tokens(alone)) == 10


# -- sampling ------------------------------------------------------------------
def test_seed_reproduces_and_another_seed_differs(tiny_model_dir):
    def sampled(seed):
        backend = TransformersBackend(tiny_model_dir)
        return tokens(decode_one(backend, prompt(6, seed=3), max_tokens=16, temperature=1.0, seed=seed))

    assert sampled(5) == sampled(5)
    assert sampled(5) != sampled(6)


def test_unseeded_requests_derive_their_seed_from_backend_seed_and_request_id(tiny_model_dir):
    def sampled(backend_seed, request_id):
        backend = TransformersBackend(tiny_model_dir, seed=backend_seed)
        params = SamplingParams(max_tokens=16, temperature=1.0)
        return tokens(run(backend, {request_id: (prompt(6, seed=3), params)})[request_id])

    assert sampled(0, "a") == sampled(0, "a")
    assert sampled(0, "a") != sampled(0, "b")
    assert sampled(0, "a") != sampled(1, "a")
    assert derive_seed(0, "a") == derive_seed(0, "a") != derive_seed(0, "b")


def test_temperature_zero_is_argmax_whatever_the_seed():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert {sample(logits, SamplingParams(max_tokens=1, temperature=0), seed, 3) for seed in range(20)} == \
        {int(logits.argmax())}


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    logits = torch.tensor([0.0, 3.0, 2.9, 1.0, -2.0])  # probs ~ .03 .46 .42 .06 .00
    draw = lambda **p: {sample(logits, SamplingParams(max_tokens=1, **p), 0, i) for i in range(300)}  # noqa: E731
    assert draw(temperature=1.0) >= {0, 1, 2, 3}
    assert draw(temperature=1.0, top_k=2) == {1, 2}
    assert draw(temperature=1.0, top_p=0.5) == {1, 2}  # 0.46 < 0.5: the second token is needed
    assert draw(temperature=1.0, top_p=0.4) == {1}
    assert draw(temperature=1.0, top_k=1) == {1}


def test_top_k_one_sampling_equals_greedy_decoding(backend, tiny_model_dir):
    prompt_ids = prompt(8, seed=8)
    greedy = tokens(decode_one(backend, prompt_ids, max_tokens=8, **GREEDY))
    other = TransformersBackend(tiny_model_dir)
    assert tokens(decode_one(other, prompt_ids, max_tokens=8, temperature=1.3, top_k=1, seed=3)) == greedy


def test_temperature_scales_the_logits(backend, tiny_model_dir):
    prompt_ids = prompt(8, seed=8)
    greedy = tokens(decode_one(backend, prompt_ids, max_tokens=8, **GREEDY))
    cold = tokens(decode_one(TransformersBackend(tiny_model_dir), prompt_ids, max_tokens=8,
                             temperature=1e-3, seed=3))
    warm = tokens(decode_one(TransformersBackend(tiny_model_dir), prompt_ids, max_tokens=8,
                             temperature=1.0, seed=3))
    assert cold == greedy != warm


def test_logprobs_are_the_sampled_tokens_under_the_raw_distribution(backend, hf_model):
    prompt_ids = prompt(5, seed=5)
    outputs = decode_one(backend, prompt_ids, max_tokens=3, temperature=2.0, seed=1, logprobs=2)
    ids = list(prompt_ids)
    for out in outputs:
        with torch.inference_mode():
            log_probs = torch.log_softmax(hf_model(torch.tensor([ids]), use_cache=False).logits[0, -1], -1)
        token = out.new_token_ids[0]
        [found] = out.logprobs
        assert found.logprob == pytest.approx(log_probs[token].item(), abs=1e-4)
        assert [top for top, _ in found.top] == log_probs.topk(2).indices.tolist()
        assert [value for _, value in found.top] == pytest.approx(log_probs.topk(2).values.tolist(), abs=1e-4)
        ids.append(token)
    assert decode_one(TransformersBackend(hf_model.name_or_path), prompt_ids, max_tokens=2)[0].logprobs is None


# -- finishing -------------------------------------------------------------------
def test_streams_one_token_per_step_and_finishes_with_length_at_max_tokens(backend):
    outputs = decode_one(backend, prompt(4, seed=4), max_tokens=5, **GREEDY)
    assert [len(out.new_token_ids) for out in outputs] == [1] * 5
    assert [out.finish_reason for out in outputs] == [None] * 4 + ["length"]
    assert not backend.has_unfinished_requests()


def test_stop_token_finishes_with_stop_and_is_included(tiny_model_dir):
    prompt_ids = prompt(10, seed=10)
    free = tokens(decode_one(TransformersBackend(tiny_model_dir), prompt_ids, max_tokens=10, **GREEDY))
    stop_id = free[4]
    first = free.index(stop_id)  # the stop id may also occur earlier
    outputs = decode_one(TransformersBackend(tiny_model_dir), prompt_ids, max_tokens=10,
                         stop_token_ids=(stop_id, 200002), **GREEDY)
    assert tokens(outputs) == free[:first + 1]
    assert outputs[-1].finish_reason == "stop"


def test_ignore_eos_decodes_through_stop_tokens(tiny_model_dir):
    prompt_ids = prompt(10, seed=10)
    free = tokens(decode_one(TransformersBackend(tiny_model_dir), prompt_ids, max_tokens=10, **GREEDY))
    outputs = decode_one(TransformersBackend(tiny_model_dir), prompt_ids, max_tokens=10,
                         stop_token_ids=(free[2],), ignore_eos=True, **GREEDY)
    assert tokens(outputs) == free and outputs[-1].finish_reason == "length"


def test_full_context_finishes_with_length(tiny_model_dir):
    backend = TransformersBackend(tiny_model_dir, max_model_len=16)
    outputs = decode_one(backend, prompt(13, seed=13), max_tokens=100, **GREEDY)
    assert len(tokens(outputs)) == 3 and outputs[-1].finish_reason == "length"


def test_prompt_that_fills_the_context_is_refused(tiny_model_dir):
    backend = TransformersBackend(tiny_model_dir, max_model_len=16)
    with pytest.raises(ValueError, match="16 tokens"):
        backend.add_request("r", prompt(16, seed=1), SamplingParams(max_tokens=1))
    backend.add_request("ok", prompt(15, seed=1), SamplingParams(max_tokens=1))
    assert backend.has_unfinished_requests()


@pytest.mark.parametrize("prompt_ids, match", [([], "empty"), ([201088], r"\[0, 201088\)"), ([-1], "token ids")])
def test_bad_prompts_are_refused(backend, prompt_ids, match):
    with pytest.raises(ValueError, match=match):
        backend.add_request("r", prompt_ids, SamplingParams(max_tokens=1))
    assert not backend.has_unfinished_requests()


def test_a_request_id_in_flight_cannot_be_reused(backend):
    backend.add_request("r", [1, 2], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="already in flight"):
        backend.add_request("r", [1, 2], SamplingParams(max_tokens=1))
    assert [out.finish_reason for out in drain(backend)] == ["length"]
    backend.add_request("r", [1, 2], SamplingParams(max_tokens=1))  # finished ids may come back


def test_abort_reports_once_at_the_next_step_and_leaves_others_alone(tiny_model_dir):
    prompt_ids = prompt(6, seed=6)
    expected = tokens(decode_one(TransformersBackend(tiny_model_dir), prompt_ids, max_tokens=6, **GREEDY))
    backend = TransformersBackend(tiny_model_dir)
    backend.add_request("keep", prompt_ids, SamplingParams(max_tokens=6, **GREEDY))
    backend.add_request("drop", prompt(6, seed=7), SamplingParams(max_tokens=6, **GREEDY))
    backend.step(), backend.step()
    backend.abort("drop")
    backend.abort("unknown")  # ignored
    outputs = {out.request_id: out for out in backend.step()}
    assert outputs["drop"].finish_reason == "abort" and outputs["drop"].new_token_ids == []
    rest = drain(backend)
    assert {out.request_id for out in rest} == {"keep"}
    assert expected == expected[:2] + outputs["keep"].new_token_ids + tokens(rest)
    assert rest[-1].finish_reason == "length"


def test_outputs_carry_prompt_size_and_timings(backend):
    outputs = decode_one(backend, prompt(30, seed=30), max_tokens=4, **GREEDY)
    assert all(out.num_prompt_tokens == 30 and out.num_cached_tokens == 0 for out in outputs)
    assert outputs[0].prefill_s > 0 and outputs[0].decode_s == 0
    assert outputs[-1].prefill_s == outputs[0].prefill_s
    assert 0 < outputs[1].decode_s < outputs[-1].decode_s


# -- loading and description ---------------------------------------------------------
def test_load_backend_gives_a_described_backend(tiny_model_dir):
    backend = load_backend("transformers", tiny_model_dir, seed=3)
    assert isinstance(backend, Backend)
    assert backend.max_model_len == 4096 and backend.model_name == tiny_model_dir.name
    described = backend.describe()
    json.dumps(described)  # goes into a JSON column
    assert described["backend"] == "transformers" and described["dtype"] == "float32"
    assert described["model"] == str(tiny_model_dir) and described["seed"] == 3
    assert TransformersBackend(tiny_model_dir, dtype="bfloat16").describe()["dtype"] == "bfloat16"


def test_unknown_backend_and_bad_options_are_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="unknown backend"):
        load_backend("vllm", tiny_model_dir)
    with pytest.raises(ValueError, match="dtype"):
        TransformersBackend(tiny_model_dir, dtype="int3")
    with pytest.raises(ValueError, match="max_model_len"):
        TransformersBackend(tiny_model_dir, max_model_len=4097)


def _copy_checkpoint(src, dst, *, config=None, weights=True):
    dst.mkdir()
    (dst / "config.json").write_text(config if config is not None else (src / "config.json").read_text())
    if weights:
        (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    return dst


def test_model_load_errors_name_the_problem(tmp_path, tiny_model_dir):
    gpt2 = json.dumps({"model_type": "gpt2"})
    cases = [
        (tmp_path / "absent", "not a directory"),
        (_copy_checkpoint(tiny_model_dir, tmp_path / "noconfig", config=""), "not valid JSON"),
        (_copy_checkpoint(tiny_model_dir, tmp_path / "gpt2", config=gpt2), "model_type 'gpt2'"),
        (_copy_checkpoint(tiny_model_dir, tmp_path / "noweights", weights=False), "no \\*.safetensors"),
    ]
    (tmp_path / "empty").mkdir()
    cases.append((tmp_path / "empty", "no config.json in"))
    for path, match in cases:
        with pytest.raises(ModelLoadError, match=match) as info:
            load_backend("transformers", path)
        assert str(info.value).startswith(f"--model {path}:")


def test_missing_weights_are_an_error_not_random_values(tmp_path):
    small = make_random_checkpoint(tmp_path / "two", hidden_size=16, head_dim=8, intermediate_size=16)
    three_layers = json.loads((small / "config.json").read_text())
    three_layers.update(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention"] * 1
                        + ["sliding_attention"])
    (small / "config.json").write_text(json.dumps(three_layers))
    with pytest.raises(ModelLoadError, match="missing.*layers.2"):
        load_backend("transformers", small)
