"""One engine step on the model: scheduled sequences -> flat tensors -> logits -> tokens.

The runner only reads `Sequence`s (token ids, block tables); the scheduler and
block manager own them. It holds the model and its paged KV cache.
"""

from __future__ import annotations

import time

import torch

from engine import device_sampler
from engine.attention import AttentionMetadata
from engine.config import EngineConfig, ModelConfig
from engine.cuda_graphs import DecodeGraphs, GraphChoice, GraphCounts, GraphPlan
from engine.device import ForwardTimer
from engine.kernels import split_decode_steps
from engine.kv_layout import KVLayout
from engine.model import GptOssModel, allocate_kv_cache
from engine.piecewise_graphs import PiecewiseGraphs
from engine.api import SamplingParams, TokenLogprob
from engine.sampler import ConstraintMasks, Sampler, apply_bitmask
from engine.scheduler import ScheduledBatch
from engine.step_inputs import ExternalTokens, StepInputs


class LaunchedStep:
    """A step whose sampled tokens are on the device; their copy to the host is queued behind the sampler."""

    def __init__(self, params: list[SamplingParams], tokens: torch.Tensor | None,
                 logits: torch.Tensor | None) -> None:
        self.params, self.tokens, self.logits = params, tokens, logits  # logits: kept for logprobs only
        self._host: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None
        if tokens is not None and tokens.device.type == "cuda":
            # queued now, in stream order: it completes with this step, not with the steps queued after it
            self._host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self._host.copy_(tokens, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    def host_tokens(self) -> list[int]:
        """The sampled token ids (waits for this step only)."""
        if self._copied is not None and self._host is not None:
            self._copied.synchronize()
            return self._host.tolist()
        return [] if self.tokens is None else self.tokens.tolist()


class ModelRunner:
    """Runs scheduled batches through the model over a preallocated paged cache."""

    def __init__(self, model: GptOssModel, model_config: ModelConfig, config: EngineConfig,
                 num_blocks: int, cache_dtype: torch.dtype, max_model_len: int | None = None,
                 layout: KVLayout | None = None):
        """`layout`: the cache's (engine.kv_layout); uniform if None."""
        self.model, self.model_config = model, model_config
        layout = layout or KVLayout.for_model(model_config, hybrid=False)
        model.set_batch_invariant(config.deterministic)  # before any graph captures the forward
        self.block_size = config.block_size
        self.device = torch.device(config.device)
        max_model_len = max_model_len or model_config.max_position_embeddings
        # The plan decides on every device (a CPU run counts what a GPU run would replay). Live graphs need
        # CUDA, the Triton path (the torch MoE reads expert counts back on CUDA) and one scratch block past
        # the block manager's for their padding rows.
        self.plan = GraphPlan(max_batch=config.max_num_seqs, max_model_len=max_model_len,
                              max_tokens=config.step_tokens) if config.cuda_graphs else None
        use_graphs = config.captures_graphs
        self.kv_caches = allocate_kv_cache(model_config, num_blocks + use_graphs, self.block_size, cache_dtype,
                                           self.device, layout)
        self.graphs: DecodeGraphs | None = None
        self.pieces: PiecewiseGraphs | None = None
        self.capture_stats: dict = {}  # on CUDA: what capturing the graphs took (LLMEngine.stats() has it)
        if use_graphs and self.plan is not None:
            start, reserved = time.perf_counter(), _reserved_bytes(self.device)
            self.graphs = DecodeGraphs(model, self.kv_caches, self.plan, max_model_len=max_model_len,
                                       block_size=self.block_size, scratch_block=num_blocks, hybrid=layout.is_hybrid)
            self.pieces = PiecewiseGraphs(model, self.kv_caches, self.plan.token_sizes, block_size=self.block_size,
                                          scratch_block=num_blocks)
            # One pool and one capture stream for both: the caching allocator hands a freed block only to
            # allocations on the stream that freed it, so pieces captured on a stream of their own could not
            # reuse the decode graphs' memory, and the pool would hold both peaks, not the larger (the KV
            # reserve counts the larger: engine.graph_memory). torch.cuda.graph: a capture into a pool used
            # with an explicit stream should pass the same stream.
            pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
            self.graphs.capture(pool, stream)
            self.pieces.capture(pool, stream)
            self.capture_stats = {"capture_s": time.perf_counter() - start,
                                  "num_graphs": len(self.graphs.graphs) + len(self.pieces.graphs),
                                  "graph_memory_gb": (_reserved_bytes(self.device) - reserved) / 2**30}
            self._warm_mixed_step(scratch_block=num_blocks, max_model_len=max_model_len, max_seqs=config.max_num_seqs)
        self.inputs = StepInputs(config.max_num_seqs, max_model_len, self.block_size, self.device, layout.is_hybrid)
        self.sampler = Sampler(config.kernels)
        if config.kernels == "triton" and self.device.type == "cuda":
            self.warm_sampler(model_config.vocab_size)
        self.masks = ConstraintMasks(model_config.vocab_size)
        self.timer = ForwardTimer(self.device)  # model time, for the engine-overhead figure
        self.counts = GraphCounts()

    @torch.inference_mode()
    def warm_sampler(self, vocab: int) -> None:
        """Draw a greedy, a sampled and enough top-p rows of zero logits to search (device_sampler.
        TOP_P_SEARCH_MIN_ROWS), so the sampler's kernels and the top-p threshold's compile before the first request,
        not in the first timed step (fewer top-p rows, and top-k alone, are torch ops)."""
        rows = [SamplingParams(max_tokens=1, temperature=0.0), SamplingParams(max_tokens=1)] + [
            SamplingParams(max_tokens=1, top_p=0.5)] * device_sampler.TOP_P_SEARCH_MIN_ROWS
        self.sampler.sample_on_device(torch.zeros(len(rows), vocab, device=self.device), rows, [0] * len(rows),
                                      [0] * len(rows))

    @torch.inference_mode()
    def _warm_mixed_step(self, scratch_block: int, max_model_len: int, max_seqs: int) -> None:
        """Mixed steps' forwards on the scratch block alone, before any request: a step with prefill rows runs
        its attention eagerly (between the pieces), and the kernels it needs that no capture ran compile here,
        not in the first timed steps: the prefill kernel, the single-partition decode, and the split-K decode at
        each partition size a step of up to `max_seqs` sequences can split at (engine.kernels.split_decode_steps;
        their reduce compiles once).
        Each step is decode rows at one context and a two-token prefill row; every K/V they write lands in the
        scratch block, which their block tables repeat."""
        config = self.model_config
        steps = [(2, 1)] + split_decode_steps(config.num_key_value_heads, max_model_len, max_seqs)
        if config.sliding_window:
            steps += split_decode_steps(config.num_key_value_heads, min(config.sliding_window, max_model_len),
                                        max_seqs)
        for num_seqs, context in steps:
            self._warm_step(scratch_block, num_seqs - 1, context)

    def _warm_step(self, scratch_block: int, decodes: int, context: int) -> None:
        """`decodes` rows at `context` keys and a two-token prefill row, on the scratch block alone."""
        device = self.device
        positions = torch.tensor([context - 1] * decodes + [0, 1], device=device)
        table_width = -(-context // self.block_size)
        meta = AttentionMetadata(positions=positions,
                                 slot_mapping=scratch_block * self.block_size + positions % self.block_size,
                                 query_start_loc=torch.tensor([*range(decodes + 1), decodes + 2], device=device),
                                 seq_lens=torch.tensor([context] * decodes + [2], device=device),
                                 block_tables=torch.full((decodes + 1, table_width), scratch_block, device=device),
                                 block_size=self.block_size, max_query_len=2, max_seq_len=max(context, 2))
        input_ids = torch.zeros(decodes + 2, dtype=torch.long, device=device)
        self._run(self._choice(input_ids, meta), input_ids, meta)

    @property
    def forward_s(self) -> float:
        """Seconds of model time so far (CUDA events on CUDA: waits for the queued steps)."""
        return self.timer.seconds

    def release(self, seqs: list) -> None:
        """Forget the device block tables of sequences whose blocks were freed (a step that runs nothing)."""
        self.inputs.tables.release(seqs)

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
        """Flat input ids, attention metadata, and the row of each sampled item's last token."""
        step = self.inputs.prepare(batch)
        return step.input_ids, step.meta, step.logit_rows

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """Forward the batch; sample a token for every item that needs one (in batch.sampled order)."""
        return self.collect(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, external: ExternalTokens | None = None) -> LaunchedStep:
        """Queue the batch's forward and sampling; its tokens stay on the device until `collect`.

        `external`: input ids of decode rows that are still on the device (the last step's samples).
        """
        step = self.inputs.prepare(batch, external)
        sampled = batch.sampled
        params = [item.seq.sampling for item in sampled]
        masks = self.masks.start(params)  # grammar masks, computed while the model runs
        self.timer.start(step.input_ids.shape[0])
        hidden = self.forward(batch, step.input_ids, step.meta)  # [T, hidden]
        if not step.num_logit_rows:
            self.timer.stop()
            return LaunchedStep(params, None, None)
        logits = self.model.compute_logits(hidden[step.logit_rows]).float()  # [N, vocab]
        self.timer.stop()
        if masks is not None:
            apply_bitmask(logits, *masks.result())
        # Draws keyed by (seed, position of the new token): the same token in any batch; no host read here.
        tokens = self.sampler.sample_on_device(logits, params, [item.seq.seed for item in sampled],
                                               [len(item.seq.token_ids) for item in sampled])  # num_tokens
        keep = logits if any(p.logprobs is not None for p in params) else None
        return LaunchedStep(params, tokens, keep)

    def collect(self, launched: LaunchedStep) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """The launched step's tokens on the host (its one device read) and their logprobs if asked for."""
        if launched.tokens is None:
            return [], None
        token_ids = launched.host_tokens()
        self.masks.accept(launched.params, token_ids)
        logprobs = None
        if launched.logits is not None:
            logprobs = self.sampler.logprobs(launched.logits, token_ids, launched.params)
        return token_ids, logprobs

    def forward(self, batch: ScheduledBatch, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Final hidden states [T, hidden]: by the graph the plan picks (counted on any device), else eagerly."""
        choice = self._choice(input_ids, meta)
        self.counts.add(choice, sum(not item.is_prefill for item in batch.items))
        return self._run(choice, input_ids, meta)

    def _choice(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> GraphChoice:
        """Full graph, piecewise graphs or eager, for a step of these tokens (eager without a graph plan)."""
        if self.plan is None:
            return GraphChoice("eager")
        return self.plan.pick(input_ids.shape[0], meta.max_query_len or 0, meta.max_seq_len or 0)

    def _run(self, choice: GraphChoice, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if choice.kind == "full" and self.graphs is not None:
            return self.graphs.replay(choice, input_ids, meta)
        if choice.kind == "piecewise" and self.pieces is not None:
            return self.pieces.run(choice.size, input_ids, meta)
        return self.model(input_ids, meta, self.kv_caches)


def _reserved_bytes(device: torch.device) -> int:
    """Device memory the caching allocator holds once its free cached blocks are released: what the graphs'
    static buffers and private pool add to it is theirs (warm-up activations go back with the release)."""
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)
