"""ToolClient against real MCP server processes: stdio and streamable HTTP, faults included."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support.mcp_servers import echo_http, echo_stdio
from tools.client import ToolClient
from tools.process_tree import live_descendants
from tools.servers import ServerSpec

SECRET = "tok-not-stored-4711"


@pytest.fixture(scope="module")
def http_url():
    with echo_http() as url:
        yield url


@pytest.fixture(scope="module")
def client():
    with ToolClient(call_timeout_s=10) as client:
        yield client


def call(client, spec, tool, timeout_s=None, **arguments):
    return client.call(spec, tool, arguments, timeout_s).result(timeout=30)


def test_stdio_list_call_and_tool_errors(client):
    spec = echo_stdio()
    listing = client.list_tools(spec).result(timeout=30)
    assert listing.error is None
    assert {"add", "sleep", "fail", "crash"} <= {tool.name for tool in listing.tools}
    assert client.list_tools(spec) is client.list_tools(spec)  # cached per run
    done = call(client, spec, "add", a=2, b=3)
    assert (done.output, done.error, done.error_kind) == ("5", None, None)
    assert done.started_at is not None and done.duration_s >= 0
    failed = call(client, spec, "fail", message="boom")
    assert failed.output is None and failed.error_kind == "tool_error" and "fail" in failed.error
    wrong = call(client, spec, "add", a="x")  # held to the listed schema before it is sent
    assert wrong.error_kind == "invalid_arguments" and wrong.error_code == -32602
    assert wrong.error == ("the arguments do not match the tool's input schema: $: 'b' is a required property; "
                           "$.a: 'x' is not of type 'integer'")


def test_injected_arguments_are_not_checked_and_are_masked_in_answers(client):
    spec = echo_stdio()
    done = client.call(spec, "big", {"size": 2}, injected={"char": "resp_42"}).result(timeout=30)
    assert done.output == "[char][char]"  # the server got it, the answer does not show it
    missing = client.call(spec, "big", {}, injected={"char": "resp_42"}).result(timeout=30)
    assert missing.error.endswith("$: 'size' is a required property") and "resp_42" not in missing.error


def test_calls_run_concurrently_on_one_connection(client):
    spec = echo_stdio()
    call(client, spec, "add", a=0, b=0)  # started
    start = time.monotonic()
    futures = [client.call(spec, "sleep", {"seconds": 1}) for _ in range(8)]
    assert [f.result(timeout=30).output for f in futures] == ["slept"] * 8
    assert time.monotonic() - start < 4


def test_timeout_fails_the_call_and_the_server_stays_usable(client):
    spec = echo_stdio()
    slow = call(client, spec, "sleep", timeout_s=0.3, seconds=5)
    assert slow.error_kind == "timeout" and slow.error == "the tool call timed out after 0.3 s"
    assert call(client, spec, "add", a=1, b=1).output == "2"


def test_a_crashed_stdio_server_fails_the_call_and_is_restarted(client):
    spec = echo_stdio()
    first_pid = call(client, spec, "pid").output
    crashed = call(client, spec, "crash")
    assert crashed.error_kind == "connection_lost" and "restarted" in crashed.error
    second_pid = call(client, spec, "pid").output
    assert second_pid and second_pid != first_pid


@pytest.mark.parametrize("code", [-32000, -32603])
def test_a_servers_json_rpc_error_is_its_answer_not_a_lost_connection(client, code):
    # -32000 was taken for the MCP library's "Connection closed": the server was killed and restarted, and
    # the call, which may have done its work, was run a second time.
    spec = echo_stdio()
    first_pid = call(client, spec, "pid").output
    refused = call(client, spec, "refuse", code=code)
    assert (refused.error_kind, refused.error_code, refused.attempts) == ("protocol_error", code, 1)
    assert refused.error == "MCPError: rate limited, try later"
    assert call(client, spec, "pid").output == first_pid  # not restarted


def test_a_server_that_cannot_start_fails_its_calls(client):
    spec = ServerSpec("nothing", command=("/nonexistent/mcp-server",))
    outcome = call(client, spec, "add", a=1, b=2)
    assert outcome.error_kind == "unreachable" and "nothing" in outcome.error
    assert client.list_tools(spec).result(timeout=30).error.startswith(
        "cannot list the tools of MCP server 'nothing': ")


def test_a_server_that_never_answers_fails_its_listing_saying_what_it_waited_for():
    # the error was a bare "TimeoutError", after a wait of connect_timeout_s no option names
    silent = ServerSpec("silent", command=("sleep", "30"))
    with ToolClient(connect_timeout_s=1) as client:
        listing = client.list_tools(silent).result(timeout=30)
    assert listing.error_kind == "timeout"
    assert listing.error == ("cannot list the tools of MCP server 'silent': TimeoutError: the server did not "
                             "answer MCP's initialize handshake within 1 s")


def test_a_server_that_never_lists_its_tools_fails_its_listing_saying_what_it_waited_for():
    # past the handshake, the listing's own wait (--tool-timeout) ended in a bare "TimeoutError" too
    server = Path(__file__).parents[1] / "support" / "mute_listing_server.py"
    mute = ServerSpec("mute", command=(sys.executable, str(server)))
    with ToolClient(connect_timeout_s=30, call_timeout_s=1) as client:
        listing = client.list_tools(mute).result(timeout=60)
    assert listing.error_kind == "timeout"
    assert listing.error == ("cannot list the tools of MCP server 'mute': TimeoutError: the server did not "
                             "finish tools/list within 1 s (--tool-timeout)")


@pytest.mark.parametrize(("mode", "kind", "error"), [
    ("same-cursor", "protocol_error", "ValueError: tools/list gave the cursor 'page2' a second time, after 2 pages: "
                                      "its listing would never end"),
    ("new-cursors", "timeout", "TimeoutError: the server did not finish tools/list within 2 s ("),
    ("huge-error", "protocol_error", "MCPError: " + "x" * 100)])
def test_a_listing_that_would_never_end_or_floods_its_error_is_bounded(mode, kind, error):
    # a cursor given again paged forever, and every line enabling the server waited with it; a 2 MB error
    # was stored whole in every line's row, response and events
    server = Path(__file__).parents[1] / "support" / "mute_listing_server.py"
    spec = ServerSpec("pages", command=(sys.executable, str(server), mode))
    with ToolClient(connect_timeout_s=30, call_timeout_s=2) as client:
        listing = client.list_tools(spec).result(timeout=60)
    assert listing.error_kind == kind and listing.tools == []
    assert listing.error.startswith(f"cannot list the tools of MCP server 'pages': {error}")
    assert len(listing.error) < 2200


def test_closing_while_a_server_is_in_its_handshake_ends_it_without_a_grace_period(monkeypatch):
    # Ctrl-C while a server had not answered its handshake waited CLOSE_GRACE_S for the session to end
    # gracefully (it never heeds the request to stop there), then left the server's process to the loop's end.
    import tools.connection

    monkeypatch.setattr(tools.connection, "CLOSE_GRACE_S", 3600.0, raising=False)
    before = set(live_descendants(os.getpid()))
    client = ToolClient(connect_timeout_s=3600)
    listing = client.list_tools(ServerSpec("silent", command=("sleep", "3600")))
    deadline = time.monotonic() + 30
    while not set(live_descendants(os.getpid())) - before and time.monotonic() < deadline:
        time.sleep(0.05)  # the server's process has started: the handshake is under way
    assert set(live_descendants(os.getpid())) - before
    client.close()  # waits at most 30 s for its connections: with the grace period, they were cut off then
    assert listing.done() and (listing.cancelled() or listing.result().error)
    assert set(live_descendants(os.getpid())) - before == set()


def test_http_with_headers_and_unreachable_urls(client, http_url):
    spec = ServerSpec("web", url=http_url, headers=(("X-Token", SECRET),))
    assert SECRET not in repr(spec) and SECRET not in spec.describe()
    assert call(client, spec, "add", a=20, b=22).output == "42"
    assert call(client, spec, "header", name="x-token").output == hashlib.sha256(SECRET.encode()).hexdigest()
    start = time.monotonic()
    futures = [client.call(spec, "sleep", {"seconds": 1}) for _ in range(8)]
    assert [f.result(timeout=30).output for f in futures] == ["slept"] * 8
    assert time.monotonic() - start < 4

    dead = ServerSpec("dead", url="http://127.0.0.1:9/mcp", headers=(("X-Token", SECRET),))
    outcome = call(client, dead, "add", a=1, b=2)
    assert outcome.error_kind == "unreachable" and SECRET not in outcome.error
    assert call(client, spec, "add", a=1, b=2).output == "3"  # the other server is unaffected


def test_closing_stops_stdio_servers():
    client = ToolClient()
    pid = int(client.call(echo_stdio(), "pid", {}).result(timeout=30).output)
    client.close()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        client.call(echo_stdio(), "pid", {})


def test_closing_with_calls_in_flight_restarts_no_server():
    """A call whose connection closing cuts off is not retried on a restarted server: after close()
    no process of the client is left (a retry's server used to outlive it)."""
    before = set(live_descendants(os.getpid()))
    client = ToolClient(call_timeout_s=120)
    spec = echo_stdio()
    in_flight = [client.call(spec, "sleep", {"seconds": 60}) for _ in range(2)]
    assert call(client, spec, "add", a=1, b=2).output == "3"  # the server is up, the sleeps sent before
    client.close()
    assert set(live_descendants(os.getpid())) - before == set()
    # Each cut-off call has ended, cancelled or failed: none is left pending on the stopped loop.
    assert all(future.cancelled() or future.result().error for future in in_flight)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_crash_retries_the_calls_in_flight_alone_and_fails_the_call_that_crashes_again():
    """Three calls are in flight when a fourth crashes the server: each is retried once on the
    restarted server, alone; the bystanders complete, the crashing call fails on its second crash."""
    with ToolClient(call_timeout_s=60) as client:  # the deadline covers the restarts too
        spec = echo_stdio()
        first_pid = call(client, spec, "pid").output
        bystanders = [client.call(spec, "sleep", {"seconds": 0.5}) for _ in range(3)]
        crasher = client.call(spec, "crash", {"delay_s": 0.2})
        outcomes = [future.result(timeout=60) for future in bystanders]
        assert [(o.output, o.error, o.attempts) for o in outcomes] == [("slept", None, 2)] * 3
        crashed = crasher.result(timeout=60)
        assert (crashed.output, crashed.error_kind, crashed.attempts) == (None, "connection_lost", 2)
        assert "again" in crashed.error and "not retried" in crashed.error
        after = call(client, spec, "pid")  # a third server process serves the next call
        assert (after.attempts, after.error) == (1, None) and after.output != first_pid


def test_the_timeout_caps_each_call_with_its_retry():
    """Eight calls of 2 s are in flight at a crash: retried alone, one after another, they take 16 s
    and more; with an 8 s timeout each call ends within its deadline, at least four as timeouts."""
    timeout_s = 8.0
    with ToolClient(call_timeout_s=timeout_s) as client:
        spec = echo_stdio()
        call(client, spec, "pid")  # started
        calls = [client.call(spec, "sleep", {"seconds": 2}) for _ in range(8)]
        client.call(spec, "crash", {"delay_s": 0.3}).result(timeout=60)
        outcomes = [future.result(timeout=60) for future in calls]
    assert all(outcome.attempts == 2 for outcome in outcomes)
    assert max(outcome.duration_s for outcome in outcomes) < timeout_s + 1.5  # generous: the deadline holds
    kinds = [outcome.error_kind for outcome in outcomes]
    assert set(kinds) <= {None, "timeout"} and kinds.count("timeout") >= 4, kinds
    late = next(outcome for outcome in outcomes if outcome.error_kind == "timeout")
    assert late.error == "the tool call timed out after 8 s (its retry on the restarted server included)"



def test_a_listed_schema_holding_nan_is_standard_json_and_a_finite_one_is_kept_as_listed():
    # The listing becomes the stored mcp_list_tools item; MCP's client reads NaN off the wire.
    import json

    from mcp.types import Tool

    from tools.client import standard_schema

    listed = Tool.model_validate_json('{"name": "f", "inputSchema": {"type": "object", "properties": '
                                      '{"n": {"type": "number", "maximum": NaN, "minimum": -Infinity}}}}')
    schema = standard_schema(listed).input_schema
    assert json.dumps(schema, allow_nan=False) == ('{"type": "object", "properties": '
                                                   '{"n": {"type": "number", "maximum": null, "minimum": null}}}')
    finite = Tool(name="g", inputSchema={"type": "object", "properties": {"n": {"maximum": 1.5}}})
    assert standard_schema(finite) is finite  # the run's requests share it (a cache keys by identity)


def test_an_http_session_the_server_no_longer_knows_is_started_anew():
    # 404 for a session id: the spec's "start a new session". Every call after the first failed with
    # "Session terminated" for the rest of the run.
    from tests.support.mcp_servers import free_port, http_server

    port = free_port()
    server = Path(__file__).parents[1] / "support" / "expiring_http_server.py"
    with http_server([sys.executable, str(server), str(port)], port, "the expiring server") as url, \
            ToolClient(call_timeout_s=10) as client:
        spec = ServerSpec("expiring", url=url)
        answers = [call(client, spec, "session") for _ in range(3)]
    assert [(a.output, a.error_kind) for a in answers] == [("s1", None), ("s2", None), ("s3", None)]
    assert [a.attempts for a in answers] == [1, 2, 2]  # the call the 404 answered ran again, in a new session
