"""CUDA graphs: the plan, and the padded static inputs of full and piecewise graphs on CPU (their pieces run
eagerly there); the runner's captures with torch.cuda's capture API faked (one pool and stream, no host reads
inside); graphs against eager on a GPU (skipped without)."""

import contextlib
import traceback

import pytest
import torch

from engine import model as engine_model
from engine.api import SamplingParams
from engine.attention import paged_attention
from engine.config import EngineConfig
from engine.cuda_graphs import MAX_FULL_GRAPH_KEYS, GraphChoice, GraphCounts, GraphPlan, StaticDecodeInputs, ladder
from engine.graph_share import sharegpt_graph_stats
from engine.kernels import PARTITION_SIZE, decode_partition, decode_parts
from engine.piecewise_graphs import PiecewiseGraphs
from engine.proxies import graph_share_figures
from engine.llm_engine import LLMEngine
from tests.engine.test_decode_trace import decode_step, fresh
from tests.support.triton_mode import needs_interpreter

HAS_CUDA = torch.cuda.is_available()


def restore(kv_caches, saved) -> None:
    """Put the KV caches back as `saved` (a forward writes its rows' keys and values)."""
    for (k, v), (k0, v0) in zip(kv_caches, saved):
        k.copy_(k0)
        v.copy_(v0)


