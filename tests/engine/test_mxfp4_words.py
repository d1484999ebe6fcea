"""MXFP4 re-packed as words (engine.mxfp4_words): the layout, and the kernel's PTX decode of it, emulated here."""

import itertools
import re

import numpy as np
import pytest
import torch

from engine import mxfp4_words
from engine.mxfp4 import FP4_VALUES, dequantize, quantize


def test_the_decode_shifts_place_every_bit_of_a_word_once():
    sources = [mxfp4_words.source_bit(r, t, b) for r in range(4) for t in range(2) for b in range(4)]
    assert sorted(sources) == list(range(32))


@pytest.mark.parametrize("shape", [(2, 8, 4, 16), (1, 3, 2, 16)])
def test_pack_and_unpack_are_inverses_on_any_bytes(shape):
    blocks = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    words = mxfp4_words.pack(blocks)
    assert words.dtype == torch.int32 and words.shape == (shape[0], shape[1], shape[2] * 4)
    assert mxfp4_words.is_words(words) and not mxfp4_words.is_words(blocks)
    assert torch.equal(mxfp4_words.unpack(words), blocks)


def test_a_word_holds_one_threads_inputs_of_one_scale_group():
    # random codes, two chunks of a row: word (c, h) of chunk ch (stored at 8ch + 2c + h) must hold input
    # 64ch + 32h + 16b + 8s + 2c + t in register o = 2b + s, half t, read back through source_bit
    codes = torch.randint(0, 16, (128,), generator=torch.Generator().manual_seed(1))
    blocks = (codes[0::2] | codes[1::2] << 4).to(torch.uint8).reshape(1, 1, 4, 16)
    words = mxfp4_words.pack(blocks)[0, 0].long() & 0xFFFFFFFF
    for ch, c, h, b, s, t in itertools.product(range(2), range(4), range(2), range(2), range(2), range(2)):
        word = int(words[8 * ch + 2 * c + h])
        code = sum(((word >> mxfp4_words.source_bit(2 * b + s, t, bit)) & 1) << bit for bit in range(4))
        assert code == codes[64 * ch + 32 * h + 16 * b + 8 * s + 2 * c + t], (ch, c, h, b, s, t)


