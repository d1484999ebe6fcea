"""The MoE's grouped GEMMs per launch shape: timed on a GPU, compiled for sm_90 on a CPU (issue 24).

engine.kernels.moe launches both projections with DEFAULT_TILES (64 columns and 64 of K a loop step, 4 warps, 3
pipeline stages), chosen from sm_90 compiles, but where an H200 timed another shape faster (moe.TILES_BY_BLOCK_M,
moe.SPLIT_K_TILES). `time_tiles` runs one MoE layer of gpt-oss-20b's
shape (32 experts, top 4, hidden and intermediate 2,880; MXFP4 experts of random codes and scales, seeded random
router logits) at each step size with each of CANDIDATES, and with the experts held dense (bf16 on a GPU) at the
default shape, and with bf16 activations each shape again on the experts re-packed as words (engine.mxfp4_words,
what the engine holds on a GPU): the median of CUDA-event timings, and each output against the default's (a
faster shape with another answer is a bug, not a win). `python -m engine.kernels.moe_tiles` prints a `moe T=`
line a (step size, shape) and the fastest shape a step size: what those should become. `--sm90`
prints instead what each candidate compiles to for sm_90 here (engine.kernels.sm90, never run): its inner loop,
registers, spills and the issue-bound time engine.kernels.moe_cost makes of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import torch
from torch import Tensor

from engine.device import MAX_RELATIVE_DIFF, relative_diff
from engine import mxfp4_words
from engine.kernels.moe import DEFAULT_TILES, ExpertWeight, GemmTiles, block_m_for, fused_experts
from engine.mxfp4 import MXFP4_BLOCK, dequantize


class MoeShape(NamedTuple):
    hidden: int
    intermediate: int
    experts: int
    top_k: int


SHAPES = {"20b": MoeShape(2880, 2880, 32, 4), "tiny": MoeShape(64, 64, 8, 2)}
LAYERS_20B = 24
# The default first; then a longer K step (2,880 is no multiple of 128: its last step is masked), 2 warps (compiled
# for sm_90 they issue ~30% less than 4 at the 16-row tiles of steps up to ~64 tokens, ~40% more at 64 rows), K
# split 4 and 2 ways (on an H200 a batch-1 step's MoE launches took ~38 us each, a few programs an SM each walking
# K's 45 steps in turn), deeper pipelines for the small steps, whose loops wait on their loads (the same issue
# as their 3-stage shapes, more loads in flight), and 128 x 128 tiles on 8 warps for the 128-row tiles of big steps
# (2,048 tokens ran at ~1/3 of the tensor cores' bf16 peak in padded tiles on an H200, ~3x the issue bound: wider
# MMAs may do better), and for batch 1, where the 4-way split took a layer from 87.8 to 64.3 us (still ~6x its
# weights' read), an 8-way split and a 2-warp 4-way one with a deeper pipeline. An H200 timed 128x64w4s3 and
# 32x64w2s3 at every step size and never found them fastest. sm_90 compiles of each: README (python -m
# engine.kernels.moe_tiles --sm90).
# Last, the matrix-vector kernel (engine.kernels.moe_gemv: a program per pair, on words only, at steps of up to
# GEMV_MAX_TOKENS), whose 16 and 32 columns a program give 20b's gate_up 1,440 and 720 programs a token.
CANDIDATES = tuple(GemmTiles.parse(text) for text in
                   ("64x64w4s3", "64x128w4s3", "64x64w2s3", "64x64w4s3k4", "64x128w4s3k2", "64x64w2s5",
                    "64x128w4s4", "128x128w8s3", "64x64w4s3k8", "64x64w2s4k4", "gemv16x256w4s1", "gemv32x256w4s1",
                    "gemv16x128w2s1"))
# The most tokens a step the gemv candidates are timed at: past a few, each pair's program reading its expert's
# weights on its own costs ~pairs / experts x the GEMM's reads (and minutes of a GPU check at 2,048 tokens).
GEMV_MAX_TOKENS = 16
DENSE = "dense"  # the experts held dense, at the default shape
WORDS_SUFFIX = "+words"  # a shape's run on the experts re-packed as engine.mxfp4_words (the engine's on a GPU)
# the default shape on words with the checkpoint's scale bytes (a synchronous load a K step) instead of scale words
SCALE_BYTES_SUFFIX = "+words(scale bytes)"
ALPHA, LIMIT = 1.702, 7.0


@dataclass(frozen=True)
class TilesTiming:
    """One (step size, launch shape): microseconds a layer (None: it failed), its output's distance from the
    default shape's (`relative_diff`), the bytes of expert weights the layer reads at least once."""

    tokens: int
    tiles: str  # GemmTiles as text, or DENSE
    us: float | None
    diff: float
    weight_bytes: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.us is not None and self.diff <= MAX_RELATIVE_DIFF


