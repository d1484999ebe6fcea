"""One engine step on the model: scheduled sequences -> flat tensors -> logits -> tokens.

The runner only reads `Sequence`s (token ids, block tables); the scheduler and
block manager own them. It holds the model and its paged KV cache.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig, ModelConfig
from engine.cuda_graphs import DecodeGraphs
from engine.device import ForwardTimer
from engine.model import GptOssModel, allocate_kv_cache
from engine.sampler import ConstraintMasks, Sampler, apply_bitmask
from engine.scheduler import ScheduledBatch


class ModelRunner:
    """Runs scheduled batches through the model over a preallocated paged cache."""

    def __init__(self, model: GptOssModel, model_config: ModelConfig, config: EngineConfig,
                 num_blocks: int, dtype: torch.dtype, max_model_len: int | None = None):
        self.model, self.model_config = model, model_config
        self.block_size = config.block_size
        self.device = torch.device(config.device)
        # CUDA graphs need the Triton path (the torch MoE reads expert counts back on CUDA) and one
        # scratch block past the block manager's for their padding rows.
        use_graphs = config.cuda_graphs and self.device.type == "cuda" and config.kernels == "triton"
        self.kv_caches = allocate_kv_cache(model_config, num_blocks + use_graphs, self.block_size, dtype, self.device)
        self.graphs: DecodeGraphs | None = None
        if use_graphs:
            self.graphs = DecodeGraphs(model, self.kv_caches, max_batch=config.max_num_seqs,
                                       max_model_len=max_model_len or model_config.max_position_embeddings,
                                       block_size=self.block_size, scratch_block=num_blocks)
            self.graphs.capture()
        self.sampler = Sampler()
        self.masks = ConstraintMasks(model_config.vocab_size)
        self.timer = ForwardTimer(self.device)  # model time, for the engine-overhead figure

    @property
    def forward_s(self) -> float:
        """Seconds of model time so far (CUDA events on CUDA: waits for the queued steps)."""
        return self.timer.seconds

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata, list[int]]:
        """Flat input ids, attention metadata, and the row of each sampled item's last token."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts, seq_lens, tables, logit_rows = [0], [], [], []
        for item in batch.items:
            seq, start, end = item.seq, item.start, item.end
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += [seq.block_table[p // bs] * bs + p % bs for p in range(start, end)]
            starts.append(starts[-1] + item.num_new_tokens)
            seq_lens.append(end)
            tables.append(seq.block_table)
            if item.is_sampled:
                logit_rows.append(starts[-1] - 1)
        width = max(map(len, tables))
        padded = [table + [-1] * (width - len(table)) for table in tables]
        as_long = lambda values: torch.tensor(values, dtype=torch.long, device=self.device)  # noqa: E731
        meta = AttentionMetadata(positions=as_long(positions), slot_mapping=as_long(slots),
                                 query_start_loc=as_long(starts), seq_lens=as_long(seq_lens),
                                 block_tables=as_long(padded), block_size=bs,
                                 max_query_len=max(item.num_new_tokens for item in batch.items),
                                 max_seq_len=max(seq_lens))
        return as_long(input_ids), meta, logit_rows

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[list[int], list[float | None] | None]:
        """Forward the batch; sample a token for every item that needs one (in batch.sampled order)."""
        input_ids, meta, logit_rows = self.prepare(batch)
        sampled = batch.sampled
        params = [item.seq.sampling for item in sampled]
        masks = self.masks.start(params)  # grammar masks, computed while the model runs
        self.timer.start()
        hidden = self.graphs.run(input_ids, meta) if self.graphs is not None else None  # decode steps
        if hidden is None:
            hidden = self.model(input_ids, meta, self.kv_caches)  # [T, hidden]
        if not logit_rows:
            self.timer.stop()
            return [], None
        logits = self.model.compute_logits(hidden[logit_rows]).float()  # [N, vocab]
        self.timer.stop()
        if masks is not None:
            apply_bitmask(logits, *masks.result())
        token_ids = self.sampler.sample(logits, params, [item.seq.seed for item in sampled],
                                        [item.seq.num_tokens for item in sampled])  # the new token's position
        self.masks.accept(params, token_ids)
        logprobs = None
        if any(p.logprobs is not None for p in params):
            logprobs = self.sampler.logprobs(logits, token_ids, params)
        return token_ids, logprobs
