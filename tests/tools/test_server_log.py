"""A stdio server's stderr in the tools log (tools/server_log.py): the warning an mcp 1.x server logs
about the 2.x client's `server/discover` probe is dropped (#28 item 9), everything else is kept."""

import io
import logging
import shlex
import subprocess
import sys

import pytest

from tests.support.mcp_servers import ECHO_COMMAND, MCP1_PATH, REPO, SAMPLING_SERVER, has_mcp1
from tools.client import ToolClient
from tools.server_log import MAX_REPEATS, ClientLog, ProbeNoiseFilter
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


# A client in a process of its own: under pytest the root logger has handlers, so a record the mcp
# package logs would never reach logging's last resort (stderr) here.
BANNER_CLIENT = """
import sys
from tools.client import ToolClient
from tools.servers import ServerSpec
spec = ServerSpec("banner", command=("sh", "-c", sys.argv[2]))
with ToolClient(errlog_path=sys.argv[1]) as client:
    print(client.call(spec, "add", {"a": 2, "b": 3}).result(timeout=60).output)
"""


def test_a_server_that_prints_a_banner_on_stdout_leaves_it_in_the_tools_log_not_on_stderr(tmp_path):
    log = tmp_path / "tools.log"
    server = f"echo 'echo server starting'; exec {shlex.join(ECHO_COMMAND)}"
    done = subprocess.run([sys.executable, "-c", BANNER_CLIENT, str(log), server], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "5\n", "")
    parse_errors = [line for line in log.read_text().splitlines() if "Failed to parse" in line]
    assert len(parse_errors) == 1, parse_errors  # one line, not a traceback
    assert parse_errors[0].startswith("mcp.client.stdio: Failed to parse JSONRPC message from server: ")
    assert "input_value='echo server starting'" in parse_errors[0]


def test_the_mcp_packages_records_of_one_kind_stop_after_max_repeats_and_masked():
    log = io.StringIO()
    handler = ClientLog(log, lambda line: line.replace("tok-4711", "[redacted]"))
    try:
        for n in range(MAX_REPEATS + 5):
            logging.getLogger("mcp.client.stdio").warning("bad line %d from tok-4711", n)
        logging.getLogger("mcp.client.session").warning("another kind")
    finally:
        handler.close()
    logging.getLogger("mcp.client.stdio").warning("after close")
    lines = log.getvalue().splitlines()
    assert len(lines) == MAX_REPEATS + 1
    assert lines[0] == "mcp.client.stdio: bad line 0 from [redacted]"
    assert lines[MAX_REPEATS - 1].endswith(f"(the {MAX_REPEATS}th such record: later ones are not logged)")
    assert lines[-1] == "mcp.client.session: another kind"
