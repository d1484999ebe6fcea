# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""Triton MoE: (token, expert) pairs grouped by expert, one grouped GEMM per projection.

`route` sorts the pairs by expert and builds a tile schedule on the device (no
host sync): tile t covers up to BLOCK_M sorted rows of one expert; the number
of tiles has a static upper bound, and the tiles past the real ones are marked
with expert id E and return at once. One kernel (engine.kernels.moe_gemm) runs
each projection over (tile, column block):
- gate_up: x rows gathered by token, times the expert's gate_up weight, plus
  bias, then the clamped SwiGLU of the interleaved gate/up columns -> [P, I];
- down: those rows times the expert's down weight, plus bias, times the router
  weight, written per pair -> [P, hidden], summed over top_k in torch (so the
  result is deterministic: no atomics).

Expert weights come dense ([E, in, out], any float dtype) or MXFP4
(engine.mxfp4: blocks [E, out, in/32, 16], scales [E, out, in/32]), or MXFP4
re-packed as words (engine.mxfp4_words: [E, out, in/8] int32, with scale words [E, out, ceil(in/128)] int32, or
the same scale bytes).
MXFP4 times bf16/fp16 activations goes through tl.dot_scaled (the scale applied
once per 32-weight group, on the tensor cores); times fp32 activations each weight
is decoded in fp32 (exact; CPU models). Words take bf16 activations, decoded by
the kernel's own bit operations (fewer instructions than dot_scaled's decode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from engine.kernels import interpreted, require_triton
from engine.mxfp4 import MXFP4_BLOCK, check_packed
from engine.mxfp4_words import CHUNK as WORDS_CHUNK
from engine.mxfp4_words import MAX_K_STEP, is_words, scale_words, takes_k_step

# Without CUDA the kernels run in Triton's interpreter, chosen before the decorators below run. The kernels
# call no @triton.jit function of triton.language.standard (tl.zeros, tl.sigmoid, tl.sum, ...): those are
# decorated when triton.language is first imported (transformers' model classes import it), so they stay
# compiled-mode functions, which the interpreter cannot call, if that import came first.
require_triton("cuda" if torch.cuda.is_available() else "cpu")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.kernels import fused  # noqa: E402
from engine.kernels.moe_gemm import moe_gemm_kernel, swiglu_reduce_kernel  # noqa: E402
from engine.kernels.moe_gemv import gemv_experts  # noqa: E402
from engine.kernels.moe_route import route_logits, route_pairs  # noqa: E402

