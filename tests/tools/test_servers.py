"""--mcp-config parsing and which server answers a request's mcp tool."""

from __future__ import annotations

import json
import sys

import pytest

from tools.servers import McpConfigError, ServerCatalog, ServerSpec, UnknownServerError, load_mcp_config


def config_file(tmp_path, servers):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def test_config_expands_environment_variables_and_hides_them(tmp_path):
    path = config_file(tmp_path, {
        "docs": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}},
        "local": {"command": "python", "args": ["-m", "x", "${ARG}"], "env": {"KEY": "${DOCS_TOKEN}"}},
    })
    servers = load_mcp_config(path, environ={"DOCS_TOKEN": "s3cret", "ARG": "--fast"})
    assert servers["docs"] == ServerSpec("docs", url="http://127.0.0.1:8000/mcp",
                                         headers=(("Authorization", "Bearer s3cret"),), secrets=("s3cret",))
    assert servers["local"].command == ("python", "-m", "x", "--fast")
    assert dict(servers["local"].env) == {"KEY": "s3cret"}
    assert all("s3cret" not in repr(spec) and "s3cret" not in spec.describe() for spec in servers.values())
    # Every substituted value is a secret, masked wherever it would be stored or printed.
    assert servers["local"].secret_values == ("--fast", "s3cret")
    assert servers["local"].mask("KEY=s3cret ran --fast") == "KEY=[redacted] ran [redacted]"
    request = ServerSpec("web", url="http://h/mcp").with_headers({"Authorization": "Bearer tok-123"})
    assert request.mask("token tok-123 in 'Bearer tok-123'") == "token [redacted] in '[redacted]'"


@pytest.mark.parametrize("servers, message", [
    ({"a": {"url": "http://x/mcp", "headers": {"A": "${MISSING}"}}},
     "mcpServers.a: environment variable MISSING is not set"),
    ({"a": {"command": "x", "url": "http://x"}}, "mcpServers.a: expected an object with either"),
    ({"a": {"command": "x", "args": "not a list"}}, "mcpServers.a.args: expected a list of strings"),
    ({"a": {"url": "http://x", "bogus": 1}}, "mcpServers.a: unknown field(s) bogus"),
])
def test_config_errors_name_the_entry(tmp_path, servers, message):
    with pytest.raises(McpConfigError, match=f"--mcp-config .*{message.replace('(', '.').replace(')', '.')}"):
        load_mcp_config(config_file(tmp_path, servers), environ={})


def test_config_must_have_mcp_servers(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"servers": {}}')
    with pytest.raises(McpConfigError, match="expected an object with an 'mcpServers' object"):
        load_mcp_config(path)


def test_catalog_resolution_order():
    configured = ServerSpec("docs", url="http://config/mcp", headers=(("A", "1"),))
    python = ServerSpec("python", command=("my-python-server",))
    catalog = ServerCatalog({"docs": configured, "python": python})
    # Built-in labels go to the built-in servers (a config entry replaces the command).
    assert catalog.for_tool({"server_label": "code_interpreter", "server_url": "IGNORED"}).command == (
        "my-python-server",)
    browser = catalog.for_tool({"server_label": "web_search_preview"})
    assert browser.builtin == "browser" and browser.command == (sys.executable, "-m", "tools.browser_server")
    # The config wins over server_url; the request's headers and token still apply.
    spec = catalog.for_tool({"server_label": "docs", "server_url": "http://request/mcp",
                             "headers": {"B": "2"}, "authorization": "tok"})
    assert spec.url == "http://config/mcp"
    assert dict(spec.headers) == {"A": "1", "B": "2", "Authorization": "Bearer tok"}
    assert catalog.for_tool({"server_label": "other", "server_url": "http://other/mcp"}).url == "http://other/mcp"
    with pytest.raises(UnknownServerError, match="'nowhere' has no server_url and no --mcp-config entry"):
        catalog.for_tool({"server_label": "nowhere"})
