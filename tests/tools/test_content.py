"""An MCP result's text and stored form are standard JSON, whatever numbers the server sent."""

import json

from mcp import types

from tools.client import outcome_of
from tests.support.db import strict_json


def wire_result(line: str) -> types.CallToolResult:
    """A tools/call answer as the stdio client reads it off the wire (it accepts NaN and Infinity)."""
    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    return types.CallToolResult.model_validate(message.result)


def test_a_structured_nan_from_a_server_is_null_in_the_output_and_the_stored_result():
    result = wire_result('{"jsonrpc": "2.0", "id": 1, "result": {"content": [], '
                         '"structuredContent": {"mean": NaN, "range": [-Infinity, 1e999], "n": 0}}}')
    outcome = outcome_of(result)
    assert strict_json(outcome.output) == {"mean": None, "range": [None, None], "n": 0}
    stored = json.dumps(outcome.result, allow_nan=False)  # what the store's writer does
    assert strict_json(stored)["structuredContent"] == {"mean": None, "range": [None, None], "n": 0}


def test_finite_structured_content_reads_as_before():
    result = wire_result('{"jsonrpc": "2.0", "id": 1, "result": {"content": [], '
                         '"structuredContent": {"sum": 3.5, "items": ["a"]}}}')
    assert outcome_of(result).output == json.dumps({"sum": 3.5, "items": ["a"]})
