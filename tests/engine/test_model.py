"""GptOssModel on a paged cache gives transformers' eager gpt-oss logits, step by step, in mixed batches."""

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.attention import AttentionMetadata
from engine.checkpoint import make_random_checkpoint
from engine.config import EngineConfig, ModelConfig
from engine.kernels import triton_available
from engine.loader import load_model
from engine.model import allocate_kv_cache, rope_inv_freq


def token_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(201088) for _ in range(n)]


class PagedRun:
    """Drives the model the way the runner will: flat steps over sequences holding shuffled blocks."""

    def __init__(self, model, config: ModelConfig, *, block_size: int, num_blocks: int = 256, seed: int = 0,
                 dtype: torch.dtype = torch.float32):
        self.model, self.block_size = model, block_size
        self.kv_caches = allocate_kv_cache(config, num_blocks, block_size, dtype, "cpu")
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}

    def share_prefix(self, name: str, other: str, num_tokens: int) -> None:
        """`name` starts with `other`'s first num_tokens (whole blocks) already cached: a prefix-cache hit."""
        if num_tokens % self.block_size:
            raise ValueError("a shared prefix is whole blocks")
        self.tables[name] = self.tables[other][: num_tokens // self.block_size]
        self.num_cached[name] = num_tokens

    def step(self, work: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """work: sequence -> its new token ids this step. Returns sequence -> hidden [num_new, hidden]."""
        ids, positions, slots, seq_lens = [], [], [], []
        for name, new_ids in work.items():
            start = self.num_cached.get(name, 0)
            table = self.tables.setdefault(name, [])
            while len(table) * self.block_size < start + len(new_ids):
                table.append(self.free.pop())
            for pos in range(start, start + len(new_ids)):
                positions.append(pos)
                slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            ids += new_ids
            seq_lens.append(start + len(new_ids))
            self.num_cached[name] = start + len(new_ids)
        width = max(len(self.tables[n]) for n in work) + 1
        counts = torch.tensor([len(v) for v in work.values()])
        meta = AttentionMetadata(
            positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
            query_start_loc=torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]),
            seq_lens=torch.tensor(seq_lens),
            block_tables=torch.tensor([self.tables[n] + [-1] * (width - len(self.tables[n])) for n in work]),
            block_size=self.block_size)
        with torch.inference_mode():
            hidden = self.model(torch.tensor(ids), meta, self.kv_caches)
        return dict(zip(work, hidden.split(counts.tolist())))


def hf_hidden(hf, ids: list[int]) -> torch.Tensor:
    """transformers' final-norm hidden states for the whole sequence, no cache: [len, hidden]."""
    with torch.inference_mode():
        return hf.model(torch.tensor([ids]), use_cache=False).last_hidden_state[0]


@pytest.fixture(scope="module")
def small_window_dir(tmp_path_factory):
    return make_random_checkpoint(tmp_path_factory.mktemp("window8"), seed=3, sliding_window=8, num_hidden_layers=3)


@pytest.mark.parametrize("which,block_size", [("tiny", 16), ("window8", 5)])
def test_mixed_steps_match_transformers(which, block_size, tiny_model_dir, small_window_dir):
    """Chunked prefill, whole prompts, a prefix-cache hit and decodes in shared flat steps."""
    model_dir = tiny_model_dir if which == "tiny" else small_window_dir
    model, config = load_model(EngineConfig(model_dir))
    hf = GptOssForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                           experts_implementation="eager").eval()
    seqs = {"a": token_ids(264, 1), "b": token_ids(155, 2), "c": token_ids(4, 3), "d": token_ids(141, 4)}
    seqs["e"] = seqs["b"][:80] + token_ids(70, 5)  # shares b's first 80 tokens (5 blocks of 16; 16 of 5)
    schedule = [  # sequence -> (first, last) token index fed that step
        {"a": (0, 100), "b": (0, 151), "c": (0, 1)},
        {"a": (100, 200), "b": (151, 152), "c": (1, 2), "d": (0, 137)},
        {"e": (80, 146), "a": (200, 260), "b": (152, 153), "c": (2, 3), "d": (137, 138)},
    ] + [{name: (n, n + 1) for name, n in (("a", 260 + i), ("b", 153 + i), ("d", 138 + i), ("e", 146 + i))}
         | ({"c": (3, 4)} if i == 0 else {}) for i in range(2)]
    run = PagedRun(model, config, block_size=block_size)
    want_hidden = {name: hf_hidden(hf, ids) for name, ids in seqs.items()}
    worst_hidden = worst_logits = 0.0
    for step in schedule:
        if "e" in step and "e" not in run.tables:
            run.share_prefix("e", "b", 80)
        got = run.step({name: seqs[name][lo:hi] for name, (lo, hi) in step.items()})
        for name, (lo, hi) in step.items():
            want = want_hidden[name][lo:hi]
            worst_hidden = max(worst_hidden, (got[name] - want).abs().max().item())
            with torch.inference_mode():  # the runner samples from each sequence's last new token
                logits, want_logits = model.compute_logits(got[name][-1:]), hf.lm_head(want[-1:]).float()
            worst_logits = max(worst_logits, (logits - want_logits).abs().max().item())
    print(f"max |hidden diff| {worst_hidden:.2e}, max |logits diff| {worst_logits:.2e}")
    assert worst_hidden < 1e-4 and worst_logits < 1e-4, (worst_hidden, worst_logits)


