"""A small MCP server on the venv's mcp 2.x whose tool samples on the 2026 protocol (#28).

On a 2026-07-28 connection a 2.x server asks for sampling inside the call: the call returns
an `InputRequiredResult`, the client samples and retries the call with the answer. The
request then rides the call itself, so batchrun knows exactly which response asked
(tools/sampling.py), even with many calls on the server at once.
"""

import asyncio
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Resolve, Sample
from mcp.types import CreateMessageResult, SamplingMessage, TextContent

server = MCPServer("modern-sampling")


def ask(text: str, max_tokens: int) -> Sample:
    return Sample([SamplingMessage(role="user", content=TextContent(type="text", text=text))],
                  max_tokens=max_tokens, system_prompt="You write one-line summaries.")


@server.tool()
async def summarize(text: str, max_tokens: int, summary: Annotated[CreateMessageResult, Resolve(ask)]) -> str:
    """Ask the client's model to summarize `text` in at most `max_tokens` tokens."""
    await asyncio.sleep(0)
    content = summary.content
    return f"{summary.stop_reason}: {content.text if isinstance(content, TextContent) else ''}"


if __name__ == "__main__":
    server.run()
