"""A stdio MCP server that answers the handshake and never a good tools/list (a test's small fake: raw JSON-RPC,
one message a line). Its one argument says how: `mute` (never answers it; the default), `same-cursor` (a page
whose next cursor is always the same one), `new-cursors` (a new next cursor on every page, forever) or
`huge-error` (an error whose message is 2 MB). Every other request gets "method not found"; notifications get
nothing."""

import json
import sys


def _listing(message: dict, mode: str, pages: list[int]) -> dict | None:
    if mode == "mute":
        return None
    if mode == "huge-error":
        return {"error": {"code": -32603, "message": "x" * 2_000_000}}
    pages[0] += 1
    cursor = "page2" if mode == "same-cursor" else f"page{pages[0] + 1}"
    return {"result": {"tools": [{"name": f"tool{pages[0]}", "inputSchema": {"type": "object"}}],
                       "nextCursor": cursor}}


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "mute"
    pages = [0]
    for raw in sys.stdin:
        message = json.loads(raw)
        if "id" not in message:
            continue
        if message.get("method") == "tools/list":
            reply = _listing(message, mode, pages)
            if reply is None:
                continue
        elif message.get("method") == "initialize":
            reply = {"result": {"protocolVersion": message["params"]["protocolVersion"],
                                "capabilities": {"tools": {}}, "serverInfo": {"name": "mute", "version": "1"}}}
        else:  # server/discover (the 2026 protocol's probe): the client falls back to initialize
            reply = {"error": {"code": -32601, "message": "Method not found"}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], **reply}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
