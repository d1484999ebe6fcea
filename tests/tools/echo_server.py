"""A tiny MCP server for the tool-client tests, over stdio or streamable HTTP.

    python -m tests.tools.echo_server [--http PORT]

Tools: `add(a, b)` (annotated read-only, titled "Add"), `sleep(seconds)` (answers "slept"), `fail(message)` (an is_error
result), `crash(delay_s)` (the process exits: the client must restart it), `header(name)`
(the sha256 of an HTTP request header's value, so tests can check a secret arrived
without storing it; "absent" when missing or over stdio), `big(char, size)` (a huge
output), `env(name)` (an environment variable, echoed to stderr too), `media()` (every
content kind), `refuse(code)` (a JSON-RPC error), `pid()` (the server's pid).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (BlobResourceContents, CallToolResult, EmbeddedResource, ImageContent, ResourceLink,
                       TextContent, TextResourceContents, ToolAnnotations)

server = MCPServer("echo", instructions="Test tools.")


@server.tool(title="Add", annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool()
def fail(message: str) -> str:
    """Always fails with `message`."""
    raise ValueError(message)


@server.tool()
async def crash(delay_s: float = 0.0) -> str:
    """The server process dies, after `delay_s` (so that other calls are in flight)."""
    await asyncio.sleep(delay_s)
    os._exit(3)


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The sha256 of an HTTP request header's value ("absent" when missing or over stdio)."""
    request = ctx.request_context.request
    value = None if request is None else request.headers.get(name)
    return "absent" if value is None else hashlib.sha256(value.encode()).hexdigest()


@server.tool()
def big(char: str, size: int) -> str:
    """`char` repeated `size` times (a huge output)."""
    return char * size


@server.tool()
def env(name: str) -> str:
    """An environment variable's value, also printed to stderr (as a careless server might)."""
    value = os.environ.get(name, "unset")
    print(f"{name}={value}", file=sys.stderr, flush=True)
    return value


@server.tool()
def media() -> CallToolResult:
    """One block of every kind: text, an image, a text and a binary resource, a resource link."""
    pixel = base64.b64encode(b"\x89PNG" + bytes(60)).decode()
    return CallToolResult(content=[
        TextContent(type="text", text="four kinds follow"),
        ImageContent(type="image", data=pixel, mime_type="image/png"),
        EmbeddedResource(type="resource", resource=TextResourceContents(
            uri="file:///notes.txt", mime_type="text/plain", text="the notes' text")),
        EmbeddedResource(type="resource", resource=BlobResourceContents(
            uri="file:///data.bin", mime_type="application/octet-stream", blob=base64.b64encode(bytes(10)).decode())),
        ResourceLink(type="resource_link", name="report", uri="https://example.com/report.pdf",
                     description="the full report")])


@server.tool()
def refuse(code: int) -> str:
    """Answers a JSON-RPC error of `code` (-32000 is also the MCP library's "Connection closed")."""
    raise MCPError(code=code, message="rate limited, try later")


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port")
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