@dataclass(frozen=True)
class MoeLayer:
    """One MoE layer's experts, packed and dense, with their biases."""

    shape: MoeShape
    gate_up: ExpertWeight
    down: ExpertWeight
    gate_up_dense: ExpertWeight
    down_dense: ExpertWeight
    gate_up_bias: Tensor
    down_bias: Tensor
    gate_up_words: ExpertWeight | None = None  # the packed experts as engine.mxfp4_words (bf16 activations only)
    down_words: ExpertWeight | None = None

    def experts(self, form: str) -> tuple[ExpertWeight, ExpertWeight]:
        """(gate_up, down) in one of `_runs`' forms: "blocks", "dense", "words", or "scale bytes" (the words with the
        checkpoint's scale bytes, as the engine held them before scale words)."""
        if form in ("blocks", "dense"):
            return (self.gate_up, self.down) if form == "blocks" else (self.gate_up_dense, self.down_dense)
        assert self.gate_up_words is not None and self.down_words is not None  # _runs has words only where these are
        if form == "words":
            return self.gate_up_words, self.down_words
        return (ExpertWeight(blocks=self.gate_up_words.blocks, scales=self.gate_up.scales),
                ExpertWeight(blocks=self.down_words.blocks, scales=self.down.scales))


def build_layer(shape: MoeShape, device: str, dtype: torch.dtype, seed: int = 0) -> MoeLayer:
    """Random MXFP4 experts (every code; scales 2^-9 to 2^-5, so the SwiGLU's inputs stay within its clamp for
    unit activations) and the same experts dequantised to `dtype`."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def packed(out_features: int, in_features: int) -> ExpertWeight:
        groups = in_features // MXFP4_BLOCK
        blocks = torch.randint(0, 256, (shape.experts, out_features, groups, MXFP4_BLOCK // 2), dtype=torch.uint8,
                               device=device, generator=generator)
        scales = torch.randint(118, 123, (shape.experts, out_features, groups), dtype=torch.uint8, device=device,
                               generator=generator)
        return ExpertWeight(blocks=blocks, scales=scales)

    gate_up, down = packed(2 * shape.intermediate, shape.hidden), packed(shape.hidden, shape.intermediate)
    dense = [ExpertWeight(dense=dequantize(w.blocks, w.scales, dtype)) for w in (gate_up, down)
             if w.blocks is not None and w.scales is not None]
    biases = [torch.randn(shape.experts, n, device=device, generator=generator).to(dtype) * 0.1
              for n in (2 * shape.intermediate, shape.hidden)]
    words = [ExpertWeight(blocks=mxfp4_words.pack(w.blocks), scales=mxfp4_words.pack_scales(w.scales))
             for w in (gate_up, down)
             if w.blocks is not None and w.scales is not None and dtype == torch.bfloat16
             and mxfp4_words.fits(w.blocks, w.scales)]
    return MoeLayer(shape, gate_up, down, dense[0], dense[1], biases[0], biases[1], *words)


def time_tiles(device: str, tokens: tuple[int, ...], shape: MoeShape = SHAPES["20b"],
               candidates: tuple[GemmTiles, ...] = CANDIDATES, repeats: int = 20, layer: MoeLayer | None = None,
               report: Callable[[TilesTiming], None] | None = None) -> list[TilesTiming]:
    """Each step size in `tokens` through one MoE layer with each of `candidates` (DEFAULT_TILES is the
    reference, first whether listed or not) and with the experts dense: a TilesTiming each, in that order.
    Every shape of a step size runs once (compiles, and its output is compared) before any is timed, so none is
    timed cold; on CUDA each is timed as a CUDA graph's replay (as the engine's steps run it). The activations take
    the layer's dtype: bf16 on CUDA, fp32 elsewhere (the interpreter's MXFP4 path), unless a layer is given.
    `report(timing)` is called as each lands. A shape that
    fails (a launch past the GPU's resources) is recorded, not raised."""
    from engine.device import graphed, median_us

    if layer is None:
        layer = build_layer(shape, device, torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    dtype = layer.gate_up_bias.dtype  # the activations' too
    order = (DEFAULT_TILES, *[c for c in candidates if c != DEFAULT_TILES])
    timings: list[TilesTiming] = []
    for num_tokens in tokens:
        generator = torch.Generator(device=device).manual_seed(num_tokens)
        x = torch.randn(num_tokens, shape.hidden, device=device, generator=generator).to(dtype)
        logits = torch.randn(num_tokens, shape.experts, device=device, generator=generator)
        top_logits, expert_ids = torch.topk(logits, shape.top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1).to(dtype)
        hit = torch.unique(expert_ids).numel()
        # name -> (the call, its weight bytes, its output's distance from the default's, or its error)
        runs: dict[str, tuple[Callable[[], Tensor], int, float | str]] = {}
        reference: Tensor | None = None
        for name, tiles, form in _runs(order, layer, num_tokens):
            gate_up, down = layer.experts(form)
            dense = form == "dense"
            run = partial(fused_experts, x, expert_ids, weights, gate_up, layer.gate_up_bias, down, layer.down_bias,
                          ALPHA, LIMIT, 0, None, tiles)
            weight_bytes = hit * _bytes_per_expert(shape, dense=dense, dtype=dtype)
            try:
                out = run()
            except Exception as error:  # noqa: BLE001 - a shape past the device's resources is a result
                runs[name] = (run, weight_bytes, f"{type(error).__name__}: {error}".splitlines()[0][:200])
                continue
            reference = out if reference is None else reference
            runs[name] = (run, weight_bytes, relative_diff(out, reference))
        for name, (call, weight_bytes, diff) in runs.items():
            if isinstance(diff, str):
                timing = TilesTiming(num_tokens, name, None, float("inf"), weight_bytes, diff)
            else:
                try:
                    timing = TilesTiming(num_tokens, name, median_us(graphed(call, device), device, repeats), diff,
                                         weight_bytes)
                except Exception as error:  # noqa: BLE001 - a capture that fails is a result too
                    timing = TilesTiming(num_tokens, name, None, float("inf"), weight_bytes,
                                         f"{type(error).__name__}: {error}".splitlines()[0][:200])
            timings.append(timing)
            if report is not None:
                report(timing)
    return timings


def _runs(order: tuple[GemmTiles, ...], layer: MoeLayer, num_tokens: int) -> list[tuple[str, GemmTiles, str]]:
    """(name, tiles, weights' form) a step size runs, the default on blocks first and dense last: each GEMM shape on
    the checkpoint's blocks, then each shape on words (WORDS_SUFFIX) where the layer has them and the K step is
    whole chunks of them (engine.mxfp4_words; a K it does not divide ends in single chunks; the gemv shapes up to
    GEMV_MAX_TOKENS), the default shape on words with scale bytes (SCALE_BYTES_SUFFIX), then the experts dense."""
    runs = [(str(tiles), tiles, "blocks") for tiles in order if not tiles.gemv]
    if layer.gate_up_words is not None:
        runs += [(f"{tiles}{WORDS_SUFFIX}", tiles, "words") for tiles in order
                 if mxfp4_words.takes_k_step(tiles.block_k) and (not tiles.gemv or num_tokens <= GEMV_MAX_TOKENS)]
        runs.append((f"{DEFAULT_TILES}{SCALE_BYTES_SUFFIX}", DEFAULT_TILES, "scale bytes"))
    return runs + [(DENSE, DEFAULT_TILES, "dense")]


def _bytes_per_expert(shape: MoeShape, dense: bool, dtype: torch.dtype) -> int:
    weights = 3 * shape.hidden * shape.intermediate  # gate_up's 2 x intermediate columns, then down
    if dense:
        return weights * torch.finfo(dtype).bits // 8
    return weights // 2 + weights // MXFP4_BLOCK  # half a byte a code and a scale byte a group


def describe(timing: TilesTiming, default_us: float | None, layers: int = LAYERS_20B) -> str:
    """A `moe T=` line: the time a layer (and at `layers` layers, unless 0), against the default shape, the
    weights' rate."""
    head = f"moe T={timing.tokens} {timing.tiles}{' (default)' if timing.tiles == str(DEFAULT_TILES) else ''}"
    if timing.us is None:
        return f"{head}: failed ({timing.error})"
    ratio = f", x{timing.us / default_us:.2f} the default" if default_us else ""
    rate = timing.weight_bytes / (timing.us * 1e-6) / 1e12
    verdict = "" if timing.ok else f" DIFFERS from the default's output (> {MAX_RELATIVE_DIFF})"
    step = f", {timing.us * layers / 1000:.2f} ms at {layers} layers" if layers else ""
    return (f"{head}: {timing.us:.1f} us a layer{ratio}{step}, {rate:.2f} TB/s of the hit experts' weights, "
            f"diff {timing.diff:.1e}{verdict}")


def fastest(timings: list[TilesTiming], num_tokens: int) -> TilesTiming | None:
    """The fastest correct packed (MXFP4) shape at `num_tokens`."""
    found = [t for t in timings if t.tokens == num_tokens and t.tiles != DENSE and t.ok]
    return min(found, key=lambda t: t.us or 0.0, default=None)


def sm90_report(tokens: tuple[int, ...], candidates: tuple[GemmTiles, ...] = CANDIDATES) -> dict:
    """Each candidate compiled for sm_90 at the 20b shape and each step size (a child process: engine.kernels.sm90)."""
    from engine.kernels import sm90

    return sm90.moe_inner_loop(tokens, (0,), timeout_s=900, tiles=tuple(map(str, candidates)))


def sm90_lines(report: dict, candidates: tuple[GemmTiles, ...] = CANDIDATES) -> list[str]:
    """A line per (step size, candidate, on blocks and on words where compiled) of `sm90_report`'s: the inner loops
    per 4,096 weights, registers, spills, shared memory, and the issue-bound time of a 24-layer step
    (engine.kernels.moe_cost)."""
    from engine.kernels import moe_cost

    lines = []
    compiled = {(k["gemm_tiles"], k["weights"]) for k in report["kernels"]}
    runs = [(str(tiles), weights) for tiles in candidates for weights in ("mxfp4", "mxfp4_words")
            if (str(tiles), weights) in compiled]
    for num_tokens in report["tokens"]:
        for tiles, weights in runs:
            kernels = sorted(moe_cost.mxfp4_kernels(report, num_tokens, 0, tiles, weights),
                             key=lambda k: k["projection"])
            name = tiles + (WORDS_SUFFIX if weights == "mxfp4_words" else "")
            lines.append(f"sm90 T={num_tokens} {name}: down/gate_up "
                         f"{'/'.join(format(k['per_4096'], '.0f') for k in kernels)} warp-instr / 4096 weights, "
                         f"{'/'.join(str(k['registers']) for k in kernels)} registers, "
                         f"{'/'.join(str(k['sync_loads']) for k in kernels)} synchronous loads a step, "
                         f"{sum(k['spills'] for k in kernels)} spills, "
                         f"{max(k['shared_bytes'] for k in kernels):,} B shared; issue-bound "
                         f"{moe_cost.issue_bound_ms(report, num_tokens, tiles=tiles, weights=weights):.2f} ms at "
                         f"{LAYERS_20B} layers")
    return lines


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.kernels.moe_tiles`: the MoE's launch shapes timed, or compiled for sm_90 (--sm90)."""
    import argparse

    parser = argparse.ArgumentParser(description="The MoE's grouped GEMMs timed per launch shape.")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", default="256,64,16,4,1,1024,2048",
                        help="step sizes, comma-separated (most telling first)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="20b")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiles", type=lambda text: tuple(map(GemmTiles.parse, text.split(","))),
                        default=CANDIDATES, help="launch shapes, comma-separated, e.g. 64x128w4s4,64x64w2s3 "
                        "(default: CANDIDATES; timed, the default shape runs first either way)")
    parser.add_argument("--sm90", action="store_true", help="compile each candidate for sm_90 here instead")
    args = parser.parse_args(argv)
    tokens = tuple(int(v) for v in args.tokens.split(","))
    if args.sm90:
        print("\n".join(sm90_lines(sm90_report(tokens, args.tiles), args.tiles)))
        return
    shape = SHAPES[args.shape]
    print(f"moe tiles: {args.shape} shape {tuple(shape)}"
          + (", each timed as a CUDA graph's replay" if torch.device(args.device).type == "cuda" else "")
          + ", block_m (rows a tile) "
          + ", ".join(f"T={t}: {block_m_for(t * shape.top_k, shape.experts)}" for t in tokens), flush=True)
    default_us: dict[int, float | None] = {}
    landed: list[TilesTiming] = []

    def report(timing: TilesTiming) -> None:
        default_us.setdefault(timing.tokens, timing.us)  # the default shape lands first
        print(describe(timing, default_us[timing.tokens], LAYERS_20B if args.shape == "20b" else 0), flush=True)
        landed.append(timing)
        if timing.tiles == DENSE:  # a step size's last: its fastest now, should a timeout cut the next
            best, base = fastest(landed, timing.tokens), default_us[timing.tokens]
            print(f"moe T={timing.tokens} fastest: " + (f"{best.tiles}, x{best.us / base:.2f} the default"
                                                        if best and best.us and base else "none ran correctly"),
                  flush=True)

    timings = time_tiles(args.device, tokens, shape, args.tiles, repeats=args.repeats, report=report)
    # a shape past the GPU's resources is a finding; a wrong answer, or no default, is a failure
    if any(t.us is not None and not t.ok for t in timings) or any(v is None for v in default_us.values()):
        raise SystemExit("a launch shape's output differed from the default's, or the default failed (lines above)")


if __name__ == "__main__":
    main()