def assert_padding_wrote_only_scratch(kv_caches, saved, scratch: int, meta) -> None:
    """The padding rows wrote only the scratch block (the real rows wrote their own slots, in either table)."""
    real = {*(meta.slot_mapping // 16).tolist(), *((meta.window or meta).slot_mapping // 16).tolist()}
    for (k, v), (k0, v0) in zip(kv_caches, saved):
        changed = ((k != k0).flatten(1).any(1) | (v != v0).flatten(1).any(1)).nonzero().flatten().tolist()
        assert scratch in changed and set(changed) <= {scratch} | real


def test_the_ladders_cover_every_size_up_to_the_limit():
    assert ladder(64, (1, 2, 4, 8, 16, 24, 32, 48, 64, 96)) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert ladder(5, (1, 2, 4, 8)) == [1, 2, 4, 5]


def test_padding_rows_change_nothing_for_the_real_rows(tiny_model_dir):
    engine, input_ids, meta = decode_step(tiny_model_dir, [3, 17, 129])
    scratch = engine.num_blocks - 1
    assert scratch not in {b for seq in engine.scheduler.running for b in seq.block_table + seq.window_block_table}
    model, kv_caches = engine.runner.model, engine.runner.kv_caches
    saved = [(k.clone(), v.clone()) for k, v in kv_caches]
    assert engine.kv_layout.is_hybrid and meta.window is not None  # the sliding layers' tables are filled too
    inputs = StaticDecodeInputs.allocate(8, 16, engine.config.block_size, scratch, torch.device("cpu"), hybrid=True)
    inputs.block_tables.fill_(7)  # stale rows from an earlier, wider step must not leak in
    inputs.window_block_tables.fill_(7)
    with torch.inference_mode():
        unpadded = model(input_ids, fresh(meta), kv_caches)
        restore(kv_caches, saved)
        inputs.fill(input_ids, meta, 8)
        padded_ids, padded_meta = inputs.view(8, 1024)
        padded = model(padded_ids, padded_meta, kv_caches)
    torch.testing.assert_close(padded[:3], unpadded, rtol=1e-5, atol=1e-5)
    assert padded_meta.query_start_loc.tolist() == list(range(9)) and padded_meta.seq_lens[3:].tolist() == [1] * 5
    assert_padding_wrote_only_scratch(kv_caches, saved, scratch, meta)


def test_the_plan_picks_the_smallest_graph_that_covers_the_step():
    plan = GraphPlan(max_batch=64, max_model_len=8192, max_tokens=2048)
    assert plan.batch_sizes[-1] == 64 and plan.context_bounds == [1024, 4096, 8192] and plan.token_sizes[-1] == 2048
    assert plan.pick(3, 1, 100) == GraphChoice("full", 4, 1024)
    assert plan.pick(17, 1, 4097) == GraphChoice("full", 24, 8192)
    # decode steps past the decode ladder, and steps with prefill rows: the piecewise graphs
    assert plan.pick(65, 1, 10) == GraphChoice("piecewise", 96)
    assert plan.pick(1, 1, 8193) == GraphChoice("piecewise", 1)
    assert plan.pick(300, 40, 900) == GraphChoice("piecewise", 320)
    assert plan.pick(1100, 512, 900) == GraphChoice("piecewise", 1280)
    assert plan.pick(2049, 512, 900) == GraphChoice("eager")


def test_full_graphs_stop_where_rows_times_context_would_pass_the_cap():
    # 1,024 rows of a 131,072-token bound: 4 GB of split-K partial results in the pool for gpt-oss; past
    # MAX_FULL_GRAPH_KEYS a decode step replays the piecewise graphs
    plan = GraphPlan(max_batch=1024, max_model_len=131072, max_tokens=8192)
    assert plan.full_graphs[0] == (256, 131072) and (320, 131072) not in plan.full_graphs
    assert (1024, 16384) in plan.full_graphs and len(plan.full_graphs) == len(set(plan.full_graphs))
    assert all(size * bound <= MAX_FULL_GRAPH_KEYS for size, bound in plan.full_graphs)
    assert plan.pick(200, 1, 100_000) == GraphChoice("full", 224, 131072)
    assert plan.pick(1000, 1, 16_000) == GraphChoice("full", 1024, 16384)
    assert plan.pick(1000, 1, 20_000) == GraphChoice("piecewise", 1024)
    assert plan.pick(300, 1, 20_000) == GraphChoice("piecewise", 320)
    # the batch sizes and bounds a step can pick, every pair of them under the cap, and no other
    picked = {(c.size, c.bound) for c in (plan.pick(n, 1, ctx) for n in plan.batch_sizes for ctx in plan.context_bounds)
              if c.kind == "full"}
    assert picked == set(plan.full_graphs)


def test_counts_share_decode_tokens_by_how_their_step_ran():
    counts = GraphCounts()
    counts.add(GraphChoice("full", 4, 1024), 3)
    counts.add(GraphChoice("piecewise", 96), 5)
    counts.add(GraphChoice("eager"), 2)
    assert counts.stats() == {"graph_steps": 2, "graph_decode_tokens": 8, "full_graph_decode_tokens": 3,
                              "decode_tokens": 10, "graph_share": 0.8}


def mixed_step(model_dir, **options):
    """An engine whose next step decodes 3 sequences and prefills 2 (one a chunk), and that step's inputs.

    Scheduled synchronously whatever the device: the step is scheduled by hand, and its decode rows need
    their last token on the host (under async scheduling, CUDA's default, it is still on the device)."""
    options = {**options, "async_scheduling": False}
    engine = LLMEngine(EngineConfig(model_dir, kv_cache_gb=0.01, block_size=16, max_num_batched_tokens=64,
                                    **options))
    for index, length in enumerate([3, 17, 29]):
        prompt = [1000 + (7 * index + t) % 5000 for t in range(length)]
        engine.add_request(f"r{index}", prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    engine.step()
    for index, length in enumerate([12, 90]):
        prompt = [2000 + (5 * index + t) % 5000 for t in range(length)]
        engine.add_request(f"p{index}", prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    batch = engine.scheduler.schedule()
    input_ids, meta, _ = engine.runner.prepare(batch)
    assert meta.max_query_len > 1 and meta.num_seqs == 5 and input_ids.shape[0] == 64
    return engine, input_ids, meta


def piecewise_against_eager(engine, input_ids, meta, capture: bool):
    """(piecewise forward padded to 96 tokens, eager forward, scratch block, cache before): both from one cache."""
    scratch = engine.num_blocks - 1
    assert scratch not in {b for seq in engine.scheduler.running for b in seq.block_table}
    model, kv_caches = engine.runner.model, engine.runner.kv_caches
    pieces = PiecewiseGraphs(model, kv_caches, [64, 96], block_size=16, scratch_block=scratch)
    if capture:
        pieces.capture(torch.cuda.graph_pool_handle())
        assert len(pieces.graphs) == 2 * pieces.num_pieces
    saved = [(k.clone(), v.clone()) for k, v in kv_caches]
    pieces.o.fill_(1e4)  # stale rows from an earlier, wider step must not leak in
    with torch.inference_mode():
        eager = model(input_ids, fresh(meta), kv_caches)
        restore(kv_caches, saved)
        padded = pieces.run(96, input_ids, fresh(meta))
    return padded, eager, pieces, saved


def test_piecewise_padding_changes_nothing_for_the_real_rows(tiny_model_dir):
    engine, input_ids, meta = mixed_step(tiny_model_dir)
    padded, eager, pieces, saved = piecewise_against_eager(engine, input_ids, meta, capture=False)
    scratch, kv_caches = engine.num_blocks - 1, engine.runner.kv_caches
    torch.testing.assert_close(padded, eager, rtol=1e-5, atol=1e-5)
    assert pieces.slot_mapping[64:96].tolist() == [scratch * 16] * 32 and pieces.positions[64:96].eq(0).all()
    assert_padding_wrote_only_scratch(kv_caches, saved, scratch, meta)


def test_the_hand_scheduled_mixed_step_has_real_input_ids_on_an_async_engine(tiny_model_dir):
    # async scheduling is CUDA's default: a decode row scheduled by hand after an async step would read its
    # PLACEHOLDER (-1) as input id, an out-of-range embedding index (a device-side assert on CUDA)
    _, input_ids, _ = mixed_step(tiny_model_dir, async_scheduling=True)
    assert int(input_ids.min()) >= 0


def test_a_cpu_run_counts_the_decode_tokens_a_gpu_run_would_replay(tiny_model_dir):
    engine = LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.01, max_num_seqs=4, max_num_batched_tokens=32))
    for index, length in enumerate([5, 40, 3, 20, 9]):
        engine.add_request(f"r{index}", [1000 + t for t in range(length)],
                           SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats()
    assert stats["decode_tokens"] == 5 * 5  # the first token of each comes from its prefill step
    assert stats["graph_decode_tokens"] == stats["decode_tokens"] and stats["graph_share"] == 1.0
    assert 0 < stats["full_graph_decode_tokens"] < stats["decode_tokens"]  # some decodes shared a prefill step
    off = LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.01, cuda_graphs=False))
    off.add_request("r", [1000, 1001], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    while off.has_unfinished_requests():
        off.step()
    assert off.stats()["graph_share"] == 0.0 and off.stats()["decode_tokens"] == 2


def greedy_tokens(model_dir, **options) -> dict[str, list[int]]:
    engine = LLMEngine(EngineConfig(model_dir, kv_cache_gb=0.05, max_model_len=2048, **options))
    for index, length in enumerate([5, 40, 130, 300, 7]):
        prompt = [1000 + (11 * index + t) % 5000 for t in range(length)]
        engine.add_request(f"r{index}", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_decode_gives_the_eager_tokens(tiny_model_dir):
    graphed = greedy_tokens(tiny_model_dir, device="cuda", kernels="triton", cuda_graphs=True)
    eager = greedy_tokens(tiny_model_dir, device="cuda", kernels="triton", cuda_graphs=False)
    assert graphed == eager and all(len(t) == 24 for t in graphed.values())


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_the_gpu_engine_gives_the_cpu_engines_greedy_tokens(tiny_model_dir):
    assert greedy_tokens(tiny_model_dir, device="cuda", kernels="auto") == greedy_tokens(tiny_model_dir)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_piecewise_graphs_replay_the_eager_forward(tiny_model_dir):
    # piecewise_against_eager clones the whole KV cache, which on CUDA is sized from free memory: 0.2 of the
    # GPU leaves room for the clone (at the default 0.9 it could not fit beside the cache)
    engine, input_ids, meta = mixed_step(tiny_model_dir, device="cuda", kernels="triton", cuda_graphs=False,
                                         gpu_memory_utilization=0.2)
    padded, eager, _, _ = piecewise_against_eager(engine, input_ids, meta, capture=True)
    torch.testing.assert_close(padded, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_the_gpu_engine_counts_replayed_graphs(tiny_model_dir):
    engine = LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.05, max_model_len=2048, device="cuda",
                                    kernels="triton", max_num_batched_tokens=64))
    assert engine.runner.graphs is not None and engine.runner.pieces is not None
    assert len(engine.runner.pieces.graphs) == len(engine.runner.plan.token_sizes) * engine.runner.pieces.num_pieces
    stats = engine.stats()  # what the capture took, beside what the KV reserve set aside for it
    assert stats["num_graphs"] == len(engine.runner.graphs.graphs) + len(engine.runner.pieces.graphs)
    assert stats["capture_s"] > 0 and stats["graph_memory_gb"] > 0 and stats["graph_reserve_gb"] > 0


class FakeGraphCapture:
    """torch.cuda's capture API on the CPU: each capture's body runs eagerly, and its pool and stream are
    recorded (as are the streams the warm-ups run on), and so is every read of a tensor's value on the host
    inside it: on CUDA each would be a sync, which fails the capture."""

    HOST_READS = ("item", "tolist", "__int__", "__index__", "__float__", "__bool__")

    def __init__(self, monkeypatch) -> None:
        self.captures: list[tuple[object, object]] = []  # (pool, stream) of each torch.cuda.graph
        self.current: list[object] = []  # streams entered with torch.cuda.stream
        self.host_reads: list[str] = []  # "name at file:line" of each read inside a capture
        default = self.Stream()
        fakes = {"graph_pool_handle": object, "Stream": self.Stream, "current_stream": lambda: default,
                 "stream": self.stream, "graph": self.graph, "CUDAGraph": self.Graph, "synchronize": lambda: None,
                 "empty_cache": lambda: None, "memory_reserved": lambda device=None: 0}
        for name, fake in fakes.items():
            monkeypatch.setattr(torch.cuda, name, fake)
        monkeypatch.setattr(EngineConfig, "captures_graphs", property(lambda config: True))

    class Stream:
        def wait_stream(self, other) -> None:
            pass

    class Graph:
        def replay(self) -> None:  # what it captured ran once, eagerly: replaying it here would need its ops
            pass

    @contextlib.contextmanager
    def stream(self, stream):
        self.current.append(stream)
        yield

    @contextlib.contextmanager
    def graph(self, graph, pool=None, stream=None):
        self.captures.append((pool, stream))
        originals = {name: getattr(torch.Tensor, name) for name in self.HOST_READS}
        for name, original in originals.items():
            setattr(torch.Tensor, name, self._recording(name, original))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)

    def _recording(self, name, original):
        def read(tensor, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            self.host_reads.append(f"{name} at {caller.filename.rsplit('/', 1)[-1]}:{caller.lineno}")
            return original(tensor, *args, **kwargs)
        return read


def test_decode_and_piecewise_graphs_share_one_capture_stream_and_pool(tiny_model_dir, monkeypatch):
    # The caching allocator gives a freed block only to allocations on the stream it was freed on: graphs
    # sharing a pool on two capture streams could not reuse each other's memory, and the pool would hold
    # both peaks, where the KV reserve counts the larger (torch.cuda.graph: pass the same stream).
    fake = FakeGraphCapture(monkeypatch)
    engine = LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.01, max_num_seqs=4, max_num_batched_tokens=16,
                                    max_model_len=64))
    graphs, pieces = engine.runner.graphs, engine.runner.pieces
    assert graphs is not None and pieces is not None
    assert len(fake.captures) == len(graphs.graphs) + len(pieces.graphs) == 3 + 5 * pieces.num_pieces
    pools, streams = {id(pool) for pool, _ in fake.captures}, {id(stream) for _, stream in fake.captures}
    assert len(pools) == 1 and len(streams) == 1
    assert {id(stream) for stream in fake.current} == streams  # the warm-ups ran there too