# The interpreter's tl.dot multiplies 16-bit floats wrongly (triton 3.9): interpreted, the operands go to fp32
# first, which gives the products a 16-bit MMA with fp32 accumulation gives.
UPCAST_DOT_OPERANDS = interpreted()
_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# Activation dtypes tl.dot_scaled multiplies MXFP4 weights with (on the tensor cores); fp32 takes the upcast path.
SCALED_DOT_FORMATS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class ExpertWeight:
    """One projection of all experts: `dense` [E, in, out], or MXFP4 `blocks` + `scales`."""

    dense: Tensor | None = None
    blocks: Tensor | None = None  # [E, out, in / 32, 16] uint8, or words [E, out, in / 8] int32 (mxfp4_words)
    scales: Tensor | None = None  # [E, out, in / 32] uint8, or with words scale words [E, out, in / 128] int32

    def __post_init__(self) -> None:
        if (self.dense is None) == (self.blocks is None) or (self.blocks is None) != (self.scales is None):
            raise ValueError("ExpertWeight takes either dense or blocks and scales")
        if self.blocks is not None and self.scales is not None and is_words(self.blocks):
            groups = self.blocks.shape[-1] * 8 // MXFP4_BLOCK
            words = scale_words(groups)
            # the scale words the engine packs (engine.mxfp4_words.pack_scales), or the checkpoint's bytes (timed
            # against them by engine.kernels.moe_tiles)
            if self.blocks.ndim != 3 or self.blocks.shape[:2] != self.scales.shape[:2] or (
                    self.scales.dtype, self.scales.shape[2]) not in ((torch.int32, words), (torch.uint8, groups)):
                raise ValueError(f"MXFP4 words {tuple(self.blocks.shape)} take scale words [E, out, {words}] "
                                 f"int32 (engine.mxfp4_words.pack_scales) or scales [E, out, {groups}] uint8, got "
                                 f"{self.scales.dtype} {tuple(self.scales.shape)}")
            if self.blocks.stride(-1) != 1:
                raise ValueError(f"MXFP4 words must be contiguous along in: strides {self.blocks.stride()}")
        elif self.blocks is not None and self.scales is not None:
            check_packed(self.blocks, self.scales)
            if self.blocks.stride(-1) != 1 or self.blocks.stride(-2) != MXFP4_BLOCK // 2:
                raise ValueError("MXFP4 blocks must be contiguous along their last two dims")

    @property
    def is_mxfp4(self) -> bool:
        return self.blocks is not None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(experts, in, out)."""
        if self.dense is not None:
            e, k, n = self.dense.shape
            return e, k, n
        assert self.blocks is not None  # for mypy: __post_init__ guarantees it
        if is_words(self.blocks):
            e, n, words = self.blocks.shape
            return e, words * 8, n
        e, n, g, _ = self.blocks.shape
        return e, g * MXFP4_BLOCK, n


@dataclass(frozen=True)
class Routing:
    """(token, expert) pairs in expert order and the tile schedule over them, all on the device."""

    sorted_pairs: Tensor  # [P] int32: pair index (token * top_k + slot), grouped by expert
    expert_offsets: Tensor  # [E + 1] int32: expert e's rows are sorted_pairs[offsets[e]:offsets[e + 1]]
    tile_expert: Tensor  # [max_tiles] int32: each tile's expert; E for the unused tail
    tile_row_start: Tensor  # [max_tiles] int32: each tile's first sorted row
    block_m: int


def max_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static bound on sum over experts of ceil(count / block_m): each hit expert adds at most one partial tile."""
    return num_pairs // block_m + min(num_experts, num_pairs)


# The routing kernel is one program: fewer launches than torch's ~22 up to a few thousand pairs, and slower
# past them: graph-timed on an H200, 81.6 against torch's 86.8 us at 4,096 pairs, 158 against 128 at 8,192.
ROUTE_KERNEL_MAX_PAIRS = 4096


def route(expert_ids: Tensor, num_experts: int, block_m: int) -> Routing:
    """expert_ids [T, top_k] -> the pairs sorted by expert and a tile schedule, without reading anything back:
    one launch (engine.kernels.moe_route) up to ROUTE_KERNEL_MAX_PAIRS pairs, `route_reference` (its equal)
    past them."""
    pairs = expert_ids.numel()
    if pairs > ROUTE_KERNEL_MAX_PAIRS:
        return route_reference(expert_ids, num_experts, block_m)
    sorted_pairs, offsets, tile_expert, row_start = route_pairs(expert_ids, num_experts, block_m,
                                                                max_tiles(pairs, num_experts, block_m))
    return Routing(sorted_pairs, offsets, tile_expert, row_start, block_m)


def route_reference(expert_ids: Tensor, num_experts: int, block_m: int) -> Routing:
    """`route` in torch ops (~22 launches on a GPU)."""
    flat = expert_ids.reshape(-1)
    num_pairs, device = flat.numel(), flat.device
    sorted_ids, order = torch.sort(flat, stable=True)
    offsets = torch.searchsorted(sorted_ids, torch.arange(num_experts + 1, device=device, dtype=sorted_ids.dtype))
    tiles = (offsets[1:] - offsets[:-1] + block_m - 1) // block_m  # [E]
    tile_ends = torch.cumsum(tiles, 0)
    t = torch.arange(max_tiles(num_pairs, num_experts, block_m), device=device)
    tile_expert = torch.searchsorted(tile_ends, t, right=True)  # E past the last real tile
    e = tile_expert.clamp(max=num_experts - 1)
    row_start = offsets[e] + (t - (tile_ends[e] - tiles[e])) * block_m
    return Routing(order.int(), offsets.int(), tile_expert.int(), row_start.int(), block_m)


