"""ToolClient with server-everything's tasks: a sampling request it sends as a task, whose call timed
out, stops decoding once no call is left on the server (as a plain request's does when the server
cancels it with its call). Skipped where node or server-everything is absent."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from tools.client import ToolClient
from tools.sampling_inbox import SamplingInbox
from tools.servers import ServerSpec

EVERYTHING = Path(__file__).resolve().parents[2] / ".cache" / "mcp-servers" / "node" / "node_modules" / ".bin" / (
    "mcp-server-everything")
needs_node = pytest.mark.skipif(shutil.which("node") is None or not EVERYTHING.exists(),
                                reason="node or server-everything is absent (make setup installs it with npm)")


@needs_node
def test_a_sampling_task_whose_call_timed_out_stops_decoding():
    spec = ServerSpec("everything", command=(str(EVERYTHING), "stdio"))
    inbox = SamplingInbox()  # nobody answers: the model is still decoding when the call runs out
    with ToolClient(call_timeout_s=30, sampling=inbox) as client:
        assert len(client.list_tools(spec).result(timeout=60).tools) == 19  # the -async ones need tasks declared
        outcome = client.call(spec, "trigger-sampling-request-async", {"prompt": "hi", "maxTokens": 5},
                              timeout_s=1).result(timeout=60)
        assert outcome.error_kind == "timeout"
        inbox.doorbell.result(timeout=10)
        [request] = inbox.take()
        assert request.messages == (("user", "Resource trigger-sampling-request-async context: hi"),)
        # The decode loop stops a request whose answer is cancelled (batch/run/sampling.py).
        stopped = threading.Event()  # a cancelled Future wakes no `wait()`: its callbacks run
        request.answer.add_done_callback(lambda _: stopped.set())
        assert stopped.wait(timeout=10) and request.answer.cancelled()
