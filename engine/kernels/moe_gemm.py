# mypy: allow-untyped-defs
# (@triton.jit kernels take untyped arguments: Triton reads annotations as constexpr markers.)
"""The MoE's grouped GEMM kernel: one program per (tile of sorted rows, column block), one expert per tile.

`moe_gemm_kernel` serves both projections (engine.kernels.moe launches it):
- SWIGLU: x rows gathered by token, times the expert's gate_up weight, plus bias, then the clamped SwiGLU
  of the interleaved gate/up columns, stored per sorted row;
- otherwise (down): sorted rows times the expert's down weight, plus bias, times the router weight,
  stored per (token, expert) pair in fp32.
SPLIT_K > 1 splits K between that many programs a tile and column block (program_id 2): each stores its fp32
partial sum (the bias in the first's; down's times the router weight) in its own [rows or pairs, N] slice of
out; `swiglu_reduce_kernel` sums gate_up's and applies the SwiGLU, the experts' sum (engine.kernels.fused) adds
down's. At a small step a launch has a few programs an SM, each walking K's 45 steps one after another.

The weight comes in one of three forms (WEIGHTS):
- "dense": [E, in, out] floats, a plain tl.dot;
- "mxfp4": packed e2m1 blocks with e8m0 scales (engine.mxfp4) times 16-bit activations, through
  tl.dot_scaled: the codes are upcast to the activations' type with the scale applied once per 32-weight
  group, on the tensor cores (on sm_90 Triton swaps the operands so the weights fill wgmma's 64 rows);
- "mxfp4_upcast": the same blocks times fp32 activations (dot_scaled takes 16-bit floats at most):
  each code and scale are decoded per element in fp32, exactly. CPU models and tests use it;
- "mxfp4_words": the codes re-packed as engine.mxfp4_words lays them out, times bf16 activations: the kernel
  decodes them itself, four shift-and-masks and four bf16x2 multiplies a word of 8 (inline assembly on a GPU,
  the same bits in Triton's operations in the interpreter), each thread's words holding exactly its MMA
  fragment. The weights fill the MMA's rows (the accumulator is [BLOCK_N, BLOCK_M]), as dot_scaled's do. Their
  scales come as scale words (int32, 4 groups each), so that every load of the loop is an asynchronous copy.
  sm_90's inner loop: 214 warp-instructions per 4,096 weights against dot_scaled's 270 (engine.kernels.sm90),
  and no load the loop waits for against dot_scaled's one a step.
"""

from __future__ import annotations

import torch

from engine import mxfp4_words
from engine.kernels import require_triton
from engine.mxfp4 import MXFP4_BLOCK

require_triton("cuda" if torch.cuda.is_available() else "cpu")  # see engine.kernels.moe: before triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

