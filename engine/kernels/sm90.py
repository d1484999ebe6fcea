"""The MoE kernels compiled for sm_90 (an H100) without a GPU: the inner K loop's SASS, counted.

`moe_inner_loop()` starts `python -m engine.kernels.sm90` in a process of its own, because compiling
for a GPU that is not there changes process-wide state the interpreter-mode tests depend on: it sets
TRITON_INTERPRET=0 before triton loads, makes Triton's active driver report an sm_90 target, and turns
every kernel launch into a compile (JITFunction.run with warmup=True: nothing ever runs). The MoE is
driven through `engine.kernels.moe.fused_experts` with CPU tensors of gpt-oss-20b's shapes, so the
constexprs and argument specialisations are those the engine JITs on an H100.

The figure is the inner loop's length in warp-instructions per 4,096 weights: the SASS of the innermost
backward branch that does the most MMAs (read with the cuobjdump shipped in triton's wheel), times
num_warps / 4, times 4,096 / (BLOCK_N * BLOCK_K) weights per iteration. The MXFP4 path's goal is <= 350.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from engine.kernels import run_json_child


MOE_INNER_LOOP_GOAL = 350  # warp-instructions per 4,096 weights (issue 24: ~0.09 issue slots per weight)
# The decode attention's loop over one key tile (64 keys of a KV head, its 8 query heads): 840 warp-instructions with
# triton 3.6 (the GPU machines') and 577 with 3.9 while key positions were int64 and the block size a runtime
# divisor; 444 and 360 since
ATTENTION_LOOP_GOAL = 480
# tokens of context of the decode attention's compile: at 256 sequences 2 partitions of 512 a full layer, at 16 or
# fewer partitions of 256 or 128 (engine.kernels.decode_partition)
ATTENTION_CONTEXT = 1024
SLIDING_WINDOW = 128
DECODE_TOKENS = 256  # decode batch of the figure (BLOCK_M 64)
# gpt-oss-20b: hidden, intermediate, experts, experts per token
HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 2880, 2880, 32, 4
PROJECTION_SHAPES = {"gate_up": (HIDDEN, 2 * INTERMEDIATE), "down": (INTERMEDIATE, HIDDEN)}  # (in, out) an expert
WEIGHTS_PER_EXPERT = {name: k * n for name, (k, n) in PROJECTION_SHAPES.items()}
HEADS, KV_HEADS, HEAD_DIM = 64, 8, 64
VOCAB = 201_088
MMA_OPS = ("HGMMA", "HMMA")
FP64_OPS = ("DADD", "DFMA", "DMUL", "DSETP", "DMNMX")


def cuobjdump_path() -> Path | None:
    """The cuobjdump in triton's wheel (triton/backends/nvidia/bin), None without triton or without it."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia" / "bin" / "cuobjdump"
    return path if path.is_file() else None


def moe_inner_loop(num_tokens: int | tuple[int, ...] = DECODE_TOKENS, block_m: tuple[int, ...] = (0,),
                   timeout_s: float = 300, tiles: tuple[str, ...] = ()) -> dict[str, Any]:
    """Compile the MoE at the 20b shape for sm_90 in a child process, at each token count and rows per tile
    (`block_m`; 0: the engine's own choice, engine.kernels.moe.block_m_for), with each of `tiles` (GemmTiles
    as text; none: the engine's DEFAULT_TILES); its report (see `report`).

    Raises RuntimeError if the child fails (triton or cuobjdump missing, a kernel that does not compile).
    """
    tokens = (num_tokens,) if isinstance(num_tokens, int) else num_tokens
    args = ["--json", "--block-m", ",".join(map(str, block_m)), "--tokens", ",".join(map(str, tokens))]
    if tiles:
        args += ["--tiles", ",".join(tiles)]
    result: dict[str, Any] = run_json_child("engine.kernels.sm90", args, interpret=False, what="sm_90 compile",
                                            timeout_s=timeout_s)
    return result


