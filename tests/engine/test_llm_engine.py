"""The engine end to end on a real tiny checkpoint, against the transformers reference."""

import pytest

from engine.api import Backend, SamplingParams
from engine.factory import load_backend
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def prompt(i: int, length: int) -> list[int]:
    return [1000 + (i * 131 + j * 17) % 50000 for j in range(length)]


def decode(backend, prompts: dict, sampling=GREEDY) -> dict:
    for request_id, ids in prompts.items():
        backend.add_request(request_id, ids, sampling)
    out = {request_id: [] for request_id in prompts}
    while backend.has_unfinished_requests():
        for o in backend.step():
            out[o.request_id] += o.new_token_ids
    return out


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return load_backend("transformers", tiny_model_dir)


def engine(model_dir, **options) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir, kv_cache_gb=options.pop("kv_cache_gb", 0.05), **options))


def test_engine_is_a_backend_and_matches_reference_greedy_tokens(tiny_model_dir, reference):
    prompts = {f"r{i}": prompt(i, n) for i, n in enumerate([5, 40, 150, 17, 260])}  # some past the window
    ours = engine(tiny_model_dir, max_num_batched_tokens=64)  # long prompts prefill in chunks
    assert isinstance(ours, Backend)
    assert decode(ours, prompts) == decode(reference, prompts)


def test_alone_and_in_a_batch_of_32_give_identical_tokens(tiny_model_dir):
    target = prompt(7, 33)
    seeded = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)
    for sampling in (GREEDY, seeded):
        alone = decode(engine(tiny_model_dir), {"t": target}, sampling)["t"]
        crowd = {f"o{i}": prompt(i, 3 + 7 * i) for i in range(31)}
        together = decode(engine(tiny_model_dir), {**crowd, "t": target}, sampling)["t"]
        assert alone == together


def test_preemption_gives_the_same_greedy_tokens(tiny_model_dir):
    prompts = {f"r{i}": prompt(i, 60) for i in range(6)}
    roomy = engine(tiny_model_dir)
    # 24 blocks of 16 tokens: not enough for six 72-token sequences at once
    block_bytes = roomy.num_blocks and (0.05 * 2**30) / roomy.num_blocks
    tight = engine(tiny_model_dir, kv_cache_gb=24 * block_bytes / 2**30, max_model_len=128)
    assert decode(tight, prompts) == decode(roomy, prompts)
    assert tight.scheduler.num_preemptions > 0


def test_next_turn_reuses_the_cached_prefix(tiny_model_dir):
    ours = engine(tiny_model_dir)
    first = prompt(1, 100)
    turn1 = decode(ours, {"a/0": first})["a/0"]
    second = first + turn1 + prompt(2, 9)
    ours.add_request("a/1", second, GREEDY)
    cached = None
    while ours.has_unfinished_requests():
        for o in ours.step():
            cached = o.num_cached_tokens
    # every full block whose KV turn 1 computed is a hit: its last sampled token was never fed
    # back, so 111 of the 112 tokens have KV, and 6 full blocks of 16 are reused
    assert cached == (len(first) + len(turn1) - 1) // 16 * 16 == 96
    assert ours.stats()["prefix_hit_rate"] > 0


def test_abort_and_stop_tokens(tiny_model_dir):
    ours = engine(tiny_model_dir)
    ours.add_request("x", prompt(0, 10), GREEDY)
    ours.add_request("y", prompt(1, 10), GREEDY)
    ours.step()
    ours.abort("x")
    finished = {}
    while ours.has_unfinished_requests():
        for o in ours.step():
            if o.finish_reason:
                finished[o.request_id] = o.finish_reason
    assert finished == {"x": "abort", "y": "length"}
    first_token = decode(engine(tiny_model_dir), {"z": prompt(3, 10)})["z"][0]
    stop = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(first_token,))
    assert decode(engine(tiny_model_dir), {"z": prompt(3, 10)}, stop)["z"] == [first_token]


