"""RunOptions: the requests in flight follow --max-inflight, else the engine's batch size."""

from pathlib import Path

from batch.run.options import DEFAULT_MAX_INFLIGHT, RunOptions


def test_requests_in_flight_follow_the_flag_else_the_engines_batch():
    path = Path("in.jsonl")
    assert RunOptions(input_path=path).inflight == DEFAULT_MAX_INFLIGHT == 64  # no engine known yet
    assert RunOptions(input_path=path, engine_config={"max_num_seqs": 256}).inflight == 256
    assert RunOptions(input_path=path, max_inflight=8, engine_config={"max_num_seqs": 256}).inflight == 8
    assert RunOptions(input_path=path, engine_config={"backend": "transformers"}).inflight == 64