@pytest.mark.parametrize("groups", [90, 4, 2, 9])  # 20b's 2,880 inputs: 22 words and a half; one; half of one
def test_scale_words_hold_four_groups_each_low_byte_first(groups):
    scales = torch.randint(0, 256, (2, 3, groups), dtype=torch.uint8, generator=torch.Generator().manual_seed(groups))
    scale_words = mxfp4_words.pack_scales(scales)
    assert scale_words.dtype == torch.int32 and scale_words.shape == (2, 3, -(-groups // 4))
    as_unsigned = scale_words.long() & 0xFFFFFFFF
    for e, n, g in itertools.product(range(2), range(3), range(-(-groups // 4) * 4)):
        byte = int(as_unsigned[e, n, g // 4]) >> (8 * (g % 4)) & 0xFF
        assert byte == (int(scales[e, n, g]) if g < groups else 0), (e, n, g)  # the row padded with zeros
    assert torch.equal(mxfp4_words.unpack_scales(scale_words, groups), scales)
    # what the memory plan counts for them: the packed words, where whole chunks let the experts take words
    held = scale_words.numel() * 4 if groups % 2 == 0 else scales.numel()
    assert mxfp4_words.held_scale_bytes(scales.shape) == held


def test_the_kernel_takes_k_steps_of_whole_chunks_up_to_two_scale_words():
    assert [step for step in range(32, 1025, 32) if mxfp4_words.takes_k_step(step)] == [64, 128, 256]


def test_fits_needs_whole_chunks_and_scales_a_bf16_factor_can_hold():
    blocks, scales = quantize(torch.randn(2, 128, 8))
    assert mxfp4_words.fits(blocks, scales)
    assert not mxfp4_words.fits(blocks, torch.full_like(scales, mxfp4_words.MAX_SCALE + 1))
    assert mxfp4_words.fits(blocks, torch.full_like(scales, mxfp4_words.MAX_SCALE))
    odd_blocks, odd_scales = quantize(torch.randn(1, 96, 4))  # 96 inputs: one and a half chunks
    assert not mxfp4_words.fits(odd_blocks, odd_scales)
    with pytest.raises(ValueError, match="multiple of 64"):
        mxfp4_words.pack(odd_blocks)


# -- the kernel's PTX, run by a small emulator of the instructions it uses ---------------------------------------
def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) & 0xFFFF  # round to nearest even


def _run_ptx(ptx: str, registers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run straight-line PTX of and/or/shl/shr.b32 and mul.rn.bf16x2 over numpy uint32 registers."""
    body = re.sub(r"\.reg[^;]*;", "", ptx).replace("{", "").replace("}", "")
    for statement in filter(None, (s.strip() for s in body.split(";"))):
        op, args = statement.split(None, 1)
        dst, *srcs = (a.strip() for a in args.split(","))
        a, b = (registers[s] if s in registers else np.uint32(int(s, 0)) for s in srcs)
        if op == "and.b32":
            out = a & b
        elif op == "or.b32":
            out = a | b
        elif op == "shl.b32":
            out = (a.astype(np.uint64) << np.uint64(b)) & 0xFFFFFFFF
        elif op == "shr.b32":
            out = a >> b
        elif op == "mul.rn.bf16x2":
            product = [_f32_to_bf16_bits(_bf16_bits_to_f32((a >> s) & 0xFFFF) * _bf16_bits_to_f32((b >> s) & 0xFFFF))
                       for s in (0, 16)]
            out = product[0] | (product[1] << 16)
        else:
            raise AssertionError(f"the emulator has no {op}")
        registers[dst] = np.asarray(out, dtype=np.uint32)
    return registers


def test_the_kernels_ptx_decodes_a_word_to_its_weights_exactly():
    from engine.kernels import triton_available

    if not triton_available():
        pytest.skip("needs triton (pip install 'batchrun[gpu]')")
    from engine.kernels.moe_gemm import WORDS_PTX

    # every code in every place of a word, then random words; each at every scale the layout takes. The expected
    # values come from the layout's definition (source_bit), not from the PTX.
    single = [sum(((code >> bit) & 1) << mxfp4_words.source_bit(r, t, bit) for bit in range(4))
              for r in range(4) for t in range(2) for code in range(16)]
    rng = np.random.default_rng(0)
    words = np.concatenate([np.array(single, dtype=np.uint32), rng.integers(0, 2**32, 2000, dtype=np.uint32)])
    scales = np.arange(mxfp4_words.MAX_SCALE + 1, dtype=np.uint32)
    word_grid, scale_grid = (g.reshape(-1) for g in np.meshgrid(words, scales, indexing="ij"))
    factor = (scale_grid + 126) << 7
    out = _run_ptx(WORDS_PTX.value, {"$4": word_grid, "$5": factor | (factor << 16)})
    for register in range(4):
        for half in range(2):
            code = sum(((word_grid >> mxfp4_words.source_bit(register, half, bit)) & 1) << bit for bit in range(4))
            expected = np.array(FP4_VALUES, dtype=np.float64)[code] * np.exp2(scale_grid.astype(np.float64) - 127)
            got = _bf16_bits_to_f32((out[f"${register}"] >> (16 * half)) & 0xFFFF).astype(np.float64)
            np.testing.assert_array_equal(got, expected, err_msg=f"o{register} half {half}")


def test_words_are_decoded_on_sm90_and_newer_and_without_cuda(monkeypatch):
    assert mxfp4_words.decodable_on(torch.device("cpu"))  # the interpreter: Triton's own operations
    for capability, decodable in (((8, 0), False), ((8, 9), False), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert mxfp4_words.decodable_on(torch.device("cuda", 0)) is decodable  # mul.rn.bf16x2 wants sm_90


def test_words_dequantize_through_the_torch_path_as_the_blocks_do():
    blocks, scales = quantize(torch.randn(2, 64, 16))
    from engine.mxfp4 import dequantize_expert

    words = mxfp4_words.pack(blocks)
    for expert in range(2):
        unpacked = mxfp4_words.unpack(words[expert][None])[0]
        assert torch.equal(dequantize_expert(unpacked, scales[expert], torch.float32),
                           dequantize(blocks, scales)[expert].T)