MXFP4_GROUP: tl.constexpr = tl.constexpr(MXFP4_BLOCK)  # weights sharing one scale
MXFP4_GROUP_BYTES: tl.constexpr = tl.constexpr(MXFP4_BLOCK // 2)


@triton.jit
def moe_gemm_kernel(
    a_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, pair_weights_ptr,
    sorted_pairs_ptr, tile_expert_ptr, tile_row_start_ptr, expert_offsets_ptr,
    K, N, num_experts, top_k, alpha, limit,
    stride_am, stride_ak, stride_we, stride_wk, stride_wn, stride_se, stride_sg, stride_sn,
    stride_be, stride_bn, stride_om, stride_os,
    SWIGLU: tl.constexpr, WEIGHTS: tl.constexpr, A_FORMAT: tl.constexpr, EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr, ASM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr = 1,
):
    """One [BLOCK_M, BLOCK_N] output tile of one expert's rows (see the module docstring)."""
    tile = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + tile)
    if expert >= num_experts:  # a tile past the real ones (the schedule's static bound)
        return
    rows = tl.load(tile_row_start_ptr + tile) + tl.arange(0, BLOCK_M)
    row_mask = rows < tl.load(expert_offsets_ptr + expert + 1)
    pairs = tl.load(sorted_pairs_ptr + rows, mask=row_mask, other=0)
    if SWIGLU:
        a_rows = pairs // top_k  # gate_up reads x by token
    else:
        a_rows = rows  # down reads the activated rows in sorted order
    a_rows_ptr = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_ptr += expert.to(tl.int64) * stride_we
    s_ptr += expert.to(tl.int64) * stride_se
    if WEIGHTS == "mxfp4_words":  # out^T = W^T a^T: the weights fill the MMA's 64 rows
        acc = tl.full((BLOCK_N, BLOCK_M), 0.0, tl.float32)
    else:
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    k_begin, k_end = 0, K
    if SPLIT_K > 1:  # whole K steps a split, so EVEN_K still holds in each
        k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_begin = tl.program_id(2) * k_per_split
        k_end = tl.minimum(K, k_begin + k_per_split)
        if WEIGHTS == "mxfp4_words" and BLOCK_K > WORDS_CHUNK:
            k_end = tl.maximum(k_end, k_begin)  # a split past K has no step, nor chunk left over (below)
    k_steps_end = k_end
    if WEIGHTS == "mxfp4_words" and BLOCK_K > WORDS_CHUNK:  # whole K steps, then the chunks of 64 left over
        k_steps_end = k_begin + (k_end - k_begin) // BLOCK_K * BLOCK_K
    for k0 in range(k_begin, k_steps_end, BLOCK_K):
        if WEIGHTS == "mxfp4_words":
            acc = _mxfp4_words_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, s_ptr, offs_n, mask_n, k0,
                                    stride_wn, stride_sg, stride_sn, PRECISION, DOT_DTYPE, BLOCK_K, ASM)
        elif WEIGHTS == "mxfp4":
            acc = _mxfp4_scaled_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, s_ptr, offs_n, mask_n, k0, K,
                                     stride_wk, stride_wn, stride_sg, stride_sn, A_FORMAT, EVEN_K, BLOCK_K)
        elif WEIGHTS == "mxfp4_upcast":
            acc = _mxfp4_upcast_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, s_ptr, offs_n, mask_n, k0, K,
                                     stride_wk, stride_wn, stride_sg, stride_sn, PRECISION, DOT_DTYPE, BLOCK_K)
        else:
            acc = _dense_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, offs_n, mask_n, k0, K,
                              stride_wk, stride_wn, PRECISION, DOT_DTYPE, BLOCK_K)
    if WEIGHTS == "mxfp4_words":
        if BLOCK_K > WORDS_CHUNK:  # peeled, so the loop above needs no masks
            for k0 in range(k_steps_end, k_end, WORDS_CHUNK):
                acc = _mxfp4_words_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, s_ptr, offs_n, mask_n, k0,
                                        stride_wn, stride_sg, stride_sn, PRECISION, DOT_DTYPE, WORDS_CHUNK, ASM)
        acc = tl.trans(acc)
    bias = tl.load(bias_ptr + expert * stride_be + offs_n * stride_bn, mask=mask_n, other=0.0)
    if SPLIT_K > 1:  # the bias once: in the first split's partial sum
        bias = tl.where(tl.program_id(2) == 0, bias, 0.0)
        out_ptr += tl.program_id(2).to(tl.int64) * stride_os
    y = acc + bias.to(tl.float32)[None, :]
    if SWIGLU and SPLIT_K > 1:
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out, y, mask=row_mask[:, None] & mask_n[None, :])
    elif SWIGLU:
        _store_swiglu(y, out_ptr, rows, row_mask, N, stride_om, alpha, limit, BLOCK_M, BLOCK_N)
    else:
        router_weight = tl.load(pair_weights_ptr + pairs, mask=row_mask, other=0.0).to(tl.float32)
        out = out_ptr + pairs.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(out, y * router_weight[:, None], mask=row_mask[:, None] & mask_n[None, :])


