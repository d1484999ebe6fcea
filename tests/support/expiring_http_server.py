"""A streamable-HTTP MCP server whose sessions expire once they answered a tool call: a session's second call gets
404, as the transport spec says for a session the server no longer knows, and so does every request after it (a
test's small fake: plain JSON answers, no GET stream, as a server behind a gateway may be). A new initialize
starts a new session.

    python tests/support/expiring_http_server.py PORT
"""

import itertools
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SESSIONS: dict[str, int] = {}  # a live session's id -> the tool calls it answered
NEW_IDS = (f"s{n}" for n in itertools.count(1))


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - no server-to-client stream
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        session = self.headers.get("Mcp-Session-Id")
        method = message.get("method")
        if method == "initialize":
            session = next(NEW_IDS)
            SESSIONS[session] = 0
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "expiring", "version": "1"}}
        elif session is not None and (session not in SESSIONS or method == "tools/call" and SESSIONS[session]):
            SESSIONS.pop(session, None)
            return self._send(404, None, session)
        elif "id" not in message:
            return self._send(202, None, session)
        elif method == "tools/list":
            result = {"tools": [{"name": "session", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            SESSIONS[session] += 1
            result = {"content": [{"type": "text", "text": session}]}
        else:  # server/discover, the 2026 protocol's probe: the client falls back to initialize
            return self._send(200, {"jsonrpc": "2.0", "id": message["id"],
                                    "error": {"code": -32601, "message": "Method not found"}}, session)
        self._send(200, {"jsonrpc": "2.0", "id": message["id"], "result": result}, session)

    def _send(self, status: int, body: dict | None, session: str | None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if session is not None:
            self.send_header("Mcp-Session-Id", session)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