def test_a_mixed_steps_attention_runs_on_the_scratch_block_before_any_request(tiny_model_dir, monkeypatch):
    # A step with prefill rows runs its attention eagerly between the pieces: on CUDA its kernels (the prefill
    # kernel, the single-partition decode of full layers) would compile in the first timed steps unless a
    # mixed step ran before; it must write nothing but the scratch block.
    calls = []

    def recording(q, k_cache, v_cache, meta, **options):
        calls.append((meta.max_query_len, meta.max_seq_len, options["sliding_window"]))
        return paged_attention(q, k_cache, v_cache, meta, **options)

    monkeypatch.setattr(engine_model, "paged_attention", recording)
    FakeGraphCapture(monkeypatch)
    engine = LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.01, max_num_seqs=4, max_num_batched_tokens=16,
                                    max_model_len=64))
    # prefill rows, at a context one decode partition covers: the prefill kernel and the single-partition decode
    mixed = {window for query_len, seq_len, window in calls if query_len > 1 and seq_len <= PARTITION_SIZE}
    assert mixed == {None, engine.model_config.sliding_window}
    scratch = engine.num_blocks
    for k, v in engine.runner.kv_caches:
        assert not k[:scratch].any() and not v[:scratch].any() and k[scratch].any()


@pytest.mark.parametrize(("max_num_seqs", "sizes"), [(32, {512, 256, 128}), (4, {128})])
def test_mixed_steps_run_the_split_k_decode_at_every_partition_size_before_any_request(tiny_model_dir, monkeypatch,
                                                                                     max_num_seqs, sizes):
    # An eager step's decode rows past one partition run the split-K decode, compiled once per partition size (a
    # constexpr), then the reduce; the graphs capture only decode steps, so a mixed step of a new size compiled it
    # inside a timed run unless a warm-up ran one first. The tiny model's 2 KV heads over up to 2,049 keys: 27
    # sequences split at 512 keys, 15 at 256, 1 at 128; 4 sequences only ever at 128 (the warm-up runs no more).
    split_at, most_seqs = set(), []

    def recording(q, k_cache, v_cache, meta, **options):
        if meta.max_query_len > 1 and options["sliding_window"] is None:
            num_seqs, kv_heads, span = meta.num_seqs, k_cache.shape[2], meta.max_seq_len
            most_seqs.append(num_seqs)
            if decode_parts(num_seqs, kv_heads, span) > 1:
                split_at.add(decode_partition(num_seqs, kv_heads, span))
        return paged_attention(q, k_cache, v_cache, meta, **options)

    monkeypatch.setattr(engine_model, "paged_attention", recording)
    FakeGraphCapture(monkeypatch)
    engine = LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.01, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=64, max_model_len=4 * PARTITION_SIZE + 1))
    assert split_at == sizes and max(most_seqs) <= max_num_seqs
    scratch = engine.num_blocks
    for k, v in engine.runner.kv_caches:
        assert not k[:scratch].any() and not v[:scratch].any()


