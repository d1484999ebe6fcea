"""engine.kernels.moe_tiles: the MoE's launch shapes, each timed and held to the default shape's output.

Without CUDA the kernels run in Triton's interpreter at a tiny shape (fp32 activations: the exact MXFP4 path);
the GPU check runs the same sweep at gpt-oss-20b's shape on a GPU.
"""

import dataclasses

import pytest
import torch

from engine.kernels import require_triton, triton_available

if not triton_available():
    pytest.skip("triton is not installed (pip install 'batchrun[gpu]')", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
require_triton(DEVICE)  # CPU: the interpreter, chosen before triton is first imported
from engine.kernels import moe_tiles  # noqa: E402
from engine.kernels.moe import DEFAULT_TILES, ExpertWeight, GemmTiles  # noqa: E402

TINY = moe_tiles.SHAPES["tiny"]


@pytest.fixture(scope="module")
def layer():
    return moe_tiles.build_layer(TINY, DEVICE, torch.float32)


def test_tiles_text_round_trips_and_bad_text_names_the_form():
    for tiles in moe_tiles.CANDIDATES:
        assert GemmTiles.parse(str(tiles)) == tiles
    assert moe_tiles.CANDIDATES[0] == DEFAULT_TILES == GemmTiles.parse("64x64w4s3")
    with pytest.raises(ValueError, match="BLOCK_NxBLOCK_KwWARPSsSTAGES"):
        GemmTiles.parse("64x64")


def test_every_candidate_and_the_dense_experts_give_the_default_shapes_output(layer):
    landed = []
    # one step size: the tiny shape's tiles are 16 rows at any a test can afford (two step sizes: a test below)
    timings = moe_tiles.time_tiles(DEVICE, (5,), TINY, repeats=1, layer=layer, report=landed.append)
    assert timings == landed  # each reported as it lands
    # fp32: no words, so no gemv candidate (it takes words only)
    expected = [str(t) for t in moe_tiles.CANDIDATES if not t.gemv] + [moe_tiles.DENSE]
    assert [t.tiles for t in timings] == expected
    assert [t.tokens for t in timings] == [5] * len(expected)
    for timing in timings:
        assert timing.ok and timing.us > 0 and not timing.error, timing
        # fp32: a longer K step or a wider column block reorders nothing here (K = 64), and the dense experts are
        # the MXFP4 ones decoded exactly
        assert timing.diff < 1e-5, timing
    assert all(t.weight_bytes > 0 for t in timings)
    dense = next(t for t in timings if t.tiles == moe_tiles.DENSE)
    packed = timings[0]
    assert dense.weight_bytes == packed.weight_bytes * 4 * 64 // 34  # fp32 a weight against 17 / 32 of a byte
    assert moe_tiles.fastest(timings, 5).tiles in expected[:-1]


# ~36 s interpreted; the default run keeps every shape on blocks (above) and the words' numerics (test_triton_moe_words)
@pytest.mark.slow
def test_a_bf16_layer_runs_each_shape_on_words_too_where_its_k_step_takes_them():
    bf16_layer = moe_tiles.build_layer(TINY, DEVICE, torch.bfloat16)  # K = 64: one chunk of words
    assert bf16_layer.gate_up_words is not None and bf16_layer.down_words is not None
    shapes = (DEFAULT_TILES, GemmTiles.parse("64x128w4s3"), GemmTiles.parse("64x64w4s3k4"),
              GemmTiles.parse("64x32w4s3"), GemmTiles.parse("gemv16x64w4s1"))
    timings = moe_tiles.time_tiles(DEVICE, (6,), TINY, shapes, repeats=1, layer=bf16_layer)
    words = moe_tiles.WORDS_SUFFIX
    # every GEMM shape on blocks, and on words too (a 128-wide K step over K = 64: its one chunk left over), a
    # 32-wide step not; the gemv on words only, and only up to GEMV_MAX_TOKENS; the default on words with the
    # checkpoint's scale bytes as well
    shapes_words = [f"{s}{words}" for s in ("64x64w4s3", "64x128w4s3", "64x64w4s3k4")]
    runs = ["64x64w4s3", "64x128w4s3", "64x64w4s3k4", "64x32w4s3", *shapes_words]
    tail = [f"64x64w4s3{moe_tiles.SCALE_BYTES_SUFFIX}", moe_tiles.DENSE]
    assert [t.tiles for t in timings] == [*runs, f"gemv16x64w4s1{words}", *tail]
    too_many = [name for name, _, _ in moe_tiles._runs(shapes, bf16_layer, moe_tiles.GEMV_MAX_TOKENS + 1)]
    assert too_many == [*runs, *tail]
    assert all(t.ok and t.us > 0 for t in timings), timings
    # bf16 out, fp32 sums in another order
    assert all(t.diff < 1e-2 for t in timings if words in t.tiles)
    assert moe_tiles.fastest(timings, 6).tiles != moe_tiles.DENSE


def test_a_shape_with_another_answer_is_flagged_and_a_failing_one_recorded(layer):
    wrong = dataclasses.replace(layer, down_dense=ExpertWeight(dense=layer.down_dense.dense * 1.5))
    broken = GemmTiles(block_n=48)  # not a power of two: tl.arange refuses it
    timings = moe_tiles.time_tiles(DEVICE, (7,), TINY, (DEFAULT_TILES, broken), repeats=1, layer=wrong)
    default, failed, dense = timings
    assert default.ok and default.diff == 0
    assert failed.us is None and not failed.ok and failed.error, failed
    assert "failed (" in moe_tiles.describe(failed, default.us)
    assert dense.us is not None and not dense.ok and dense.diff > 0.1  # the down projection's output x1.5
    assert "DIFFERS" in moe_tiles.describe(dense, default.us)
    assert moe_tiles.fastest(timings, 7) == default  # neither the failed nor the dense row


def test_the_command_prints_a_line_a_shape_and_the_fastest(capsys):
    moe_tiles.main(["--device", DEVICE, "--shape", "tiny", "--tokens", "4", "--repeats", "1",
                    "--tiles", "64x64w4s3,64x64w2s3,64x64w4s3k4"])  # every candidate: the test above
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("moe tiles: tiny shape")
    shapes = [line.split(":")[0] for line in lines[1:-1]]
    assert shapes == ["moe T=4 64x64w4s3 (default)", "moe T=4 64x64w2s3", "moe T=4 64x64w4s3k4", "moe T=4 dense"]
    assert "x1.00 the default" in lines[1] and "ms at 24 layers" not in lines[1]  # no layer count for tiny
    assert lines[-1].startswith("moe T=4 fastest: ") and "x" in lines[-1]


def test_the_command_times_every_candidate_unless_told_which(monkeypatch):
    asked = []
    monkeypatch.setattr(moe_tiles, "time_tiles", lambda device, tokens, shape, tiles, **_: asked.append(tiles) or [])
    moe_tiles.main(["--device", DEVICE, "--shape", "tiny", "--tokens", "4"])
    assert asked == [moe_tiles.CANDIDATES]


def test_each_step_sizes_fastest_prints_as_soon_as_it_is_timed(capsys):
    moe_tiles.main(["--device", DEVICE, "--shape", "tiny", "--tokens", "2,3", "--repeats", "1",
                    "--tiles", "64x64w4s3,64x64w2s3"])  # two shapes: the order is the point, not the shapes
    lines = capsys.readouterr().out.splitlines()
    fastest = [index for index, line in enumerate(lines) if " fastest: " in line]
    assert len(fastest) == 2 and lines[fastest[0]].startswith("moe T=2 fastest: ")
    assert lines[fastest[0] + 1].startswith("moe T=3 64x64w4s3 (default): ")  # before the next step size's lines
