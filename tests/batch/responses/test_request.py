"""batch/responses/request.py: request bodies parsed and echoed."""

import warnings

import pytest

from batch.responses.request import parse_request


@pytest.mark.parametrize("allowed", [{"read_only": True}, {"tool_names": ["now"]}, ["now"]])
def test_an_mcp_tools_allowed_tools_echo_without_a_serializer_warning(allowed):
    request, _ = parse_request({"input": "hi", "tools": [
        {"type": "mcp", "server_label": "time", "server_url": "http://127.0.0.1:1/mcp", "allowed_tools": allowed}]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic's "PydanticSerializationUnexpectedValue" is a UserWarning
        tools = request.tool_dicts()
    assert tools[0]["allowed_tools"] == allowed