def captured_host_reads(model_dir, monkeypatch, **options) -> list[str]:
    """The host reads inside every capture of a small graph plan (2 decode graphs, 2 token counts x 3 pieces)."""
    fake = FakeGraphCapture(monkeypatch)
    LLMEngine(EngineConfig(model_dir, kv_cache_gb=0.01, max_num_seqs=2, max_num_batched_tokens=2, max_model_len=32,
                           **options))
    assert len(fake.captures) == 2 + 2 * 3
    return fake.host_reads


@needs_interpreter
@pytest.mark.parametrize("deterministic", [False, True])
def test_the_captured_forward_reads_nothing_back_to_the_host(tiny_model_dir, monkeypatch, deterministic):
    # What CUDA captures: every full decode graph and every piece, on the Triton kernels (interpreted here),
    # with batch-invariant numerics too.
    assert captured_host_reads(tiny_model_dir, monkeypatch, kernels="triton", deterministic=deterministic) == []


def test_the_host_read_check_sees_the_torch_moes_reads(tiny_model_dir, monkeypatch):
    # The torch path's batch-invariant MoE reads each expert's row count back (why the torch path is never
    # captured): the check above would see such a read added to the captured path.
    reads = captured_host_reads(tiny_model_dir, monkeypatch, kernels="torch", deterministic=True)
    assert reads and all(read.startswith("tolist at experts.py:") for read in reads), reads


def test_nearly_every_decode_token_of_a_sharegpt_run_is_in_a_graph():
    # A small token budget keeps a prefill chunk in most steps while the queue drains, as at full scale
    # (the 512-request proxy has 63% of decode tokens in decode-only steps).
    stats = sharegpt_graph_stats(num_requests=64, max_num_seqs=32, max_num_batched_tokens=64)
    assert stats["decode_tokens"] > 2000 and stats["graph_share"] >= 0.9
    assert stats["full_graph_decode_tokens"] < 0.9 * stats["decode_tokens"]  # decode-only steps alone would not
    assert "capture_s" not in stats  # counted by the plan; nothing was captured on the CPU


@pytest.mark.slow
def test_the_graph_share_proxy_meets_its_goal():
    figure = graph_share_figures()[0]
    assert figure.ok and figure.value >= 0.9