# -- the child process -------------------------------------------------------------------------------------
def _compile_only_for_sm90() -> Any:
    """Make this process compile every Triton launch for sm_90 and run none; returns the recorded launches."""
    if os.environ.get("TRITON_INTERPRET") != "0":
        raise RuntimeError("the sm_90 compile needs a process of its own started with TRITON_INTERPRET=0")
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class FakeH100Driver:
        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self) -> torch.device:
            return torch.device("cpu")

    launches: list[tuple[Any, dict, Any]] = []  # (kernel function, launch kwargs, compiled kernel)
    run = JITFunction.run

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        compiled = run(self, *args, grid=grid, warmup=True, **kwargs)
        launches.append((self, kwargs, compiled))
        return compiled

    driver.set_active(FakeH100Driver())
    JITFunction.run = compile_only
    return launches


def _cuobjdump(cubin: bytes, flag: str) -> str:
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("no cuobjdump in triton's wheel (triton/backends/nvidia/bin)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout


def _sass(cubin: bytes) -> list[tuple[int, str]]:
    """(address, instruction) pairs of a cubin's SASS."""
    text = _cuobjdump(cubin, "-sass")
    return [(int(m[1], 16), m[2].strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", text)]


def _opcode(instruction: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split(" ")[0].split(".")[0]


def inner_loop(cubin: bytes, longest: bool = False) -> list[str]:
    """The innermost loop doing the most MMAs (a backward branch's body; the shorter on a tie), as SASS;
    `longest`: the longest loop instead (a kernel on the CUDA cores: its main loop, not a loop over a tail)."""
    sass = _sass(cubin)
    best: tuple[int, int, list[str]] = (-1, 0, [])
    for address, text in sass:
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", text)
        if target and int(target[1], 16) < address:
            body = [t for a, t in sass if int(target[1], 16) <= a <= address]
            mmas = sum(_opcode(t) in MMA_OPS for t in body)
            key = (0, len(body)) if longest else (mmas, -len(body))
            best = max(best, (*key, body), key=lambda loop: loop[:2])
    return best[2]


def _describe(kernel_fn: Any, kwargs: dict, compiled: Any, num_tokens: int, block_m_asked: int,
              counts: list[int], tiles: str) -> dict[str, Any]:
    """One launch: its block, loop, registers and spills, and the tiles the step's routing (`counts`: pairs
    per expert) gives at its BLOCK_M; `tiles`: the GemmTiles it was launched with, as text."""
    cubin = compiled.asm["cubin"]
    loop = inner_loop(cubin, longest=kernel_fn.__name__ == "moe_gemv_kernel")
    warps = compiled.metadata.num_warps
    per_4096 = len(loop) * warps / 4 * 4096 / (kwargs["BLOCK_N"] * kwargs["BLOCK_K"])
    opcodes = [_opcode(t) for t in loop]
    # the matrix-vector kernel (engine.kernels.moe_gemv): a program a pair, as a tile of one row would be
    block_m, projection = kwargs.get("BLOCK_M", 1), "gate_up" if kwargs["SWIGLU"] else "down"
    return {"projection": projection, "weights": kwargs.get("WEIGHTS", "mxfp4_words"), "tokens": num_tokens,
            "block_m_asked": block_m_asked, "tiles": sum(-(-count // block_m) for count in counts),
            "experts_hit": sum(c > 0 for c in counts), "weights_per_expert": WEIGHTS_PER_EXPERT[projection],
            "shape": list(PROJECTION_SHAPES[projection]),
            "kernel": kernel_fn.__name__, "block": [block_m, kwargs["BLOCK_N"], kwargs["BLOCK_K"]],
            "num_warps": warps, "gemm_tiles": tiles, "loop_instructions": len(loop), "per_4096": per_4096,
            # LDG: a global load into registers, which the loop waits for (pipelined copies are LDGSTS)
            "mma": {op: opcodes.count(op) for op in MMA_OPS}, "sync_loads": opcodes.count("LDG"),
            **resources(compiled)}


def resources(compiled: Any) -> dict[str, Any]:
    """A compiled kernel's registers, spill instructions (STL/LDL) and shared memory."""
    cubin = compiled.asm["cubin"]
    usage = re.search(r"REG:(\d+)", _cuobjdump(cubin, "--dump-resource-usage"))
    spills = sum(_opcode(t) in ("STL", "LDL") for _, t in _sass(cubin))
    return {"registers": int(usage[1]) if usage else None, "spills": spills, "shared_bytes": compiled.metadata.shared}


def _describe_other(kernel_fn: Any, kwargs: dict, compiled: Any, num_tokens: int) -> dict[str, Any]:
    """A kernel other than the MoE's GEMMs: its resources, and its SASS length for an issue estimate of
    straight-line code (all of it, and the float64 part, which issues at half rate on an H100's SMs); an
    attention kernel's loop over a key tile too (`loop_instructions`, per BLOCK_N keys)."""
    opcodes = [_opcode(t) for _, t in _sass(compiled.asm["cubin"])]
    described = {"kernel": kernel_fn.__name__, "tokens": num_tokens, **resources(compiled),
                 "num_warps": compiled.metadata.num_warps, "block": kwargs.get("BLOCK"), "instructions": len(opcodes),
                 "fp64_instructions": sum(op in FP64_OPS for op in opcodes)}
    if "SLIDING" in kwargs:  # an attention kernel
        described |= {"block_n": kwargs["BLOCK_N"], "sliding": kwargs["SLIDING"],
                      "loop_instructions": len(inner_loop(compiled.asm["cubin"]))}
    return described


def report(tokens: list[int], block_ms: list[int], tiles: list[str] | None = None) -> dict[str, Any]:
    """In this (child) process: compile the MoE at the 20b shape for each token count and rows per tile (0:
    the engine's choice) and GemmTiles (text; default: the engine's), MXFP4 and bf16 experts (bf16 with the
    engine's tiles only), each token routed to TOP_K experts drawn uniformly (seeded), and describe each kernel."""
    launches = _compile_only_for_sm90()
    import torch
    import triton

    from engine.kernels.moe import DEFAULT_TILES, GemmTiles

    shapes = [GemmTiles.parse(text) for text in tiles or [str(DEFAULT_TILES)]]
    described: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []  # the routing kernel's launches, then the layer's fused kernels
    for num_tokens in tokens:
        ids = torch.stack([torch.randperm(EXPERTS, generator=torch.Generator().manual_seed(t))[:TOP_K]
                           for t in range(num_tokens)])
        counts = torch.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
        for block_m in block_ms:
            for shape in shapes:
                seen = len(launches)
                _compile_moe(ids, block_m, shape, dense=shape == DEFAULT_TILES)
                for kernel_fn, kwargs, compiled in launches[seen:]:
                    if kernel_fn.__name__ in ("moe_gemm_kernel", "moe_gemv_kernel"):
                        described.append(_describe(kernel_fn, kwargs, compiled, num_tokens, block_m, counts,
                                                   str(shape)))
                    else:
                        others.append(_describe_other(kernel_fn, kwargs, compiled, num_tokens))
    seen = len(launches)
    _compile_layer_kernels(tokens[0])
    others += [_describe_other(kernel_fn, kwargs, compiled, tokens[0])
               for kernel_fn, kwargs, compiled in launches[seen:]]
    return {"triton": triton.__version__, "tokens": tokens, "kernels": described, "other_kernels": others}


def _compile_layer_kernels(num_tokens: int) -> None:
    """Drive engine.kernels.fused at the 20b shape in bf16 (the norms, RoPE with the K/V write), the routing
    from the router's logits, the sampler's draw with a top-p row's threshold, and the decode attention."""
    import torch

    from engine.kernels import fused

    bf16 = torch.bfloat16
    x, weight = torch.empty(num_tokens, HIDDEN, dtype=bf16), torch.empty(HIDDEN, dtype=bf16)
    fused.rms_norm(x, weight, 1e-5)
    fused.add_rms_norm(x, x, weight, 1e-5)
    q = torch.empty(num_tokens, HEADS, HEAD_DIM, dtype=bf16)
    k = torch.empty(num_tokens, KV_HEADS, HEAD_DIM, dtype=bf16)
    cos = torch.empty(num_tokens, HEAD_DIM // 2)
    cache = torch.empty(64, 16, KV_HEADS, HEAD_DIM, dtype=bf16)
    fused.rope_write_kv(q, k, k, cos, cos, cache, cache, torch.zeros(num_tokens, dtype=torch.long))
    from engine.kernels import moe, moe_route

    block_m = moe.block_m_for(num_tokens * TOP_K, EXPERTS)
    moe_route.route_logits(torch.empty(num_tokens, EXPERTS, dtype=bf16), TOP_K, block_m,
                           moe.max_tiles(num_tokens * TOP_K, EXPERTS, block_m))  # the router's top-k inside
    from engine.api import SamplingParams
    from engine.device_sampler import sample_tokens

    from engine.kernels.top_p import top_p_thresholds

    # top-p rows' thresholds (engine.kernels.top_p), then the draw over gpt-oss's vocabulary, its noise inside
    top_p_thresholds(torch.zeros(num_tokens, VOCAB), torch.zeros(num_tokens), torch.zeros(num_tokens))
    rows = [SamplingParams(max_tokens=1)] * num_tokens
    sample_tokens(torch.zeros(num_tokens, VOCAB), rows, [0] * num_tokens, [0] * num_tokens, kernels="triton")
    _compile_decode_attention(num_tokens)


def _compile_decode_attention(num_seqs: int) -> None:
    """The decode attention at the 20b shape: `num_seqs` sequences of ATTENTION_CONTEXT tokens, each decoding its
    last, in a full layer (partitions, then the reduce) and a sliding one (one partition, no reduce)."""
    import torch

    import engine.kernels.attention as attention
    from engine.attention import AttentionMetadata

    attention.INTERPRETED = True  # only lets CPU tensors past the wrapper's guard: every launch here compiles
    bf16, block_size = torch.bfloat16, 16
    cache = torch.empty(64, block_size, KV_HEADS, HEAD_DIM, dtype=bf16)  # nothing is read: any blocks will do
    seq_lens = torch.full((num_seqs,), ATTENTION_CONTEXT)
    meta = AttentionMetadata(positions=seq_lens - 1, slot_mapping=torch.zeros(num_seqs, dtype=torch.long),
                             query_start_loc=torch.arange(num_seqs + 1), seq_lens=seq_lens,
                             block_tables=torch.zeros(num_seqs, ATTENTION_CONTEXT // block_size, dtype=torch.long),
                             block_size=block_size, max_query_len=1, max_seq_len=ATTENTION_CONTEXT)
    for window in (None, SLIDING_WINDOW):
        attention.triton_paged_attention(torch.empty(num_seqs, HEADS, HEAD_DIM, dtype=bf16), cache,
                                         torch.empty_like(cache), meta, sinks=torch.empty(HEADS, dtype=bf16),
                                         sliding_window=window, scale=HEAD_DIM ** -0.5)


def _compile_moe(ids: Any, block_m: int, tiles: Any, dense: bool) -> None:
    """Drive engine.kernels.moe.fused_experts at the 20b shape for `ids` [T, TOP_K] with GemmTiles `tiles`: MXFP4
    blocks, the same as words where the tiles' K step allows, then bf16 experts if `dense`."""
    import torch

    from engine import mxfp4_words
    from engine.kernels import moe

    num_tokens, bf16, u8 = ids.shape[0], torch.bfloat16, torch.uint8
    x = torch.empty(num_tokens, HIDDEN, dtype=bf16)
    gate_up_bias = torch.empty(EXPERTS, 2 * INTERMEDIATE, dtype=bf16)
    down_bias = torch.empty(EXPERTS, HIDDEN, dtype=bf16)
    mxfp4 = (moe.ExpertWeight(blocks=torch.empty(EXPERTS, 2 * INTERMEDIATE, HIDDEN // 32, 16, dtype=u8),
                              scales=torch.empty(EXPERTS, 2 * INTERMEDIATE, HIDDEN // 32, dtype=u8)),
             moe.ExpertWeight(blocks=torch.empty(EXPERTS, HIDDEN, INTERMEDIATE // 32, 16, dtype=u8),
                              scales=torch.empty(EXPERTS, HIDDEN, INTERMEDIATE // 32, dtype=u8)))
    # the same experts re-packed as words (engine.mxfp4_words), as the engine holds them on a GPU
    words = tuple(moe.ExpertWeight(blocks=torch.empty(*w.scales.shape[:2], w.shape[1] // 8, dtype=torch.int32),
                                   scales=mxfp4_words.pack_scales(w.scales)) for w in mxfp4 if w.scales is not None)
    bf16_experts = (moe.ExpertWeight(dense=torch.empty(EXPERTS, HIDDEN, 2 * INTERMEDIATE, dtype=bf16)),
             moe.ExpertWeight(dense=torch.empty(EXPERTS, INTERMEDIATE, HIDDEN, dtype=bf16)))
    forms = [mxfp4] + ([words] if mxfp4_words.takes_k_step(tiles.block_k) else [])
    if tiles.gemv:  # the matrix-vector kernel takes words only
        forms, dense = forms[1:], False
    for gate_up, down in forms + ([bf16_experts] if dense else []):
        moe.fused_experts(x, ids, torch.empty(num_tokens, TOP_K, dtype=bf16), gate_up, gate_up_bias, down,
                          down_bias, 1.702, 7.0, block_m, tiles=tiles)


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.kernels.sm90 [--tokens N] [--json]`: the MoE's sm_90 inner loops, compiled here."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--tokens", default=str(DECODE_TOKENS), help="token counts, comma-separated")
    parser.add_argument("--block-m", default="0", help="rows per tile, comma-separated (0: the engine's choice)")
    parser.add_argument("--tiles", default="", help="GemmTiles, comma-separated, e.g. 64x64w4s3,128x64w4s3 "
                        "(default: the engine's)")
    parser.add_argument("--json", action="store_true", help="one JSON line (what moe_inner_loop reads)")
    args = parser.parse_args(argv)
    tokens, block_ms = ([int(v) for v in text.split(",")] for text in (args.tokens, args.block_m))
    tiles = [text for text in args.tiles.split(",") if text]
    if os.environ.get("TRITON_INTERPRET") != "0":
        result = moe_inner_loop(tuple(tokens), tuple(block_ms), tiles=tuple(tiles))  # a child of the right kind
    else:
        result = report(tokens, block_ms, tiles)
    if args.json:
        print(json.dumps(result))
        return
    print(f"triton {result['triton']}, sm_90 (compiled, never run), gpt-oss-20b MoE")
    for k in result["kernels"]:
        print(f"T={k['tokens']:<5} {k['tiles']:>4} tiles {k['projection']:<8} {k['weights']:<6} "
              f"BLOCK {'x'.join(map(str, k['block']))} ({k['gemm_tiles']}): "
              f"{k['per_4096']:.0f} warp-instr / 4096 weights ({k['loop_instructions']} in the loop, "
              f"{k['num_warps']} warps, MMAs {k['mma']}, {k['sync_loads']} synchronous global loads), "
              f"{k['registers']} registers, {k['spills']} spills, "
              f"{k['shared_bytes']} B shared")


if __name__ == "__main__":
    main()
