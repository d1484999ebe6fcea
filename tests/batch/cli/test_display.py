"""What `batchrun show` prints for each kind of output item."""

from batch.cli.show_text import _item_text


def test_item_text_names_what_each_item_did():
    assert _item_text({"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}) == "Hi"
    assert _item_text({"type": "mcp_list_tools", "server_label": "calc",
                       "tools": [{"name": "add"}, {"name": "sub"}]}) == "calc: add, sub"
    assert _item_text({"type": "mcp_list_tools", "server_label": "calc", "tools": [],
                       "error": "unreachable"}) == "calc: no tools (error: unreachable)"
    assert _item_text({"type": "mcp_call", "name": "add", "arguments": "{}"}) == "add({})"
