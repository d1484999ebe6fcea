"""MXFP4 expert weights re-packed for the Triton MoE's own decode: int32 words whose bits are bf16 already.

The checkpoint layout (engine.mxfp4) leaves a GPU kernel two costs a weight: the nibbles a thread needs for its
MMA fragment are scattered over bytes (read one byte at a time), and each e2m1 code goes through a lookup. Here
each output row's codes are re-ordered, per 64 inputs (a chunk), into 8 words of 8 codes:

- word (c, h) of a chunk (c = 0..3, h = 0..1; stored at c * 2 + h) holds inputs 32h + 16b + 8s + 2c + t for
  b, s, t in {0, 1}: the inputs an MMA's A fragment gives one thread (pairs 2c, 2c + 1 and 8 further, in each
  16-input step), all of one 32-input scale group (h);
- its codes are placed so that four shift-and-mask steps (`DECODE_SHIFTS`) give four registers o0..o3, each two
  bf16 (low half t = 0, high half t = 1) of the codes of b, s with o = 2b + s: sign at bit 15, the code's
  exponent and mantissa at bits 8..6. Read as bf16 that is the e2m1 value times 2^-126 (a zero exponent is
  bf16's subnormal, as it is e2m1's), so one bf16x2 multiply by 2^(scale - 1) per register gives the weight
  exactly (engine.kernels.moe_gemm). 2^(scale - 1) is a bf16 only up to scale 128 (a group's scale 2^1):
  `fits` says whether a projection's scales allow it; trained weights' do by far.

Words are int32 [E, out, in / 8]; `pack` and `unpack` are exact inverses; the words hold the same bytes as the
blocks, so re-packing in place costs no memory. The scales keep their bytes and order but are read as int32
scale words too ([E, out, ceil(in / 128)], byte j of word w the scale of group 4w + j, rows padded with zeros
to whole words: `pack_scales`): a K step's scales are then one 4-byte load a row, which a GPU copies
asynchronously with the weights, where a byte a row was a synchronous load in every step of the kernel's loop.
"""

from __future__ import annotations

import torch

from engine.mxfp4 import MXFP4_BLOCK, check_packed

CHUNK = 64  # inputs per re-ordered chunk (one 64-wide K step of the kernel: 8 words a row)
MAX_SCALE = 128  # the largest e8m0 scale byte whose 2^(scale - 1) is a finite bf16
SCALES_PER_WORD = 4  # a scale word's bytes: the scales of 4 groups, 128 inputs
MAX_K_STEP = 2 * SCALES_PER_WORD * MXFP4_BLOCK  # the kernel takes a K step's scales from one or two scale words
# Per register o: (shift of the exponent and mantissa bits, shift of the sign bit) that bring them to bf16's
# bits 8..6 and 15 in each half (a negative shift is to the right). Found by search: no four single shifts tile
# the word's 32 bits, and these need 11 operations for the four registers (the kernel's inline assembly).
DECODE_SHIFTS = ((0, 0), (3, 3), (-3, 1), (6, 2))
SIGN_BIT, CODE_LOW_BIT = 15, 6  # where a half's sign and its code's mantissa bit land in bf16


def source_bit(register: int, half: int, code_bit: int) -> int:
    """The word's bit holding `code_bit` (0: mantissa, 1-2: exponent, 3: sign) of register o`register`'s half."""
    eem_shift, sign_shift = DECODE_SHIFTS[register]
    if code_bit == 3:
        return SIGN_BIT + 16 * half - sign_shift
    return CODE_LOW_BIT + code_bit + 16 * half - eem_shift


def _sources() -> torch.Tensor:
    """[4 (b), 2 (s), 2 (t), 4 (code bit)] int64: each code bit's position in its word."""
    bits = [[source_bit(register, half, bit) for bit in range(4)] for register in range(4) for half in range(2)]
    return torch.tensor(bits, dtype=torch.int64).reshape(2, 2, 2, 4)


def fits(blocks: torch.Tensor, scales: torch.Tensor) -> bool:
    """Whether (blocks, scales) can take this layout: inputs a multiple of CHUNK and every scale <= MAX_SCALE."""
    check_packed(blocks, scales)
    return whole_chunks(blocks.shape[2]) and int(scales.max()) <= MAX_SCALE


def whole_chunks(groups: int) -> bool:
    """Whether a row of `groups` scale groups (32 inputs each) is whole chunks, as the layout needs."""
    return groups * MXFP4_BLOCK % CHUNK == 0