def test_kv_budget_bounds_the_context(tiny_model_dir):
    small = engine(tiny_model_dir, kv_cache_gb=0.001)
    # hybrid layout: a full-layer block for every 16 tokens, and the sliding layers' window and a chunk (or, shorter
    # than that, every token: half the blocks)
    reserve = (128 - 1 + small.config.step_tokens) // 16 + 2
    assert small.kv_layout.is_hybrid and small.max_model_len == max(small.num_blocks // 2,
                                                                    small.num_blocks - reserve) * 16
    roomier = engine(tiny_model_dir, kv_cache_gb=0.001, max_num_batched_tokens=256)  # ~260 blocks
    assert roomier.max_model_len == (roomier.num_blocks - (127 + 256) // 16 - 2) * 16 > roomier.num_blocks // 2 * 16
    with pytest.raises(ValueError):
        small.add_request("big", prompt(0, small.max_model_len), GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        small.add_request("bad", [300_000], GREEDY)


def test_an_fp8_kv_cache_holds_twice_the_tokens_and_decodes_like_the_models_dtype(tiny_model_dir):
    import torch

    auto, fp8 = (engine(tiny_model_dir, kv_cache_dtype=dtype) for dtype in ("auto", "fp8"))
    assert auto.describe()["kv_cache_dtype"] == str(auto.dtype).removeprefix("torch.")  # the model's: fp32 on CPU
    assert fp8.describe()["kv_cache_dtype"] == "float8_e4m3fn"
    # the same --kv-cache-gb holds as many more tokens as the model's dtype has bytes
    assert fp8.num_blocks // auto.num_blocks == auto.dtype.itemsize > 1
    assert all(k.dtype == v.dtype == torch.float8_e4m3fn for k, v in fp8.runner.kv_caches)
    prompts = {f"r{i}": prompt(i, n) for i, n in enumerate([5, 40, 150, 17, 260])}  # some past the window
    theirs = decode(auto, prompts)
    # each K and V value rounded to 3 mantissa bits: the next token after each of the model's-dtype run's prefixes
    # (teacher forced: one early near tie would part two free runs for good) is nearly always the same
    forced = {f"{request}.{j}": prompts[request] + theirs[request][:j] for request in prompts for j in range(12)}
    ours = decode(fp8, forced, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    agreeing = sum(ours[f"{request}.{j}"] == [theirs[request][j]] for request in prompts for j in range(12))
    assert agreeing >= 0.9 * len(forced), (agreeing, len(forced))  # 57 of 60 when written


def test_an_unknown_kv_cache_dtype_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp4'; use one of auto, fp8"):
        EngineConfig(tiny_model_dir, kv_cache_dtype="fp4")


def test_stats_split_the_model_time_by_step_size(tiny_model_dir):
    # two 40-token prompts prefill in one 80-token step, then 11 decode steps of 2 tokens each
    ours = engine(tiny_model_dir, async_scheduling=False)
    decode(ours, {"a": prompt(0, 40), "b": prompt(1, 40)})
    stats = ours.stats()
    split = dict(part.split(":") for part in stats["forward_by_tokens"].split())
    assert list(split) == ["2", "65-256"]
    assert split["2"].split("/")[0] == "11" and split["65-256"].split("/")[0] == "1"
    seconds = sum(float(value.split("/")[1].rstrip("s")) for value in split.values())
    assert seconds == pytest.approx(stats["forward_s"], rel=0.01)


def test_the_hybrid_cache_gives_the_uniform_caches_tokens_and_runs_more_at_once(tiny_model_dir):
    """Prompts past the 128-token window, decoding 60 tokens each in a cache of 96 uniform blocks' bytes: the
    sliding layers' blocks go back once they leave the window, so four sequences run at once where three did (fewer
    steps), with the same tokens; then two requests sharing a 300-token prefix hit it, the window before the hit
    included."""
    sampling = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    block_bytes = 0.05 / engine(tiny_model_dir, hybrid_kv_cache=False).num_blocks
    shared = prompt(9, 300)
    tokens, engines = {}, {}
    for hybrid in (False, True):
        llm = engines[hybrid] = engine(tiny_model_dir, hybrid_kv_cache=hybrid, kv_cache_gb=96.25 * block_bytes,
                                       max_model_len=512)
        tokens[hybrid] = [decode(llm, {f"r{i}": prompt(i, 380 + 10 * i) for i in range(4)}, sampling),
                          decode(llm, {"a": shared + prompt(1, 20)}, sampling),
                          decode(llm, {"b": shared + prompt(2, 30)}, sampling)]
    uniform, hybrid = engines[False], engines[True]
    assert (uniform.kv_layout.describe(), hybrid.describe()["kv_layout"]) == ("uniform", "hybrid")
    assert (uniform.num_blocks, hybrid.num_blocks) == (96, 192) and hybrid.max_model_len == uniform.max_model_len
    assert tokens[True] == tokens[False]
    assert hybrid.num_steps < uniform.num_steps
    # the stats say how full each cache got: the hybrid one held more sequences in fewer bytes a sequence
    peaks = {llm.kv_layout.describe(): llm.stats()["kv_peak_blocks"] for llm in (uniform, hybrid)}
    assert 0 < peaks["uniform"] <= 96 and 0 < peaks["hybrid"] <= 192
    assert uniform.stats()["kv_peak_usage"] == peaks["uniform"] / 96
    assert hybrid.block_manager.num_hit_tokens == uniform.block_manager.num_hit_tokens == 288
    assert hybrid.block_manager.num_free_blocks == hybrid.num_blocks
