"""An MCP tool result -> the text the model reads (and the `mcp_call` item's `output`), and the raw result.

The Responses API carries an MCP call's output as one string, so every content block
becomes readable text, and nothing is thrown away: text as it is; a text resource's
text under its uri; a binary resource, an image or audio as its MIME type and size
(the model cannot read the bytes); a resource link as its name, uri and description.
The whole result, as MCP sent it (camelCase JSON), is kept beside it for the
`tool_calls.result` column. Both are standard JSON: a number a server sent as NaN or
Infinity, which the client reads, is null (batch/responses/standard_json.py).
"""

from __future__ import annotations

import base64
import binascii
import json

from mcp.types import (AudioContent, BlobResourceContents, CallToolResult, EmbeddedResource, ImageContent,
                       ResourceLink, TextContent, TextResourceContents)


def readable_text(result: CallToolResult) -> str:
    """The result as one string: each block readable, joined by newlines (structured content alone: its JSON,
    a NaN or infinity in it as null, as in `raw_result`)."""
    if not result.content and result.structured_content is not None:
        return json.dumps(raw_result(result)["structuredContent"])
    return "\n".join(block_text(block) for block in result.content)


def block_text(block: object) -> str:
    """One content block as text the model can read."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent | AudioContent):
        return f"[{block.type}: {block.mime_type}, {_size(block.data):,} bytes]"
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, TextResourceContents):
            return f"[resource: {resource.uri}]\n{resource.text}"
        if isinstance(resource, BlobResourceContents):
            return f"[resource: {resource.uri}, {resource.mime_type or 'binary'}, {_size(resource.blob):,} bytes]"
    if isinstance(block, ResourceLink):
        about = f": {block.description}" if block.description else ""
        return f"[resource link: {block.title or block.name} <{block.uri}>{about}]"
    return f"[{getattr(block, 'type', 'unknown')} content]"


def raw_result(result: CallToolResult) -> dict:
    """The result as MCP's JSON (camelCase), for storing: standard JSON, so a NaN or infinity a server sent
    (MCP's client reads them) is null, as pydantic and JavaScript write them."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _size(data: str) -> int:
    """Bytes of base64 `data` (its length, if it is not base64)."""
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return len(data)