# Rows per tile when batch-invariant: one tile shape for every batch, so a pair's products never depend on
# how many pairs its expert got (block_m_for would pick the shape from the batch).
INVARIANT_BLOCK_M = 16
# The most rows a tile takes: at 256 the MXFP4 kernels spill on sm_90 (255 registers; engine.kernels.sm90).
MAX_BLOCK_M = 128


class GemmTiles(NamedTuple):
    """A grouped GEMM launch's shape besides its rows per tile (block_m_for): columns and K a loop step, warps,
    pipeline stages, and the programs K is split between (engine.kernels.moe_gemm: SPLIT_K). `gemv`: the launch is
    engine.kernels.moe_gemv's instead, a program per (token, expert) pair and column block (experts as words only)."""

    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    gemv: bool = False

    def __str__(self) -> str:
        split = f"k{self.split_k}" if self.split_k > 1 else ""
        kind = "gemv" if self.gemv else ""
        return f"{kind}{self.block_n}x{self.block_k}w{self.num_warps}s{self.num_stages}{split}"

    @classmethod
    def parse(cls, text: str) -> GemmTiles:
        """The inverse of str(): "64x64w4s3" -> GemmTiles(64, 64, 4, 3); "64x64w4s3k4": K split 4 ways;
        "gemv16x256w4s1": the matrix-vector kernel's 16 columns and 256 of K a program step."""
        match = re.fullmatch(r"(gemv)?(\d+)x(\d+)w(\d+)s(\d+)(?:k(\d+))?", text.strip())
        if match is None:
            raise ValueError(f"tiles {text!r}: expected [gemv]BLOCK_NxBLOCK_KwWARPSsSTAGES[kSPLIT], e.g. 64x64w4s3")
        sizes = [int(group) for group in match.groups()[1:] if group is not None]
        if min(sizes) < 1:
            raise ValueError(f"tiles {text!r}: every size must be at least 1")
        if match[1] and len(sizes) > 4:
            raise ValueError(f"tiles {text!r}: the matrix-vector kernel does not split K")
        block_n, block_k, num_warps, num_stages, *split = sizes
        return cls(block_n, block_k, num_warps, num_stages, split[0] if split else 1, gemv=bool(match[1]))


# Chosen from sm_90 compiles (engine.kernels.sm90); an H200 found none faster at 256 and 2,048 tokens
# (engine.kernels.moe_tiles), and other shapes where it did (below).
DEFAULT_TILES = GemmTiles()
# Launch shapes by rows a tile (block_m_for), where a GPU timed one faster than DEFAULT_TILES at the step sizes that
# tile height serves (the GPU check's `moe T=` lines, graph replays of one 20b layer on an H200): at 16-row tiles
# (20b steps under 72 tokens) 64x64w2s3 took x0.90-0.91 of the default's time at 8, 16, 32 and 64 tokens (x0.94 at
# 1). At 64 and 128 rows (256 and 2,048 tokens) the default was the fastest. The engine's MoE from router logits
# takes them on MXFP4 experts; a batch-invariant run (its tile height forced at every step size) never does. The
# height follows rows an expert, not the step: 120b's 128 experts take 16-row tiles up to 287 tokens (untimed there).
TILES_BY_BLOCK_M: dict[int, GemmTiles] = {16: GemmTiles.parse("64x64w2s3")}
# The smallest steps: a few tiles x 90 column blocks leave most SMs idle while each program walks K's 45 steps in
# turn, so K is split: x0.73 at 1 token, x0.81 at 2, x0.94 at 4, x1.00 at 8. Its fp32 partial sums ([split, pairs,
# 2 x intermediate]: ~1 MB for 20b at 16 pairs) pass activation_bytes of their own step but are negligible beside
# the largest step's, which sets the graphs' pool and the eager reserve (engine.graph_memory).
SPLIT_K_TILES = GemmTiles.parse("64x64w4s3k4")
SPLIT_K_MAX_PAIRS = 16  # (token, expert) pairs: four tokens of a top-4 model