def pack(blocks: torch.Tensor) -> torch.Tensor:
    """Checkpoint blocks [E, out, in / 32, 16] uint8 -> words [E, out, in / 8] int32 (see the module's doc)."""
    num_experts, num_out, groups, _ = blocks.shape
    if not whole_chunks(groups):
        raise ValueError(f"MXFP4 blocks of {groups * MXFP4_BLOCK} inputs: the word layout needs a multiple of {CHUNK}")
    sources = _sources().to(blocks.device)
    words = torch.empty(num_experts, num_out, groups * MXFP4_BLOCK // 8, dtype=torch.int32, device=blocks.device)
    for e in range(num_experts):  # one expert's transients at a time
        codes = torch.stack((blocks[e] & 15, blocks[e] >> 4), dim=-1).reshape(num_out, -1, 2, 2, 2, 4, 2)
        codes = codes.permute(0, 1, 5, 2, 3, 4, 6).long()  # (out, chunk, c, h | b, s, t) from (chunk, h, b, s, c, t)
        bits = (codes[..., None] >> torch.arange(4, device=blocks.device)) & 1  # [..., b, s, t, code bit]
        word = (bits << sources).sum(dim=(-4, -3, -2, -1))  # disjoint bits: the sum is their or
        words[e] = (word - (word >= 2**31).long() * 2**32).reshape(num_out, -1).int()
    return words


def pack_in_place(blocks: torch.Tensor) -> torch.Tensor:
    """`pack`, the words written over the blocks' own bytes where the blocks are one contiguous tensor (expert e's
    words take exactly its bytes: one expert's transients at a time, no second copy of the weights); a new tensor
    otherwise (blocks viewed across experts, say with stride 0, would overwrite each other)."""
    if not blocks.is_contiguous():
        return pack(blocks)
    words = blocks.view(torch.int32).view(blocks.shape[0], blocks.shape[1], -1)
    for expert in range(blocks.shape[0]):
        words[expert] = pack(blocks[expert][None].clone())[0]
    return words


def scale_words(groups: int) -> int:
    """Scale words a row of `groups` scale groups takes (the last padded with zero bytes)."""
    return -(-groups // SCALES_PER_WORD)


def pack_scales(scales: torch.Tensor) -> torch.Tensor:
    """Scales [E, out, in / 32] uint8 -> scale words [E, out, ceil(in / 128)] int32, byte j of word w the scale of
    group 4w + j (little-endian, as torch and CUDA lay out an int32), each row padded with zero bytes."""
    num_experts, num_out, groups = scales.shape
    padded = torch.zeros(num_experts, num_out, scale_words(groups) * SCALES_PER_WORD, dtype=torch.uint8,
                         device=scales.device)
    padded[..., :groups] = scales
    return padded.view(torch.int32)


def held_scale_bytes(shape: torch.Size) -> int:
    """Bytes a GPU that decodes words holds for checkpoint scales of `shape` [E, out, in / 32]: scale words, each
    row padded to whole words, where the inputs fit the layout (`fits`; gpt-oss's scales do), else the bytes."""
    num_experts, num_out, groups = shape
    if not whole_chunks(groups):
        return num_experts * num_out * groups
    return num_experts * num_out * scale_words(groups) * SCALES_PER_WORD


def unpack_scales(scale_words: torch.Tensor, groups: int) -> torch.Tensor:
    """The inverse of `pack_scales`: scale words [E, out, ceil(groups / 4)] int32 -> scales [E, out, groups] uint8."""
    return scale_words.contiguous().view(torch.uint8)[..., :groups]


def takes_k_step(block_k: int) -> bool:
    """Whether the kernel's K step of `block_k` inputs (a power of two, as any Triton tile's) reads whole chunks of
    words (a K it does not divide ends in single chunks, engine.kernels.moe_gemm) and at most two scale words a row
    (MAX_K_STEP)."""
    return block_k % CHUNK == 0 and block_k <= MAX_K_STEP and block_k & (block_k - 1) == 0


def unpack(words: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack`: words [E, out, in / 8] int32 -> blocks [E, out, in / 32, 16] uint8."""
    num_experts, num_out, num_words = words.shape
    sources = _sources().to(words.device)
    blocks = torch.empty(num_experts, num_out, num_words * 8 // MXFP4_BLOCK, MXFP4_BLOCK // 2, dtype=torch.uint8,
                         device=words.device)
    for e in range(num_experts):
        word = (words[e].long() & 0xFFFFFFFF).reshape(num_out, -1, 4, 2)[..., None, None, None, None]
        codes = ((word >> sources) & 1) << torch.arange(4, device=words.device)
        codes = codes.sum(-1)  # (out, chunk, c, h, b, s, t)
        codes = codes.permute(0, 1, 3, 4, 5, 2, 6).reshape(num_out, -1, MXFP4_BLOCK // 2, 2)
        blocks[e] = (codes[..., 0] | (codes[..., 1] << 4)).reshape(num_out, -1, MXFP4_BLOCK // 2).to(torch.uint8)
    return blocks


def decodable_on(device: torch.device) -> bool:
    """Whether the Triton MoE can decode words on `device`: its PTX multiplies bf16x2 (sm_90 and newer); without
    CUDA the interpreter decodes them in Triton's own operations."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)


def is_words(blocks: torch.Tensor) -> bool:
    """Whether an expert weight's packed tensor is in this layout (int32 words), not the checkpoint's (uint8)."""
    return blocks.dtype == torch.int32
