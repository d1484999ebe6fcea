"""A stdio MCP server that answers the handshake and never a tools/list (a test's small fake: raw JSON-RPC, one
message a line). Every other request gets "method not found"; notifications get nothing."""

import json
import sys


def main() -> None:
    for raw in sys.stdin:
        message = json.loads(raw)
        if "id" not in message or message.get("method") == "tools/list":
            continue
        if message.get("method") == "initialize":
            reply = {"result": {"protocolVersion": message["params"]["protocolVersion"],
                                "capabilities": {"tools": {}}, "serverInfo": {"name": "mute", "version": "1"}}}
        else:  # server/discover (the 2026 protocol's probe): the client falls back to initialize
            reply = {"error": {"code": -32601, "message": "Method not found"}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], **reply}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
