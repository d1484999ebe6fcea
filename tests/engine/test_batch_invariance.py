"""Batch invariance (EngineConfig.deterministic): a request's logits are the same bits decoded alone or
among others, in prefill chunks of any size, with prefix-cache hits or not, with preemption or not.

Every logits row the engine samples from is captured (tests.support.logits_capture) and compared
bitwise with the request decoded alone in a fresh engine (one prefill chunk, no prefix hits, no
preemption). The compositions are random (seeded): which requests share the run, when each arrives,
the step's token budget (so where prompts are cut into chunks), the cache size (so who is preempted).
"""

import random

import pytest
import torch

from engine.api import SamplingParams
from engine.checkpoint import make_random_checkpoint
from engine.config import EngineConfig, ModelConfig
from engine.kernels import triton_available
from engine.llm_engine import LLMEngine
from engine.model import kv_cache_bytes_per_block
from tests.support.logits_capture import Request, decode_capturing

BLOCK_SIZE = 16
WINDOW = 24  # sliding layers: prompts run well past the window
SHARED_PREFIX = 2 * BLOCK_SIZE + 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random model with a small vocabulary (fast logits) and a short sliding window."""
    return make_random_checkpoint(tmp_path_factory.mktemp("invariance"), seed=3, dtype=torch.float32,
                                  vocab_size=1024, sliding_window=WINDOW, eos_token_id=1023,
                                  pad_token_id=1022, bos_token_id=1021)


def make_requests(rng: random.Random, num: int, max_tokens: int, max_prompt: int,
                  lengths: list[int] | None = None) -> list[Request]:
    """Mixed lengths (random, or `lengths`); every other request starts with a shared prefix of
    SHARED_PREFIX tokens (prefix-cache hits); sampled at T=1."""
    shared = [rng.randrange(1, 1000) for _ in range(SHARED_PREFIX)]
    requests = []
    for i in range(num):
        length = lengths[i] if lengths else rng.randrange(1, max_prompt)
        prompt = [rng.randrange(1, 1000) for _ in range(length)]
        if i % 2:
            prompt = shared + prompt
        sampling = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=100 + i, ignore_eos=True)
        requests.append(Request(f"r{i}", prompt, sampling))
    return requests


def engine(model_dir, *, blocks: int = 256, **options) -> LLMEngine:
    """An engine whose KV cache holds `blocks` blocks (few: preemption)."""
    block_bytes = kv_cache_bytes_per_block(ModelConfig.from_pretrained(model_dir), BLOCK_SIZE, torch.float32)
    return LLMEngine(EngineConfig(model_dir, block_size=BLOCK_SIZE, kv_cache_gb=blocks * block_bytes / 2**30,
                                  **options))


def alone(model_dir, requests: list[Request], **options) -> dict:
    """Each request in its own fresh engine, its prompt in one chunk: the reference logits."""
    reference = {}
    for request in requests:
        llm = engine(model_dir, deterministic=True, max_num_batched_tokens=4096, **options)
        reference.update(decode_capturing(llm, [request])[1])
    return reference


def composition(rng: random.Random, requests: list[Request]) -> tuple[list[Request], dict]:
    """A random batch composition: a random subset, random arrival steps, token budget and cache size."""
    chosen = rng.sample(requests, rng.randrange(2, len(requests) + 1))
    staggered = [Request(r.request_id, r.prompt, r.sampling, rng.choice([0, 0, 1, 3, 6])) for r in chosen]
    options = dict(max_num_batched_tokens=rng.choice([5, 16, 23, 64, 4096]), max_num_seqs=rng.choice([2, 3, 64]),
                   blocks=rng.choice([12, 16, 256]), enable_prefix_caching=rng.random() < 0.8)
    return staggered, options


def assert_same_logits(reference: dict, captured: dict, label: str) -> None:
    assert captured, label
    for key, logits in captured.items():
        assert torch.equal(logits, reference[key]), f"{label}: logits of {key} differ"


def test_logits_are_bitwise_identical_alone_and_in_random_batches(model_dir):
    rng = random.Random(0)
    requests = make_requests(rng, num=6, max_tokens=16, max_prompt=60)
    reference = alone(model_dir, requests)
    preempted = hits = 0
    for trial in range(8):
        # the first: everyone at once in a cache too small for them (preemption)
        chosen, options = (requests, dict(blocks=10, max_num_batched_tokens=32)) if trial == 0 \
            else composition(rng, requests)
        llm = engine(model_dir, deterministic=True, **options)
        _, captured = decode_capturing(llm, chosen)
        assert_same_logits(reference, captured, f"composition {trial} {options}")
        assert len(captured) == sum(r.sampling.max_tokens for r in chosen)
        preempted += llm.scheduler.num_preemptions
        hits += llm.block_manager.hit_rate > 0
    assert preempted and hits  # the compositions did exercise preemption and prefix-cache hits


def test_without_deterministic_batches_change_the_logits(model_dir):
    """The control: the plain torch path's logits depend on the batch (so the test above can fail)."""
    rng = random.Random(1)
    requests = make_requests(rng, num=6, max_tokens=3, max_prompt=40)
    reference = {}
    for request in requests:
        reference.update(decode_capturing(engine(model_dir, max_num_batched_tokens=4096), [request])[1])
    _, captured = decode_capturing(engine(model_dir, max_num_batched_tokens=16), requests)
    assert any(not torch.equal(logits, reference[key]) for key, logits in captured.items())


@pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install batchrun[gpu])")
@pytest.mark.slow  # ~30-45 s interpreted; slow only: the default run keeps the torch path's (above)
def test_triton_kernels_logits_are_bitwise_identical_alone_and_batched(model_dir):
    """The Triton kernels (interpreted on CPU): every row through one attention kernel, fixed MoE tiles."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Prompts that end on a block boundary (16, 35 + 13 = 48): the first new token of each needs a block.
    requests = make_requests(random.Random(2), num=4, max_tokens=3, max_prompt=16, lengths=[16, 13, 16, 13])
    reference = alone(model_dir, requests, kernels="triton", device=device)
    # Chunks of 13 tokens, r3 arriving after r1 has cached their shared prefix; then every prompt at once
    # in 8 blocks, which the prompts fill (preemption at the first decode step).
    trials = [(13, 256, [0, 0, 2, 8]), (4096, 8, [0, 0, 0, 0])]
    hits = preempted = 0
    for budget, blocks, arrivals in trials:
        llm = engine(model_dir, deterministic=True, kernels="triton", device=device,
                     max_num_batched_tokens=budget, blocks=blocks)
        staggered = [Request(r.request_id, r.prompt, r.sampling, step) for r, step in zip(requests, arrivals)]
        _, captured = decode_capturing(llm, staggered)
        assert_same_logits(reference, captured, f"triton, budget {budget}, {blocks} blocks")
        hits += llm.block_manager.hit_rate > 0
        preempted += llm.scheduler.num_preemptions
    assert hits and preempted
