"""A stdio server's stderr in the tools log (tools/server_log.py): the warning an mcp 1.x server logs
about the 2.x client's `server/discover` probe is dropped (#28 item 9), everything else is kept."""

import sys

import pytest

from tests.support.mcp_servers import MCP1_PATH, SAMPLING_SERVER, has_mcp1
from tools.client import ToolClient
from tools.server_log import ProbeNoiseFilter
from tools.servers import ServerSpec

# As FastMCP (rich, 80 columns) and plain logging print it (cut short: the real ones run ~30 lines).
RICH = ["[11/27/26 03:03:01] WARNING  Failed to validate request: 31       session.py:383\n",
        "                             validation errors for ClientRequest\n",
        "                             PingRequest.method\n",
        "                               Input should be 'ping'\n",
        "                             input_value='server/discover',\n",
        "                             iteral_error\n"]
PLAIN = ["WARNING:mcp.server.lowlevel.server:Failed to validate request: 31 validation errors for ClientRequest\n",
         "PingRequest.method\n",
         "  Input should be 'ping' [type=literal_error, input_value='server/discover', input_type=str]\n",
         "    For further information visit https://errors.pydantic.dev/2.14/v/literal_error\n"]
OTHER = ["WARNING  Failed to validate request: 1 validation error for ClientRequest\n",
         "  tools/call params.name: Field required\n"]


def filtered(lines: list[str]) -> list[str]:
    noise = ProbeNoiseFilter()
    kept = [out for line in lines for out in noise.feed(line)]
    return kept + list(noise.flush())


def test_the_probe_warning_is_dropped_in_either_format_and_the_lines_around_it_kept():
    before, after = "server starting\n", "Processing request of type ListToolsRequest\n"
    assert filtered([before, *RICH, after]) == [before, after]
    assert filtered([before, *PLAIN, after]) == [before, after]
    assert filtered([*RICH]) == []  # the stream ends inside the block


def test_a_validation_warning_about_anything_else_is_kept_whole():
    assert filtered(["a\n", *OTHER, "b\n"]) == ["a\n", *OTHER, "b\n"]
    assert filtered(OTHER) == OTHER


@pytest.mark.skipif(not has_mcp1(), reason="mcp 1.x is absent (make setup installs it with pip --target)")
def test_an_mcp_1x_server_leaves_no_probe_warning_in_the_tools_log(tmp_path):
    log = tmp_path / "tools.log"
    spec = ServerSpec("old", command=(sys.executable, SAMPLING_SERVER), env=(("PYTHONPATH", str(MCP1_PATH)),))
    with ToolClient(errlog_path=log) as client:
        assert {tool.name for tool in client.list_tools(spec).result(timeout=60).tools} == {
            "summarize", "ask_twice", "add"}
        assert client.call(spec, "add", {"a": 2, "b": 3}).result(timeout=60).output == "5"
    text = log.read_text()
    assert "Failed to validate request" not in text and "server/discover" not in text
    assert "sampling server: starting" in text  # the server's own lines still arrive
