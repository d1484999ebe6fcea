"""tools/dispatch.py: the run's tools after they are closed."""

import pytest

from tools.dispatch import ToolDispatcher
from tools.servers import ServerSpec


def test_releasing_a_response_after_close_starts_no_tool_client():
    # A response finishing after the run closed its tools must not start the servers again to reset its
    # python interpreter: the new client (and its server processes) would outlive the run.
    dispatcher = ToolDispatcher()
    dispatcher._stateful["resp_1"] = {ServerSpec("python", command=("python", "-c", "pass"), builtin="python")}
    dispatcher.close()
    dispatcher.release("resp_1")
    assert dispatcher._client is None
    with pytest.raises(RuntimeError, match="closed"):
        dispatcher.client  # noqa: B018
