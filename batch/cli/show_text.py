"""What `batchrun show` prints: a response (its input, output items with their tool outputs,
usage, event types), or a request line that has no response (an invalid one) and why."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batch.store.responses import StoredRequest, StoredResponse

SHOWN_CHARS = 300  # of each text, output and argument


def response_text(found: StoredResponse, events: list[dict], tool_calls: list[dict],
                  epoch_label: str | None = None) -> str:
    """One response: header, its input, output items, its tool calls' outputs, usage, event-type counts.
    ``epoch_label`` (`epoch=K of 0-2`) ends the header when the run holds several samples of the line."""
    response = found.response
    lines = [f"response {response['id']}  custom_id={found.custom_id}  run={found.run_id}"
             + (f"  {epoch_label}" if epoch_label else ""),
             f"status: {response['status']}"]
    if response.get("error"):
        lines.append(f"error: {response['error']['message']}")
    if response.get("incomplete_details"):
        lines.append(f"incomplete: {response['incomplete_details']['reason']}")
    lines.append("input:")
    lines += [f"  {_input_text(item)}" for item in found.input_items or []]
    lines.append("output:")
    for index, item in enumerate(response["output"]):
        lines.append(f"  [{index}] {item['type']} ({item.get('status')}): {_item_text(item)}")
    if tool_calls:
        lines.append("tool calls:")
    for call in tool_calls:
        target = ".".join(part for part in (call.get("server_label"), call.get("name")) if part)
        answer = f"error: {_cut(call['error'])}" if call.get("error") else _cut(call.get("output") or "")
        lines.append(f"  {call['tool_type']} {target} ({call['status']}): {answer}")
    usage = response.get("usage") or {}
    lines.append("usage: " + ", ".join(f"{k}={v}" for k, v in _flatten(usage).items()))
    counts = Counter(event["type"] for event in events)
    lines.append(f"events ({len(events)}): " + ", ".join(f"{t} x{n}" for t, n in counts.items()))
    return "\n".join(lines)


def request_text(request: StoredRequest, epoch_label: str | None = None) -> str:
    """A request line with no response: its status, error and body (``epoch_label`` as in response_text)."""
    return "\n".join([
        f"request line {request.line_no}  custom_id={request.custom_id}  run={request.run_id}  "
        + (f"{epoch_label}  " if epoch_label else "") + "(no response)",
        f"status: {request.status}",
        f"error: {request.error}",
        f"body: {_cut(request.body if request.body is not None else '(not a JSON object)')}"])


def _cut(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"... ({len(text):,} chars)"


def _input_text(item: dict) -> str:
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        text = content if isinstance(content, str) else "".join(
            part.get("text", "") for part in content or [] if isinstance(part, dict))
        return f"{item.get('role')}: {_cut(text)}"
    if kind == "function_call_output":
        return f"function_call_output ({item.get('call_id')}): {_cut(item.get('output'))}"
    return f"{kind}: {_item_text(item)}"


def _item_text(item: dict) -> str:
    kind = item["type"]
    if kind in ("message", "reasoning"):
        return _cut("".join(part.get("text", "") for part in item.get("content") or []))
    if kind == "code_interpreter_call":
        return _cut(item.get("code") or "")
    if kind == "web_search_call":
        return _action_text(item.get("action") or {})
    if kind == "mcp_list_tools":
        names = ", ".join(tool.get("name", "?") for tool in item.get("tools") or [])
        return f"{item.get('server_label')}: {names or 'no tools'}" + (
            f" (error: {item['error']})" if item.get("error") else "")
    label = f"{item['server_label']}." if kind == "mcp_call" and item.get("server_label") else ""
    return f"{label}{item.get('name')}({_cut(item.get('arguments') or '')})"


def _action_text(action: dict) -> str:
    kind = action.get("type")
    if kind == "search":
        return f"search {action.get('query')!r}"
    if kind == "open_page":
        return f"open_page {action.get('url') or '(url unknown)'}"
    if kind == "find_in_page":
        return f"find_in_page {action.get('pattern')!r} in {action.get('url') or '(url unknown)'}"
    return _cut(action)


def _flatten(usage: dict) -> dict:
    flat = {}
    for key, value in usage.items():
        if isinstance(value, dict):
            flat.update(_flatten(value))
        else:
            flat[key] = value
    return flat