@triton.jit
def _mxfp4_scaled_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, s_ptr, offs_n, mask_n, k0, K,
                       stride_wk, stride_wn, stride_sg, stride_sn,
                       A_FORMAT: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + a[:, k0:k0+BLOCK_K] @ W[k0:k0+BLOCK_K, offs_n]: e2m1 bytes [BLOCK_K/2, BLOCK_N] (byte j holds
    inputs 2j, 2j + 1, low nibble first, as dot_scaled reads them) and scales [BLOCK_N, BLOCK_K/32]."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    g = k0 // MXFP4_GROUP + tl.arange(0, BLOCK_K // MXFP4_GROUP)
    a_ptrs = a_rows_ptr + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + j[:, None] * stride_wk + offs_n[None, :] * stride_wn
    s_ptrs = s_ptr + offs_n[:, None] * stride_sn + g[None, :] * stride_sg
    if EVEN_K:  # no K masks: fewer instructions in the loop
        a = tl.load(a_ptrs, mask=row_mask[:, None], other=0.0)
        packed = tl.load(w_ptrs, mask=mask_n[None, :], other=0)
        scale = tl.load(s_ptrs, mask=mask_n[:, None], other=0)
    else:
        a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k < K)[None, :], other=0.0)
        packed = tl.load(w_ptrs, mask=(j < K // 2)[:, None] & mask_n[None, :], other=0)
        scale = tl.load(s_ptrs, mask=mask_n[:, None] & (g < K // MXFP4_GROUP)[None, :], other=0)
    # fast_math: no NaN for scale byte 255, which MXFP4 reserves and the checkpoints never hold
    return tl.dot_scaled(a, None, A_FORMAT, packed, scale, "e2m1", acc, fast_math=True)


# engine.mxfp4_words' DECODE_SHIFTS as PTX: $4 a word, $5 its group's 2^(scale - 1) in both bf16 halves; $0..$3
# the registers o0..o3, two bf16 weights each. ptxas makes each shift-and-mask pair one SHF and one LOP3.
WORDS_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 e, s;
and.b32 $0, $4, 0x81C081C0;
shl.b32 e, $4, 3; and.b32 $1, e, 0x81C081C0;
shr.b32 e, $4, 3; and.b32 e, e, 0x01C001C0; shl.b32 s, $4, 1; and.b32 s, s, 0x80008000; or.b32 $2, e, s;
shl.b32 e, $4, 6; and.b32 e, e, 0x01C001C0; shl.b32 s, $4, 2; and.b32 s, s, 0x80008000; or.b32 $3, e, s;
mul.rn.bf16x2 $0, $0, $5;
mul.rn.bf16x2 $1, $1, $5;
mul.rn.bf16x2 $2, $2, $5;
mul.rn.bf16x2 $3, $3, $5;
}
""")
WORDS_CHUNK: tl.constexpr = tl.constexpr(mxfp4_words.CHUNK)  # inputs a chunk of words
SCALES_PER_WORD: tl.constexpr = tl.constexpr(mxfp4_words.SCALES_PER_WORD)


@triton.jit
def _mxfp4_words_step(acc_t, a_rows_ptr, row_mask, stride_ak, w_ptr, s_ptr, offs_n, mask_n, k0,
                      stride_wn, stride_sg, stride_sn, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
                      BLOCK_K: tl.constexpr, ASM: tl.constexpr):
    """acc_t [BLOCK_N, BLOCK_M] + (a[:, k0:k0+BLOCK_K] @ W[k0:k0+BLOCK_K, offs_n])^T: W^T's tile decoded from its
    words [BLOCK_N, BLOCK_K/8] (engine.mxfp4_words) and their scales (`_step_scales`); the step inside K."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    a = tl.load(a_rows_ptr + offs_k[None, :] * stride_ak, mask=row_mask[:, None], other=0.0)
    # (told that a row's words are 16-byte aligned, Triton copies them as vectors, but then decodes in a layout the
    # MMA does not take and shuffles the weights between threads: 280 warp-instructions a 4,096 against 214)
    m = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    words = tl.load(w_ptr + offs_n[:, None] * stride_wn + m[None, :], mask=mask_n[:, None], other=0)
    w_t = _words_bf16(words, _step_scales(s_ptr, offs_n, mask_n, k0, stride_sg, stride_sn, BLOCK_K), BLOCK_K, ASM)
    return tl.dot(w_t.to(DOT_DTYPE), tl.trans(a).to(DOT_DTYPE), acc_t, input_precision=PRECISION)


@triton.jit
def _step_scales(s_ptr, offs_n, mask_n, k0, stride_sg, stride_sn, BLOCK_K: tl.constexpr):
    """The scales of K step k0 .. k0 + BLOCK_K - 1, [BLOCK_N, BLOCK_K/32] int32.

    From scale words (engine.mxfp4_words.pack_scales: int32, 4 groups each) a step reads one word a row per 128
    inputs (a step of 64 half of one), which a GPU copies asynchronously with the weights. From the checkpoint's
    scale bytes (uint8) it reads a byte a row a group: Triton loads those synchronously, a memory round trip in
    every step of the loop (the layout before the scale words, kept so a GPU can time the two)."""
    first, second = _load_step_scales(s_ptr, offs_n, mask_n, k0, stride_sg, stride_sn, BLOCK_K)
    return _unpack_step_scales(first, second, k0, BLOCK_K)


@triton.jit
def _load_step_scales(s_ptr, offs_n, mask_n, k0, stride_sg, stride_sn, BLOCK_K: tl.constexpr):
    """`_step_scales`' loads, two of a kind (what a step does not need is the first again): the step's scale bytes
    [BLOCK_N, BLOCK_K/32], or its scale word [BLOCK_N] and the next (read at steps of 256 inputs only)."""
    groups: tl.constexpr = BLOCK_K // MXFP4_GROUP
    if s_ptr.dtype.element_ty == tl.uint8:
        g = k0 // MXFP4_GROUP + tl.arange(0, groups)
        scale_bytes = tl.load(s_ptr + offs_n[:, None] * stride_sn + g[None, :] * stride_sg, mask=mask_n[:, None],
                              other=0)
        return scale_bytes, scale_bytes
    tl.static_assert(groups <= 2 * SCALES_PER_WORD, "scale words: K steps of 64, 128 or 256 inputs")
    at = s_ptr + offs_n * stride_sn + k0 // (MXFP4_GROUP * SCALES_PER_WORD) * stride_sg
    word = tl.load(at, mask=mask_n, other=0)
    if groups == 2 * SCALES_PER_WORD:
        return word, tl.load(at + stride_sg, mask=mask_n, other=0)
    return word, word


@triton.jit
def _unpack_step_scales(first, second, k0, BLOCK_K: tl.constexpr):
    """`_load_step_scales`' loads -> the step's scales, [BLOCK_N, BLOCK_K/32] int32."""
    groups: tl.constexpr = BLOCK_K // MXFP4_GROUP
    if first.dtype == tl.uint8:
        return first.to(tl.int32)
    if groups == 2:  # half a word: k0 // 32 % 4 is 0 or 2
        word = first >> (k0 // MXFP4_GROUP % SCALES_PER_WORD * 8)
        return tl.join(word & 0xFF, (word >> 8) & 0xFF)
    elif groups == 4:  # k0 a multiple of 128: the step's word
        return _word_scales(first)
    else:  # two words; [n, word, byte] in group order
        return tl.reshape(tl.permute(tl.join(_word_scales(first), _word_scales(second)), (0, 2, 1)),
                          (first.shape[0], 8))


@triton.jit
def _word_scales(word):
    """A scale word's 4 scales, [N, 4] int32 in group order (byte j is group j)."""
    even = tl.join(word & 0xFF, (word >> 16) & 0xFF)  # groups 0 and 2
    odd = tl.join((word >> 8) & 0xFF, (word >> 24) & 0xFF)  # 1 and 3
    return tl.reshape(tl.join(even, odd), (word.shape[0], 4))  # [n, i, j] is group 2i + j


@triton.jit
def _words_bf16(words, scale, BLOCK_K: tl.constexpr, ASM: tl.constexpr):
    """Words [N, BLOCK_K/8] int32 and their scales [N, BLOCK_K/32] int32 -> the weights [N, BLOCK_K] (bf16 with
    ASM; their fp32 values in the interpreter)."""
    n: tl.constexpr = words.shape[0]
    chunks: tl.constexpr = BLOCK_K // WORDS_CHUNK
    q = _words_decoded(words, scale, BLOCK_K, ASM)
    # q: (n, word, t, s, b); a word is (chunk, c, h), and its weight (b, s, t) is input 32h + 16b + 8s + 2c + t
    q = tl.permute(tl.reshape(q, (n, chunks, 4, 2, 2, 2, 2)), (0, 1, 3, 6, 5, 2, 4))
    return tl.reshape(q, (n, BLOCK_K))


@triton.jit
def _words_decoded(words, scale, BLOCK_K: tl.constexpr, ASM: tl.constexpr):
    """Words [N, BLOCK_K/8] int32 and their scales [N, BLOCK_K/32] int32 -> the weights in word order,
    [N, BLOCK_K/8, 2 (t), 2 (s), 2 (b)]: weight (t, s, b) of word (chunk, c, h) is input 32h + 16b + 8s + 2c + t
    of its chunk (bf16 with ASM; their fp32 values in the interpreter)."""
    n: tl.constexpr = words.shape[0]
    chunks: tl.constexpr = BLOCK_K // WORDS_CHUNK
    # a word's group is its h (the words of a chunk are (c, h) in c-major order): the scale of (chunk, h) to each
    factor = (scale + 126) << 7  # 2^(scale - 1) as bf16 bits
    factor = tl.reshape(tl.broadcast_to(tl.reshape(factor, (n, chunks, 1, 2)), (n, chunks, 4, 2)), (n, BLOCK_K // 8))
    if ASM:
        o0, o1, o2, o3 = tl.inline_asm_elementwise(
            asm=WORDS_PTX, constraints="=r,=r,=r,=r,r,r", args=[words, factor | (factor << 16)],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
        q = tl.join(tl.join(_bf16_pair(o0), _bf16_pair(o1)), tl.join(_bf16_pair(o2), _bf16_pair(o3)))
    else:  # the same bits in Triton's operations, the multiply in fp32 (exact either way); the weights stay fp32,
        # since the interpreter's cast to bf16 flushes subnormals (scales 2^-127 and 2^-126) to zero
        scaled = (factor << 16).to(tl.float32, bitcast=True)
        q = tl.join(tl.join(_scaled_pair(words & -2118090304, scaled),  # 0x81C081C0
                            _scaled_pair((words << 3) & -2118090304, scaled)),
                    tl.join(_scaled_pair(((words >> 3) & 0x01C001C0) | ((words << 1) & -2147450880), scaled),
                            _scaled_pair(((words << 6) & 0x01C001C0) | ((words << 2) & -2147450880), scaled)))
    return q


@triton.jit
def _bf16_pair(register):
    """An int32 holding two bf16 -> [..., 2] bf16 (low half first)."""
    low = register.to(tl.int16).to(tl.bfloat16, bitcast=True)
    high = (register >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.join(low, high)


@triton.jit
def _scaled_pair(register, factor):
    """`_bf16_pair` of a register of 2^-126-scaled codes, times `factor` (fp32) -> [..., 2] fp32 (bf16 values)."""
    low = ((register & 0xFFFF) << 16).to(tl.float32, bitcast=True) * factor
    high = (register & -65536).to(tl.float32, bitcast=True) * factor  # 0xFFFF0000
    return tl.join(low, high)


@triton.jit
def _mxfp4_upcast_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, s_ptr, offs_n, mask_n, k0, K,
                       stride_wk, stride_wn, stride_sg, stride_sn,
                       PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_K: tl.constexpr):
    """As _mxfp4_scaled_step, each weight decoded in fp32: the activation tile is read as its even and odd
    columns, and each meets one nibble's weights."""
    j = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    mask_j = j < K // 2
    a_mask = row_mask[:, None] & mask_j[None, :]
    a_even = tl.load(a_rows_ptr + (2 * j)[None, :] * stride_ak, mask=a_mask, other=0.0)
    a_odd = tl.load(a_rows_ptr + (2 * j + 1)[None, :] * stride_ak, mask=a_mask, other=0.0)
    w_mask = mask_j[:, None] & mask_n[None, :]
    packed = tl.load(w_ptr + j[:, None] * stride_wk + offs_n[None, :] * stride_wn, mask=w_mask, other=0)
    scale = tl.load(s_ptr + (j // MXFP4_GROUP_BYTES)[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                    mask=w_mask, other=127).to(tl.int32)
    packed = packed.to(tl.int32)
    w_even = _e2m1_times_scale(packed & 15, scale).to(DOT_DTYPE)
    w_odd = _e2m1_times_scale(packed >> 4, scale).to(DOT_DTYPE)
    acc = tl.dot(a_even.to(DOT_DTYPE), w_even, acc, input_precision=PRECISION)
    return tl.dot(a_odd.to(DOT_DTYPE), w_odd, acc, input_precision=PRECISION)


@triton.jit
def _dense_step(acc, a_rows_ptr, row_mask, stride_ak, w_ptr, offs_n, mask_n, k0, K, stride_wk, stride_wn,
                PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + a[:, k0:k0+BLOCK_K] @ W[k0:k0+BLOCK_K, offs_n], W dense [in, out] (cast to a's dtype)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask_k = offs_k < K
    a = tl.load(a_rows_ptr + offs_k[None, :] * stride_ak, mask=row_mask[:, None] & mask_k[None, :], other=0.0)
    w = tl.load(w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                mask=mask_k[:, None] & mask_n[None, :], other=0.0)
    return tl.dot(a.to(DOT_DTYPE), w.to(a.dtype).to(DOT_DTYPE), acc, input_precision=PRECISION)


@triton.jit
def _e2m1_times_scale(code, scale):
    """FP4 codes (int32 0..15) times e8m0 scales (int32 0..255) -> fp32, built from their bits (exact)."""
    exponent = (code >> 1) & 3
    mantissa = code & 1
    # exponent 0 is subnormal: 0 or 0.5; otherwise 2^(exponent - 1) * (1 + mantissa / 2).
    bits = tl.where(exponent == 0, mantissa * (126 << 23), ((exponent + 126) << 23) | (mantissa << 22))
    magnitude = bits.to(tl.float32, bitcast=True)
    value = tl.where(code >= 8, -magnitude, magnitude)
    # 2^(scale - 127) as fp32 bits; scale 0 (2^-127) is subnormal, so take 2^-126 and halve.
    factor = (tl.maximum(scale, 1) << 23).to(tl.float32, bitcast=True)
    value = value * factor
    return tl.where(scale == 0, value * 0.5, value)


@triton.jit
def swiglu_reduce_kernel(partial_ptr, out_ptr, num_rows, N, stride_ps, stride_pm, stride_om, alpha, limit,
                         SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """gate_up split over K: rows of the fp32 partial sums [SPLIT_K, rows, N] added in split order, then the
    SwiGLU into out [rows, N / 2]."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < num_rows
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = row_mask[:, None] & (offs_n < N)[None, :]
    offsets = rows.to(tl.int64)[:, None] * stride_pm + offs_n[None, :]
    y = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for split in tl.static_range(SPLIT_K):
        y += tl.load(partial_ptr + split * stride_ps + offsets, mask=mask, other=0.0)
    _store_swiglu(y, out_ptr, rows, row_mask, N, stride_om, alpha, limit, BLOCK_M, BLOCK_N)


@triton.jit
def _store_swiglu(y, out_ptr, rows, row_mask, N, stride_om, alpha, limit,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[row, j] = clamped swiglu of y's columns 2j (gate) and 2j + 1 (up), in out's dtype."""
    gate, up = tl.split(tl.reshape(y, (BLOCK_M, BLOCK_N // 2, 2)))
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    activated = (up + 1.0) * gate / (1.0 + tl.exp(-gate * alpha))  # (up + 1) * gate * sigmoid(alpha * gate)
    offs_j = tl.program_id(1) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + offs_j[None, :]
    tl.store(out, activated.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & (offs_j < N // 2)[None, :])
