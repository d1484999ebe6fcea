"""batch/run/admission.py: which conversations a line may continue."""

import pytest

from batch.run.admission import AdmissionError, _answered

CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}


def test_every_function_call_needs_its_output_but_one_cut_off_mid_arguments():
    question = {"role": "user", "content": "Weather?"}
    answered = [question, CALL, {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    assert _answered(answered, 0) == answered
    with pytest.raises(AdmissionError, match=r"^input\[1\]: no function_call_output for the function call 'c1'"):
        _answered([question, CALL], 0)
    with pytest.raises(AdmissionError, match=r"\(get_weather\) the previous response holds; send it in input$"):
        _answered([question, CALL, {"role": "user", "content": "And?"}], 2)
    cut = {**CALL, "arguments": '{"ci', "status": "incomplete"}  # its response hit max_output_tokens: never made
    assert _answered([question, cut, {"role": "user", "content": "Go on."}], 2)[1] is cut
