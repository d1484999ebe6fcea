"""engine.mxfp4: the packed layout agrees with transformers' own MXFP4 dequantisation."""

import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from engine import mxfp4


def random_packed(num_experts=2, num_out=8, num_groups=3, seed=0):
    """Every byte value and scales from 2^-127 (subnormal) up: any bit pattern a checkpoint may hold."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (num_experts, num_out, num_groups, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 200, (num_experts, num_out, num_groups), dtype=torch.uint8, generator=gen)
    scales[0, 0, 0], scales[0, 0, 1] = 0, 1
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_equals_transformers(dtype):
    blocks, scales = random_packed()
    got = mxfp4.dequantize(blocks, scales, dtype)
    assert got.shape == (2, 96, 8) and got.dtype == dtype
    assert torch.equal(got, convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_expert_decoded_for_a_step_equals_the_load_time_dequantisation(dtype):
    # the torch path's packed experts: [out, in] per expert, every bit as `dequantize` (subnormal scales too)
    blocks, scales = random_packed(num_out=16, num_groups=4)
    whole = mxfp4.dequantize(blocks, scales, dtype)
    for e in range(2):
        got = mxfp4.dequantize_expert(blocks[e], scales[e], dtype)
        assert got.shape == (16, 128) and got.dtype == dtype
        assert torch.equal(got, whole[e].T), e


def test_low_nibble_is_the_even_input():
    weight = torch.zeros(1, 32, 1)
    weight[0, 0, 0], weight[0, 1, 0], weight[0, 31, 0] = 1.0, -0.5, 6.0  # codes 2, 9 (sign + 1), 7
    blocks, scales = mxfp4.quantize(weight)
    assert scales.tolist() == [[[127]]]  # the largest magnitude is 6: scale 2^0
    assert blocks[0, 0, 0, 0].item() == 2 | 9 << 4 and blocks[0, 0, 0, 15].item() == 7 << 4
    assert torch.equal(mxfp4.dequantize(blocks, scales), weight)


def test_quantize_is_exact_on_representable_weights_and_close_elsewhere():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (3, 2, 32, 5), generator=gen)  # [E, group, 32, out]
    codes[:, :, 0] = 7  # each group's largest magnitude, 6, sets its scale
    group_scales = 2.0 ** torch.randint(-4, 5, (3, 2, 1, 5), generator=gen)
    exact = (torch.tensor(mxfp4.FP4_VALUES)[codes] * group_scales).reshape(3, 64, 5)
    assert torch.equal(mxfp4.dequantize(*mxfp4.quantize(exact)), exact)
    weight = torch.randn(3, 64, 5, generator=gen)
    back = mxfp4.dequantize(*mxfp4.quantize(weight))
    assert torch.equal(back, convert_moe_packed_tensors(*mxfp4.quantize(weight), dtype=torch.float32))
    groups_max = weight.abs().reshape(3, 2, 32, 5).amax(2, keepdim=True).expand(3, 2, 32, 5).reshape(3, 64, 5)
    # The scale puts the group maximum in (3, 6]; the widest e2m1 step is 2, so the error is at most 1 scale <= max / 3.
    assert ((back - weight).abs() <= groups_max / 3).all()


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4.quantize(torch.zeros(1, 48, 4))
    blocks, scales = random_packed()
    with pytest.raises(ValueError, match="do not match"):
        mxfp4.dequantize(blocks, scales[:, :4])
    with pytest.raises(ValueError, match="do not match"):
        mxfp4.dequantize(blocks.int(), scales)
