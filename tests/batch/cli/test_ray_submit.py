"""`submit --ray`'s runs row: what the workers report goes where the runs row records it."""

from pathlib import Path

from batch.cli.ray_submit import _with_engine
from batch.distributed.ray_runner import RayOptions
from batch.run.options import RunOptions


def test_the_workers_fingerprint_is_the_runs_when_the_driver_cannot_read_the_weights():
    reported = {"backend": "engine", "max_num_seqs": 256, "model_fingerprint": "abcd"}
    unread = _with_engine(RunOptions(input_path=Path("in.jsonl")), reported, RayOptions(num_workers=2))
    assert unread.model_fingerprint == "abcd" and "model_fingerprint" not in unread.engine_config
    assert unread.engine_config["ray"]["workers"] == 2 and unread.inflight == 256
    read = _with_engine(RunOptions(input_path=Path("in.jsonl"), model_fingerprint="ffff"), reported, RayOptions())
    assert read.model_fingerprint == "ffff"  # the driver read --model itself
