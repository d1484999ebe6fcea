"""The Triton paged attention (engine.kernels.attention) equals the torch path (engine.attention).

Without CUDA the kernels run in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, chosen
before the kernel module is imported), so shapes stay tiny; with CUDA the same tests run natively
(marked gpu), and a larger gpt-oss-20b-shaped case runs too.
"""

import math
from pathlib import Path

import pytest
import torch

from engine.attention import AttentionMetadata, paged_attention, to_cache_dtype
from engine.kernels import PARTITION_SIZE, decode_partition, require_triton, triton_available

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)  # CPU: the interpreter, set before the decorators in the kernel module run
import engine.kernels.attention as kernels  # noqa: E402
from engine.kernels.attention import triton_paged_attention  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")


def make_step(seqs, *, block_size, num_heads=8, num_kv_heads=2, head_dim=16, shared_blocks=0,
              dtype=torch.float32, cache_dtype=None, seed=0, host_bounds=True):
    """A step of sequences given as (num_cached, num_new) over a random cache with shuffled blocks.

    Every slot of the cache holds random values (earlier steps' K/V, and stale garbage the kernels
    must not read); the first `shared_blocks` blocks of every sequence are the same physical blocks,
    as after a prefix-cache hit. Returns (q, k_cache, v_cache, meta, sinks): the caches in `cache_dtype` (as the engine
    writes it), else in `dtype`.
    """
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(math.ceil((c + n) / block_size) for c, n in seqs) + 4
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    shared = [pool.pop() for _ in range(shared_blocks)]
    width = max(math.ceil((c + n) / block_size) for c, n in seqs) + 2  # extra -1 padding columns
    tables = []
    for num_cached, num_new in seqs:
        assert num_cached >= shared_blocks * block_size, "a prefix hit covers cached tokens only"
        own = [pool.pop() for _ in range(math.ceil((num_cached + num_new) / block_size) - shared_blocks)]
        tables.append(shared + own + [-1] * (width - shared_blocks - len(own)))
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    new = [n for _, n in seqs]
    q = torch.randn(sum(new), num_heads, head_dim, generator=gen)
    sinks = 2 * torch.randn(num_heads, generator=gen)  # some heads put most weight on the sink
    seq_lens = [c + n for c, n in seqs]
    positions = torch.cat([torch.arange(c, c + n) for c, n in seqs])
    meta = AttentionMetadata(
        positions=positions, slot_mapping=torch.zeros_like(positions),  # unused by attention
        query_start_loc=torch.tensor([0, *new]).cumsum(0), seq_lens=torch.tensor(seq_lens),
        block_tables=torch.tensor(tables), block_size=block_size,
        max_query_len=max(new) if host_bounds else None, max_seq_len=max(seq_lens) if host_bounds else None)
    to = dict(device=DEVICE)
    meta.positions, meta.query_start_loc, meta.seq_lens, meta.block_tables = (
        t.to(**to) for t in (meta.positions, meta.query_start_loc, meta.seq_lens, meta.block_tables))
    k_cache, v_cache = (to_cache_dtype(cache.to(dtype=dtype, **to), cache_dtype or dtype)
                        for cache in (k_cache, v_cache))
    return q.to(dtype=dtype, **to), k_cache, v_cache, meta, sinks.to(dtype=dtype, **to)


def check(seqs, *, window, atol=1e-5, partition=None, table_ahead=True, **step):
    q, k_cache, v_cache, meta, sinks = make_step(seqs, **step)
    scale = q.shape[-1] ** -0.5
    want = paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=window, scale=scale)
    got = triton_paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=window, scale=scale,
                                 partition=partition, table_ahead=table_ahead)
    assert got.shape == want.shape and got.dtype == want.dtype
    starts = meta.query_start_loc.tolist()
    for i, seq in enumerate(seqs):
        rows = slice(starts[i], starts[i + 1])
        torch.testing.assert_close(got[rows].float(), want[rows].float(), atol=atol, rtol=0,
                                   msg=lambda m, i=i, seq=seq: f"sequence {i} {seq}: {m}")