def test_bf16_is_as_close_to_fp32_as_transformers_bf16_is(tiny_model_dir_bf16):
    """bf16 rounds differently in every implementation: measure both against fp32 on the same weights."""
    model, config = load_model(EngineConfig(tiny_model_dir_bf16))
    assert model.lm_head.weight.dtype == torch.bfloat16
    hf = {dtype: GptOssForCausalLM.from_pretrained(tiny_model_dir_bf16, attn_implementation="eager",
                                                   experts_implementation="eager", dtype=dtype).eval()
          for dtype in (torch.bfloat16, torch.float32)}
    run = PagedRun(model, config, block_size=16, dtype=torch.bfloat16)
    ids = token_ids(150, 7)
    hidden = torch.cat([run.step({"x": ids[:140]})["x"][-1:], run.step({"x": ids[140:141]})["x"]])
    with torch.inference_mode():
        logits = model.compute_logits(hidden)
        hf_bf16, exact = (hf[dtype](torch.tensor([ids[:141]])).logits[0, [139, 140]].float() for dtype in hf)
    assert logits.dtype == torch.float32
    engine_error, hf_error = (logits - exact).abs().max(), (hf_bf16 - exact).abs().max()
    print(f"bf16 max |logits - fp32 logits|: engine {engine_error:.3f}, transformers {hf_error:.3f}")
    assert engine_error < 1.5 * hf_error


def test_compute_logits_is_the_lm_head(tiny_model_dir):
    model, _ = load_model(EngineConfig(tiny_model_dir))
    hidden = torch.randn(3, 64)
    with torch.inference_mode():
        torch.testing.assert_close(model.compute_logits(hidden), hidden @ model.lm_head.weight.T)


@pytest.mark.parametrize("rope", [
    dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=4096,
         truncate=False),
    dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=2048),  # truncate defaults to True
    dict(rope_type="default"),
])
def test_rope_frequencies_match_transformers(rope):
    hf_config = GptOssConfig(head_dim=64, rope_parameters={**rope, "rope_theta": 150000.0})
    config = ModelConfig.from_hf(hf_config)
    inv_freq, scaling = rope_inv_freq(config)
    if rope["rope_type"] == "default":
        want = 1.0 / 150000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64)
        want_scaling = 1.0
    else:
        want, want_scaling = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    torch.testing.assert_close(inv_freq, want, rtol=0, atol=0)
    assert scaling == pytest.approx(want_scaling)
    assert math.isfinite(scaling)


def test_kv_cache_count_mismatch_is_an_error(tiny_model_dir):
    model, config = load_model(EngineConfig(tiny_model_dir))
    meta = AttentionMetadata(torch.tensor([0]), torch.tensor([0]), torch.tensor([0, 1]), torch.tensor([1]),
                             torch.tensor([[0]]), 16)
    with pytest.raises(ValueError, match="KV caches"):
        model(torch.tensor([1]), meta, allocate_kv_cache(config, 2, 16, torch.float32, "cpu")[:1])


def _rss_mb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_kv_cache_is_zero_and_resident_only_where_written(dtype):
    config = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=8, head_dim=64)  # what it reads
    num_blocks, block_size = 4096, 16  # 2 layers x (k, v) x 4096 x 16 x heads x head_dim: hundreds of MB
    size_mb = 2 * 2 * num_blocks * block_size * config.num_key_value_heads * config.head_dim * dtype.itemsize >> 20
    before = _rss_mb()
    caches = allocate_kv_cache(config, num_blocks, block_size, dtype, "cpu")
    grown = _rss_mb() - before
    assert size_mb >= 128 and grown < size_mb // 8, f"{grown} MB resident of a {size_mb} MB cache no token wrote"
    k_cache, v_cache = caches[1]
    assert k_cache.shape == (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    assert k_cache.dtype == dtype and k_cache.is_contiguous()
    assert not k_cache[-1].any() and not v_cache[1234].any()
    k_cache[7, 3] = 1.5  # writable, and only that slot changed
    assert k_cache[7, 3].eq(1.5).all() and k_cache[7].sum().item() == 1.5 * config.num_key_value_heads * config.head_dim


@pytest.mark.skipif(not triton_available(), reason="needs triton (pip install 'batchrun[gpu]')")
def test_the_triton_path_projects_q_k_v_in_one_gemm_over_the_loaded_weights(tiny_model_dir):
    from safetensors.torch import load_file

    model, config = load_model(EngineConfig(tiny_model_dir, kernels="triton"))
    attention = model.model.layers[1].self_attn
    weight, bias = attention.qkv
    assert attention.q_proj.weight.data_ptr() == weight.data_ptr()  # the parameters are views: loading wrote through
    saved = load_file(tiny_model_dir / "model.safetensors")
    assert torch.equal(weight, torch.cat([saved[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv"]))
    assert torch.equal(bias, torch.cat([saved[f"model.layers.1.self_attn.{n}_proj.bias"] for n in "qkv"]))
    x = torch.randn(5, config.hidden_size)
    with torch.inference_mode():
        q, k, v = attention._project_tied(x)
        for got, projection in ((q, attention.q_proj), (k, attention.k_proj), (v, attention.v_proj)):
            torch.testing.assert_close(got.flatten(1), projection(x), rtol=1e-5, atol=1e-5)
    assert attention._tied()
    model.double()  # new tensors for every parameter: tied again, in the new dtype, with no stale copy
    assert attention._tied() and attention.qkv[0].dtype == torch.float64
    assert torch.equal(attention.qkv[0].float(), weight)
    attention.k_proj.weight = torch.nn.Parameter(attention.k_proj.weight.clone())  # replaced outright: untied
    assert not attention._tied()
    assert load_model(EngineConfig(tiny_model_dir, kernels="torch"))[0].model.layers[1].self_attn.qkv is None
