"""Batch output ids stay unique when a line has several samples (--epochs)."""

from batch.cli.batch_output import batch_output_line


def test_each_epoch_of_an_invalid_line_gets_its_own_ids():
    rows = [{"line_no": 3, "epoch": epoch, "custom_id": "c", "status": "invalid", "response": None,
             "error": "line 3: input: required"} for epoch in range(3)]
    lines = [batch_output_line("r", row) for row in rows]
    assert [line["id"] for line in lines] == ["batch_req_r_3", "batch_req_r_3_epoch1", "batch_req_r_3_epoch2"]
    assert [line["response"]["request_id"] for line in lines] == ["req_r_3", "req_r_3_epoch1", "req_r_3_epoch2"]
    assert {line["custom_id"] for line in lines} == {"c"}