# (num_cached, num_new): fresh prompts, a chunk after cached tokens, decodes at and past block edges.
RAGGED = [(0, 9), (20, 1), (7, 1), (0, 1), (15, 1), (16, 1), (21, 12), (40, 1), (3, 4)]


@pytest.mark.parametrize(("window", "block_size"), [(None, 16), (8, 5), (13, 8)])
@pytest.mark.parametrize("table_ahead", [True, False], ids=["ids-ahead", "ids-in-tile"])
def test_a_ragged_batch_of_decode_and_prefill_rows_matches(window, block_size, table_ahead):
    # windows of 8 and 13 over blocks of 5 and 8: windows start mid-block and span block edges; each key tile's
    # block ids read an iteration ahead (the default) or in its own
    check(RAGGED, window=window, block_size=block_size, table_ahead=table_ahead)


@pytest.mark.parametrize("window", [None, 6])
def test_decode_only_and_prefill_only_batches_match(window):
    check([(30, 1), (0, 1), (11, 1)], window=window, block_size=4)
    check([(0, 19), (9, 7)], window=window, block_size=4)


@pytest.mark.parametrize("window", [None, 40])
def test_split_k_decode_over_several_partitions_matches(window, monkeypatch):
    monkeypatch.setattr(kernels, "DECODE_BLOCK_N", 16)
    # partitions of 16 keys: up to 7 a sequence, 3 within a window (the reduce over them), the last partial; 24
    # keys a partition: a key tile ends mid-partition; 3 keys: up to 34 partitions, the reduce's loop over them in
    # steps of REDUCE_BLOCK_P
    assert 99 // 3 > 2 * kernels.REDUCE_BLOCK_P
    for partition in (16, 24, 3):
        check([(99, 1), (16, 1), (0, 1), (47, 1), (63, 1), (30, 5)], window=window, block_size=8, partition=partition)


def test_a_step_of_few_sequences_splits_their_keys_finer():
    # 2 sequences x 2 KV heads of 600 keys: too few programs at PARTITION_SIZE, so partitions of two key tiles
    assert decode_partition(2, 2, 600) == 2 * kernels.DECODE_BLOCK_N < PARTITION_SIZE
    assert decode_partition(256, 8, 600) == PARTITION_SIZE  # a full batch keeps the largest
    check([(599, 1), (200, 1)], window=None, block_size=16)


@pytest.mark.parametrize("window", [None, 20])
def test_sequences_sharing_prefix_blocks_read_them_in_place(window):
    # three sequences over the same 3 physical blocks: two decode, one prefills a chunk after the hit
    check([(40, 1), (24, 1), (24, 9)], window=window, block_size=8, shared_blocks=3)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 4, 64), (6, 2, 24), (8, 1, 16)])
def test_gqa_groups_and_head_dims(num_heads, num_kv_heads, head_dim):
    # groups of 1, 3 (padded to 4) and 8; head_dim 24 is padded to 32 inside the kernels
    check([(0, 6), (10, 1), (5, 3)], window=4, block_size=4, num_heads=num_heads, num_kv_heads=num_kv_heads,
          head_dim=head_dim)


def test_metadata_without_host_bounds_is_read_from_the_tensors():
    check([(0, 7), (12, 1)], window=None, block_size=4, host_bounds=False)


def test_bf16_matches_within_bf16_rounding():
    # the torch path rounds scores to bf16 before its softmax; the kernels keep them in fp32
    check(RAGGED, window=8, block_size=5, dtype=torch.bfloat16, atol=3e-2)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_an_fp8_cache_is_read_as_the_model_dtype(dtype, atol):
    # the keys and values widen exactly, so an fp8 cache matches as closely as one in the model's dtype
    check(RAGGED, window=8, block_size=5, dtype=dtype, cache_dtype=torch.float8_e4m3fn, atol=atol)
    check([(20, 1), (0, 9), (33, 1)], window=None, block_size=4, dtype=dtype, cache_dtype=torch.float8_e4m3fn,
          atol=atol)


