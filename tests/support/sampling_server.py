"""A small MCP server on mcp 1.x (FastMCP) whose tools ask the client to sample (#28).

Run with `.cache/mcp-servers/mcp1` first on PYTHONPATH (`make setup` installs mcp 1.x
there, apart from the venv's 2.x): a 1.x server makes a legacy connection, where the
server asks over the back-channel with `ctx.session.create_message`, and its stderr
shows what a 1.x server logs when a 2.x client connects. `--http PORT` serves
streamable HTTP on 127.0.0.1 instead of stdio.
"""

import json
import sys

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import SamplingMessage, TextContent

server = FastMCP("sampling")


@server.tool()
async def summarize(text: str, max_tokens: int, ctx: Context) -> str:
    """Ask the client's model to summarize `text` in at most `max_tokens` tokens."""
    result = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=f"Summarize: {text}"))],
        max_tokens=max_tokens, system_prompt="You write one-line summaries.", temperature=0.0)
    text_out = result.content.text if isinstance(result.content, TextContent) else ""
    return json.dumps({"model": result.model, "stop_reason": result.stopReason, "text": text_out})


@server.tool()
async def ask_twice(question: str, ctx: Context) -> str:
    """Two sampling requests in one call, the second one with the first answer in its conversation."""
    first = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=question))], max_tokens=16,
        system_prompt="Answer in a word.")
    answer = first.content.text if isinstance(first.content, TextContent) else ""
    second = await ctx.session.create_message(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text=question)),
                  SamplingMessage(role="assistant", content=TextContent(type="text", text=answer)),
                  SamplingMessage(role="user", content=TextContent(type="text", text="Again?"))], max_tokens=16,
        system_prompt="Answer in a word.")
    again = second.content.text if isinstance(second.content, TextContent) else ""
    return json.dumps([answer, again])


@server.tool()
def add(a: int, b: int) -> int:
    """a + b, without sampling."""
    return a + b


if __name__ == "__main__":
    print("sampling server: starting", file=sys.stderr, flush=True)
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.settings.port, server.settings.host = int(sys.argv[2]), "127.0.0.1"
        server.run("streamable-http")
    else:
        server.run()