# The matrix-vector kernel (engine.kernels.moe_gemv) for steps of up to this many pairs, on experts held as words:
# 0 until a GPU times it faster than SPLIT_K_TILES (engine.kernels.moe_tiles' gemv candidates at 1 to 4 tokens).
# Compiled for sm_90 its loop issues ~210-260 warp-instructions a 4,096 weights, as the GEMM's does; what it might
# win is latency: no padded rows, no partial sums to reduce, ~1,440 programs of 20b's gate_up at one token.
GEMV_MAX_PAIRS = 0
GEMV_TILES = GemmTiles.parse("gemv16x256w4s1")


def tiles_for(block_m: int, num_pairs: int, words: bool = False) -> GemmTiles:
    """The launch shape the engine's MoE takes for a step of `num_pairs` (token, expert) pairs at `block_m` rows
    a tile; `words`: whether the experts are held as words with bf16 activations (what the gemv kernel takes)."""
    if words and 0 < num_pairs <= GEMV_MAX_PAIRS:
        return GEMV_TILES
    if num_pairs <= SPLIT_K_MAX_PAIRS:
        return SPLIT_K_TILES
    return TILES_BY_BLOCK_M.get(block_m, DEFAULT_TILES)


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Rows per tile from the shapes alone (no data): twice the mean rows per expert, 16 to MAX_BLOCK_M.

    Every tile decodes its expert's whole weight slice, which is what bounds the MXFP4 MoE on an H100 (the
    tensor cores idle behind the decode's instruction issue), so a step costs about its tile count. Routing
    is uneven: with tiles of the mean, the experts above it (nearly half) take a second tile; twice the
    mean gives nearly every expert one (20b at decode batch 256: 32 tiles a layer, against 45 at the mean),
    for a loop a few instructions longer (engine.kernels.moe_cost).
    """
    mean = max(1, num_pairs // num_experts)
    return min(MAX_BLOCK_M, max(16, triton.next_power_of_2(2 * mean)))


def fused_experts(x: Tensor, expert_ids: Tensor, weights: Tensor, gate_up: ExpertWeight, gate_up_bias: Tensor,
                  down: ExpertWeight, down_bias: Tensor, alpha: float, limit: float, block_m: int = 0,
                  residual: Tensor | None = None, tiles: GemmTiles = DEFAULT_TILES) -> Tensor:
    """The gpt-oss MoE: x [T, hidden], expert_ids / weights [T, top_k] -> [T, hidden] in x's dtype (+ residual).

    block_m: rows per tile (INVARIANT_BLOCK_M for batch-invariant results); 0 picks it from the shapes. tiles: the
    GEMMs' other launch parameters.
    """
    num_tokens, top_k = expert_ids.shape
    num_experts, hidden, two_inter = gate_up.shape
    if down.shape != (num_experts, two_inter // 2, hidden) or x.shape != (num_tokens, hidden):
        raise ValueError(f"MoE shapes do not match: x {tuple(x.shape)}, gate_up {gate_up.shape}, down {down.shape}")
    if hidden % 2 or two_inter % 4:
        raise ValueError(f"hidden {hidden} and intermediate {two_inter // 2} must be even")
    if tiles.gemv:
        per_pair = _expert_rows_gemv(x, expert_ids, top_k, weights, gate_up, gate_up_bias, down, down_bias, alpha,
                                     limit, tiles)
        return fused.moe_combine(per_pair, top_k, x.dtype, residual)
    routing = route(expert_ids, num_experts, block_m or block_m_for(num_tokens * top_k, num_experts))
    per_pair = _expert_rows(x, routing, top_k, weights, gate_up, gate_up_bias, down, down_bias, alpha, limit, tiles)
    return fused.moe_combine(per_pair, top_k, x.dtype, residual)


def fused_experts_from_logits(x: Tensor, logits: Tensor, top_k: int, gate_up: ExpertWeight, gate_up_bias: Tensor,
                              down: ExpertWeight, down_bias: Tensor, alpha: float, limit: float,
                              block_m: int = 0, residual: Tensor | None = None) -> Tensor:
    """`fused_experts` from the router's logits [T, E]: the top_k experts of each token, their softmax weights
    and the routing in one launch (engine.kernels.moe_route.route_logits); + `residual` when given (the
    residual stream's add after the MoE, in the same launch as the sum over each token's experts)."""
    per_pair = _expert_rows_from_logits(x, logits, top_k, gate_up, gate_up_bias, down, down_bias, alpha, limit,
                                        block_m)
    return fused.moe_combine(per_pair, top_k, x.dtype, residual)


def fused_experts_from_logits_norm(x: Tensor, logits: Tensor, top_k: int, gate_up: ExpertWeight,
                                   gate_up_bias: Tensor, down: ExpertWeight, down_bias: Tensor, alpha: float,
                                   limit: float, block_m: int, residual: Tensor, norm_weight: Tensor,
                                   eps: float) -> tuple[Tensor, Tensor]:
    """`fused_experts_from_logits` with the residual add, and the next RMSNorm (`norm_weight`, `eps`) of the sum in
    the same launch: (the residual stream, its norm)."""
    per_pair = _expert_rows_from_logits(x, logits, top_k, gate_up, gate_up_bias, down, down_bias, alpha, limit,
                                        block_m)
    return fused.moe_combine_norm(per_pair, top_k, residual, norm_weight, eps)


def _expert_rows_from_logits(x: Tensor, logits: Tensor, top_k: int, gate_up: ExpertWeight, gate_up_bias: Tensor,
                             down: ExpertWeight, down_bias: Tensor, alpha: float, limit: float,
                             block_m: int) -> Tensor:
    """[T * top_k, hidden] fp32: each (token, slot) pair's expert output times its router weight, routed from
    the router's logits [T, E]."""
    num_tokens, num_experts = logits.shape
    if gate_up.shape[0] != num_experts or x.shape[0] != num_tokens:
        raise ValueError(f"router logits {tuple(logits.shape)} do not match x {tuple(x.shape)} and "
                         f"{gate_up.shape[0]} experts")
    forced = bool(block_m)  # a batch-invariant run's height: one launch shape at every step size
    if num_tokens * top_k > ROUTE_KERNEL_MAX_PAIRS and not block_m:
        # torch's top-k and softmax (its softmax may round a weight otherwise than the kernel's, so batch-invariant
        # runs, which give block_m, keep to the kernel at any size)
        top_logits, expert_ids = torch.topk(logits, top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1)
        routing = route(expert_ids, num_experts, block_m_for(num_tokens * top_k, num_experts))
    else:
        block_m = block_m or block_m_for(num_tokens * top_k, num_experts)
        expert_ids, weights, sorted_pairs, offsets, tile_expert, row_start = route_logits(
            logits, top_k, block_m, max_tiles(num_tokens * top_k, num_experts, block_m))
        routing = Routing(sorted_pairs, offsets, tile_expert, row_start, block_m)
    # the shapes were timed on MXFP4 experts: dense ones keep the default
    timed = not forced and gate_up.blocks is not None
    num_pairs = num_tokens * top_k
    # (the words check only where the gemv could apply: it is a few Python calls a layer, every step)
    words = num_pairs <= GEMV_MAX_PAIRS and _takes_gemv(x, gate_up, down)
    tiles = tiles_for(routing.block_m, num_pairs, words=words) if timed else DEFAULT_TILES
    if tiles.gemv:
        return _expert_rows_gemv(x, expert_ids, top_k, weights, gate_up, gate_up_bias, down, down_bias, alpha,
                                 limit, tiles)
    return _expert_rows(x, routing, top_k, weights, gate_up, gate_up_bias, down, down_bias, alpha, limit, tiles)