def test_k_and_v_caches_laid_out_differently_are_refused():
    # the kernels address a key and its value with one offset: a V cache of other strides would be misread
    q, k_cache, v_cache, meta, sinks = make_step([(4, 1)], block_size=4)
    v_other = v_cache.transpose(0, 1).contiguous().transpose(0, 1)  # the same values, blocks not outermost
    with pytest.raises(ValueError, match="laid out alike"):
        triton_paged_attention(q, k_cache, v_other, meta, sinks=sinks, sliding_window=None, scale=0.25)


def test_the_wrapper_reads_nothing_back_to_the_host_when_the_runner_gives_the_bounds(monkeypatch):
    q, k_cache, v_cache, meta, sinks = make_step(RAGGED, block_size=8)

    def host_read(*args, **kwargs):
        raise AssertionError("a host read in the attention wrapper")

    for name in ("item", "tolist", "__int__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    out = triton_paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=8, scale=0.25)
    monkeypatch.undo()
    want = paged_attention(q, k_cache, v_cache, meta, sinks=sinks, sliding_window=8, scale=0.25)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("window", [None, 128])
def test_gpt_oss_20b_shapes_on_the_gpu(window):
    # 64 query heads over 8 KV heads, head_dim 64, bf16; contexts of several default-size partitions
    seqs = [(4000, 1), (700, 1), (127, 1), (128, 1), (1000, 300), (0, 513), (2047, 1)]
    check(seqs, window=window, block_size=16, num_heads=64, num_kv_heads=8, head_dim=64, dtype=torch.bfloat16,
          atol=3e-2)


# ~40 s a cache dtype interpreted: the default run keeps the kernels' reads of both (the tests above), the engine on
# the kernels (tests/engine/test_triton_engine.py) and the fp8 cache end to end on the torch path (test_llm_engine.py)
@pytest.mark.slow
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_the_engine_gives_the_torch_paths_greedy_tokens_on_the_shipped_model(kv_cache_dtype):
    from engine.api import SamplingParams
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from tests.engine.test_llm_engine import decode, prompt

    model_dir = Path(__file__).parents[2] / "data" / "models" / "batchrun-tiny"
    if not (model_dir / "config.json").is_file():
        pytest.skip(f"no shipped model at {model_dir}")
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    long = prompt(1, 140)  # past the model's 128-token window; prefilled in 64-token chunks
    # fp32: in bf16 the torch path rounds scores to bf16 before the softmax, the kernels do not
    tokens, hits, bounds = {}, {}, set()

    def recording_bounds(q, k_cache, v_cache, meta, **options):
        # the runner's host ints, as the tensors would give them
        bounds.add(((meta.max_query_len, meta.max_seq_len),
                    (int(meta.query_start_loc.diff().max()), int(meta.seq_lens.max()))))
        return triton_paged_attention(q, k_cache, v_cache, meta, **options)

    for choice in ("torch", "triton"):
        llm = LLMEngine(EngineConfig(model_dir, dtype="float32", device=DEVICE, kv_cache_gb=0.01,
                                     max_num_batched_tokens=64, kernels=choice, kv_cache_dtype=kv_cache_dtype))
        layers = [layer.self_attn for layer in llm.runner.model.model.layers]
        assert all((attn.paged_attention is triton_paged_attention) == (choice == "triton") for attn in layers)
        if choice == "triton":
            for attn in layers:
                attn.paged_attention = recording_bounds
        first = decode(llm, {"long": long, "short": prompt(3, 5)}, greedy)  # short decodes between long's chunks
        second = decode(llm, {"hit": long[:130] + prompt(2, 9)}, greedy)  # its first 8 blocks are long's
        tokens[choice], hits[choice] = {**first, **second}, llm.block_manager.num_hit_tokens
        del llm  # on CUDA the next engine's cache is sized from free memory: this one's must be gone
    assert hits["triton"] == 128
    assert len(bounds) > 3 and all(given == read for given, read in bounds), bounds
    assert tokens["triton"] == tokens["torch"]


@pytest.mark.parametrize("window", [None, 5])
def test_flat_query_tiles_find_their_sequences(window, monkeypatch):
    monkeypatch.setattr(kernels, "PREFILL_ROWS", 16)  # 4 queries x 4 heads a tile: many tiles, many edges
    # chunks of 3..9 new tokens that start and end on and off tile edges, decodes in between
    check([(0, 4), (6, 5), (9, 1), (0, 9), (2, 3), (13, 1), (4, 8), (0, 7)], window=window, block_size=4)


COMPILE_FOR_H100 = """
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, compile
import engine.kernels.attention as kernels

assert not kernels.INTERPRETED
from engine.kernels import fused

pointers = {"q_ptr": "*bf16", "out_ptr": "*bf16", "sinks": "*bf16", "block_tables": "*i64", "seq_lens": "*i64",
            "query_start_loc": "*i64", "part_m": "*fp32", "part_l": "*fp32", "part_acc": "*fp32", "scale": "fp32",
            "k_ptr": "*bf16", "v_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "q_out_ptr": "*bf16",
            "slot_ptr": "*i64", "eps": "fp32"}
shape = dict(HEAD_DIM=64, BLOCK_D=64, BLOCK_SIZE=16, TABLE_AHEAD=True)
kernels_in_a_step = [
        # the K/V write, and the attention reading a bf16 cache, or an fp8 one (--kv-cache-dtype fp8)
        (fused._rope_write_kernel, dict(HALF=32, BLOCK_HEADS=64, BLOCK_KV_HEADS=8)),
        (kernels._decode_partition_kernel, dict(GROUP=8, BLOCK_G=16, BLOCK_N=64, PARTITION=512, SLIDING=True,
                                                SINGLE=True)),
        (kernels._decode_partition_kernel, dict(GROUP=8, BLOCK_G=16, BLOCK_N=64, PARTITION=512, SLIDING=False,
                                                SINGLE=False)),
        (kernels._prefill_kernel, dict(GROUP=8, GROUP_PAD=8, BLOCK_M=8, BLOCK_N=64, SLIDING=True, MIN_Q_LEN=2)),
        # the batch-invariant mode: every row, decode ones too
        (kernels._prefill_kernel, dict(GROUP=8, GROUP_PAD=8, BLOCK_M=8, BLOCK_N=64, SLIDING=False, MIN_Q_LEN=1)),
        (kernels._decode_reduce_kernel, dict(GROUP=8, BLOCK_P=16))]
for cache in ("*bf16", "*fp8e4nv"):
    types = {**pointers, "k_cache": cache, "v_cache": cache, "k_cache_ptr": cache, "v_cache_ptr": cache}
    for fn, constants in kernels_in_a_step:
        constants = {**constants, "UPCAST": False} if "UPCAST" in fn.arg_names else constants
        constants = {name: value for name, value in {**shape, **constants}.items() if name in fn.arg_names}
        signature = {name: "constexpr" if name in constants else types.get(name, "i32") for name in fn.arg_names}
        # every constexpr given, as the engine's launches give them (one left out would compile as a runtime int)
        assert all(signature[name] == "constexpr" for name in fn.arg_names if name.isupper()), fn.arg_names
        source = ASTSource(fn, signature, {(fn.arg_names.index(k),): v for k, v in constants.items()})
        assert compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"], (fn.__name__, cache)
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="with CUDA the kernels are compiled and run by the tests above")
def test_the_kernels_compile_for_an_h100_without_one():
    # The interpreter accepts programs the compiler rejects: compile bf16 gpt-oss-shaped kernels for sm_90, over a
    # bf16 and an fp8 KV cache.
    compile_in_a_child(COMPILE_FOR_H100, timeout=300)


def compile_in_a_child(script: str, timeout: int) -> str:
    """Run `script` in a child Python with the Triton compiler on (not the interpreter); its stdout."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            cwd=Path(__file__).parents[2], timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def compiles_per_kernel(script: str, timeout: int = 600) -> dict[str, int]:
    """Run `script` (its launches recorded in `launches` by engine.kernels.sm90) in a child compiling for sm_90;
    how many distinct binaries each kernel compiled to."""
    import json

    stdout = compile_in_a_child(script + """
import json

compiled = {}
for kernel, _, binary in launches:
    compiled.setdefault(kernel.__name__, set()).add(id(binary))
print(json.dumps({name: len(binaries) for name, binaries in compiled.items()}))
""", timeout=timeout)
    result: dict[str, int] = json.loads(stdout.strip().splitlines()[-1])
    return result


COMPILES_PER_MIXED_STEP = """
import json

from engine.kernels.sm90 import _compile_only_for_sm90

launches = _compile_only_for_sm90()  # every launch compiles for sm_90, none runs

import torch

import engine.kernels.attention as kernels
from engine.attention import AttentionMetadata

kernels.INTERPRETED = True  # only lets CPU tensors through the wrapper's guard
for window, context in ((None, 30), (128, 30), (None, 700), (None, 3000)):
    # (sequences, block-table width, where the lengths start in the step's buffer): as steps vary them; at 700 and
    # 3,000 keys full layers split them, into partitions whose size (128 to 512) and count vary with the sequences;
    # 40 sequences of 30 keys take one partition of 512, 3 of them one of 128: the same compile
    for num_seqs, width, offset in ((3, 2, 0), (16, 16, 1), (1, 1, 1), (5, 7, 0), (40, 2, 0)):
        q_lens = [4] + [1] * (num_seqs - 1)
        starts = torch.tensor([0, *q_lens]).cumsum(0)
        buffer = torch.zeros(64, dtype=torch.long)
        seq_lens = buffer[offset:offset + num_seqs]
        seq_lens.copy_(torch.tensor([context + row for row in range(num_seqs)]))
        tokens = int(starts[-1])
        meta = AttentionMetadata(positions=torch.zeros(tokens, dtype=torch.long),
                                 slot_mapping=torch.zeros(tokens, dtype=torch.long), query_start_loc=starts,
                                 seq_lens=seq_lens, block_tables=torch.zeros(num_seqs, width, dtype=torch.long),
                                 block_size=16, max_query_len=4, max_seq_len=context + num_seqs)
        cache = torch.empty(8, 16, 8, 64, dtype=torch.bfloat16)
        kernels.triton_paged_attention(torch.empty(tokens, 64, 64, dtype=torch.bfloat16), cache,
                                       torch.empty_like(cache), meta, sinks=torch.empty(64, dtype=torch.bfloat16),
                                       sliding_window=window, scale=0.125)
"""


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="compiles for an H100 in a child process; with CUDA the runs above do")
def test_a_mixed_steps_attention_compiles_once_per_layer_kind_whatever_the_steps_shape():
    # The eager attention between the pieces sees a new sequence count, table width and buffer offset every
    # step; were those specialised, a run would stop to compile each new combination (~1 s on an H100 host,
    # in the first timed steps). One compile per sliding/full layer kind for each kernel, all shapes alike, and one
    # more for each partition size full layers split their keys at (here 128, 256 and 512, engine.kernels.
    # split_decode_steps: what the runner's warm-up compiles), then their reduce: once, whatever the partitions' count.
    assert compiles_per_kernel(COMPILES_PER_MIXED_STEP) == {"_decode_partition_kernel": 2 + 3, "_prefill_kernel": 2,
                                                            "_decode_reduce_kernel": 1}