def _takes_gemv(x: Tensor, gate_up: ExpertWeight, down: ExpertWeight) -> bool:
    """Whether the matrix-vector kernel can take this MoE: experts held as words, bf16 activations."""
    return x.dtype == torch.bfloat16 and all(w.blocks is not None and is_words(w.blocks) for w in (gate_up, down))


def _expert_rows_gemv(x: Tensor, expert_ids: Tensor, top_k: int, weights: Tensor, gate_up: ExpertWeight,
                      gate_up_bias: Tensor, down: ExpertWeight, down_bias: Tensor, alpha: float, limit: float,
                      tiles: GemmTiles) -> Tensor:
    """`_expert_rows` by engine.kernels.moe_gemv: a program per (pair, column block), no routing; [T * top_k,
    hidden] fp32 by pair."""
    if tiles.split_k != 1:
        raise ValueError(f"the MoE's matrix-vector kernel does not split K: {tiles}")
    if not _takes_gemv(x, gate_up, down):
        raise ValueError(f"the MoE's matrix-vector kernel ({tiles}) takes experts held as MXFP4 words "
                         f"(engine.mxfp4_words) and bf16 activations, got {x.dtype}")
    assert gate_up.blocks is not None and gate_up.scales is not None  # for mypy: _takes_gemv holds
    assert down.blocks is not None and down.scales is not None
    return gemv_experts(x, expert_ids, top_k, weights, (gate_up.blocks, gate_up.scales, gate_up_bias),
                        (down.blocks, down.scales, down_bias), alpha, limit, block_n=tiles.block_n,
                        block_k=tiles.block_k, num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def _expert_rows(x: Tensor, routing: Routing, top_k: int, weights: Tensor, gate_up: ExpertWeight,
                 gate_up_bias: Tensor, down: ExpertWeight, down_bias: Tensor, alpha: float, limit: float,
                 tiles: GemmTiles = DEFAULT_TILES) -> Tensor:
    activated = gate_up_swiglu(x, routing, top_k, gate_up, gate_up_bias, alpha, limit, tiles)
    return down_weighted(activated, routing, down, down_bias, weights.reshape(-1).contiguous(), tiles)


@torch.library.custom_op("batchrun::moe_experts", mutates_args=())
def moe_experts(x: Tensor, expert_ids: Tensor, weights: Tensor, gate_up: Tensor, gate_up_scales: Tensor | None,
                gate_up_bias: Tensor, down: Tensor, down_scales: Tensor | None, down_bias: Tensor,
                alpha: float, limit: float, block_m: int = 0) -> Tensor:
    """`fused_experts` as one opaque op, so torch.compile traces over it (the kernels' launches stay inside).

    A weight with scales is MXFP4 blocks; without, dense.
    """
    return fused_experts(x, expert_ids, weights, _expert_weight(gate_up, gate_up_scales), gate_up_bias,
                         _expert_weight(down, down_scales), down_bias, alpha, limit, block_m)


@moe_experts.register_fake
def _moe_experts_fake(x: Tensor, expert_ids: Tensor, weights: Tensor, gate_up: Tensor, gate_up_scales: Tensor | None,
                      gate_up_bias: Tensor, down: Tensor, down_scales: Tensor | None, down_bias: Tensor,
                      alpha: float, limit: float, block_m: int = 0) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("batchrun::moe_experts_from_logits_norm", mutates_args=())
def moe_experts_from_logits_norm(x: Tensor, logits: Tensor, top_k: int, gate_up: Tensor,
                                 gate_up_scales: Tensor | None, gate_up_bias: Tensor, down: Tensor,
                                 down_scales: Tensor | None, down_bias: Tensor, alpha: float, limit: float,
                                 block_m: int, residual: Tensor, norm_weight: Tensor,
                                 eps: float) -> tuple[Tensor, Tensor]:
    """`fused_experts_from_logits_norm` as one opaque op (see moe_experts)."""
    return fused_experts_from_logits_norm(x, logits, top_k, _expert_weight(gate_up, gate_up_scales), gate_up_bias,
                                          _expert_weight(down, down_scales), down_bias, alpha, limit, block_m,
                                          residual, norm_weight, eps)


@moe_experts_from_logits_norm.register_fake
def _moe_experts_from_logits_norm_fake(x: Tensor, logits: Tensor, top_k: int, gate_up: Tensor,
                                       gate_up_scales: Tensor | None, gate_up_bias: Tensor, down: Tensor,
                                       down_scales: Tensor | None, down_bias: Tensor, alpha: float, limit: float,
                                       block_m: int, residual: Tensor, norm_weight: Tensor,
                                       eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(residual), torch.empty_like(residual)


def _expert_weight(weight: Tensor, scales: Tensor | None) -> ExpertWeight:
    return ExpertWeight(dense=weight) if scales is None else ExpertWeight(blocks=weight, scales=scales)


def gate_up_swiglu(x: Tensor, routing: Routing, top_k: int, gate_up: ExpertWeight, bias: Tensor,
                   alpha: float, limit: float, tiles: GemmTiles = DEFAULT_TILES) -> Tensor:
    """x [T, hidden] -> [T * top_k, intermediate] in sorted-row order: swiglu(x[token] @ gate_up[e] + bias[e])."""
    num_pairs, two_inter = routing.sorted_pairs.numel(), gate_up.shape[2]
    activated = torch.empty(num_pairs, two_inter // 2, dtype=x.dtype, device=x.device)
    if tiles.split_k == 1:
        _launch(x, gate_up, bias, activated, routing, top_k, pair_weights=x, swiglu=(alpha, limit), tiles=tiles)
        return activated
    partial = torch.empty(tiles.split_k, num_pairs, two_inter, dtype=torch.float32, device=x.device)
    _launch(x, gate_up, bias, partial, routing, top_k, pair_weights=x, swiglu=(alpha, limit), tiles=tiles)
    if num_pairs:
        block_m, block_n = 16, 128
        swiglu_reduce_kernel[(triton.cdiv(num_pairs, block_m), triton.cdiv(two_inter, block_n))](
            partial, activated, num_pairs, two_inter, partial.stride(0), partial.stride(1), activated.stride(0),
            alpha, limit, SPLIT_K=tiles.split_k, BLOCK_M=block_m, BLOCK_N=block_n)
    return activated


def down_weighted(activated: Tensor, routing: Routing, down: ExpertWeight, bias: Tensor,
                  pair_weights: Tensor, tiles: GemmTiles = DEFAULT_TILES) -> Tensor:
    """activated [P, intermediate] (sorted rows) -> fp32 [P, hidden] by pair: w[pair] * (a @ down[e] + bias[e]);
    with K split (tiles.split_k > 1) [split, P, hidden], the splits' partial sums (the experts' sum adds them)."""
    splits = (tiles.split_k,) if tiles.split_k > 1 else ()
    per_pair = torch.empty(*splits, activated.shape[0], down.shape[2], dtype=torch.float32, device=activated.device)
    _launch(activated, down, bias, per_pair, routing, 1, pair_weights=pair_weights, swiglu=None, tiles=tiles)
    return per_pair


def _launch(a: Tensor, w: ExpertWeight, bias: Tensor, out: Tensor, routing: Routing, top_k: int, *,
            pair_weights: Tensor, swiglu: tuple[float, float] | None, tiles: GemmTiles) -> None:
    """moe_gemm_kernel over (tile, column block); `swiglu` (alpha, limit) selects the gate_up epilogue."""
    num_experts, k, n = w.shape
    block_n, block_k = tiles.block_n, tiles.block_k
    if w.dense is not None:
        weights, w_ptr, scales = "dense", w.dense, w.dense  # scales unused
        w_strides = (w.dense.stride(0), w.dense.stride(1), w.dense.stride(2))
        s_strides = (0, 0, 0)
    else:
        assert w.blocks is not None and w.scales is not None  # for mypy
        weights = "mxfp4" if a.dtype in SCALED_DOT_FORMATS else "mxfp4_upcast"
        w_ptr, scales = w.blocks, w.scales
        w_strides = (w.blocks.stride(0), 1, w.blocks.stride(1))  # (expert, byte along in, out)
        if is_words(w.blocks):  # (expert, word along in, out)
            if a.dtype != torch.bfloat16 or not takes_k_step(block_k):
                raise ValueError(f"MXFP4 words take bf16 activations and K steps of a multiple of {WORDS_CHUNK} "
                                 f"up to {MAX_K_STEP}: got {a.dtype}, {tiles}")
            weights = "mxfp4_words"
        s_strides = (w.scales.stride(0), w.scales.stride(2), w.scales.stride(1))  # (expert, group, out)
    alpha, limit = swiglu or (0.0, 0.0)
    grid = (routing.tile_expert.numel(), triton.cdiv(n, block_n), tiles.split_k)
    moe_gemm_kernel[grid](
        a, w_ptr, scales, bias, out, pair_weights,
        routing.sorted_pairs, routing.tile_expert, routing.tile_row_start, routing.expert_offsets,
        k, n, num_experts, top_k, alpha, limit,
        a.stride(0), a.stride(1), *w_strides, *s_strides, bias.stride(0), bias.stride(1), out.stride(-2),
        out.stride(0) if tiles.split_k > 1 else 0,
        SWIGLU=swiglu is not None, WEIGHTS=weights, A_FORMAT=SCALED_DOT_FORMATS.get(a.dtype, ""),
        EVEN_K=k % block_k == 0,
        PRECISION="ieee" if a.dtype == torch.float32 or UPCAST_DOT_OPERANDS else "tf32", ASM=not interpreted(),
        DOT_DTYPE=tl.float32 if UPCAST_DOT_OPERANDS else _TL_DTYPES[a.dtype],
        BLOCK_M=routing.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages, SPLIT_K=tiles.split_k,
    )


def time_routing(device: str, tokens: tuple[int, ...], num_experts: int = 32, top_k: int = 4,
                 repeats: int = 20) -> list[tuple[int, float, float]]:
    """(tokens, the kernel's us, torch's us) per step size: route_logits against torch.topk, torch.softmax
    and route_reference on random bf16 logits, each the median of `repeats` (on a GPU: a CUDA graph's replays,
    as inside the engine's graphs, timed by CUDA events). What ROUTE_KERNEL_MAX_PAIRS should be."""
    from functools import partial

    from engine.device import graphed, median_us

    def by_torch(logits: Tensor, block_m: int) -> None:
        top_logits, expert_ids = torch.topk(logits, top_k, dim=-1)
        torch.softmax(top_logits, dim=-1)
        route_reference(expert_ids, num_experts, block_m)

    rows = []
    for num_tokens in tokens:
        logits = torch.randn(num_tokens, num_experts, device=device).to(torch.bfloat16)
        block_m = block_m_for(num_tokens * top_k, num_experts)
        tiles = max_tiles(num_tokens * top_k, num_experts, block_m)
        rows.append((num_tokens, median_us(graphed(partial(route_logits, logits, top_k, block_m, tiles), device),
                                           device, repeats),
                     median_us(graphed(partial(by_torch, logits, block_m), device), device, repeats)))
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="The MoE's routing kernel against torch's, timed per step size.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", default="1,64,256,1024,2048,8192", help="step sizes, comma-separated")
    args = parser.parse_args()
    for num_tokens, kernel_us, torch_us in time_routing(args.device, tuple(map(int, args.tokens.split(",")))):
        print(f"routing T={num_tokens} ({num_tokens * 4} pairs; the engine's kernel up to {ROUTE_KERNEL_MAX_PAIRS}): "
              f"kernel {kernel_us:.1f} us, torch {torch_us:.1f} us")
