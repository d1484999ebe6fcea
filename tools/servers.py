"""Which MCP server answers a tool: `--mcp-config` entries, the built-in servers, request urls.

A `ServerSpec` says how to reach one server: a stdio command (started as a child
process) or a streamable-HTTP url with headers. Its `headers` and `env` may hold
secrets: they are left out of its repr and of `describe()`, and never stored. Every
value `${NAME}` put into a config entry, and every header value, is a secret:
`mask()` replaces it with `[redacted]` in what the server answers (outputs, errors),
and in its stderr on the way to the tools log (tools/server_log.py).

`--mcp-config FILE` is JSON in the common `mcpServers` shape; any string value may
name environment variables as `${NAME}`, so tokens stay out of the file:

    {"mcpServers": {
        "docs":  {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}},
        "local": {"command": "python", "args": ["-m", "my_server"], "env": {"KEY": "${KEY}"}}}}

A request's `mcp` tool resolves, in order: a built-in label (`code_interpreter`/`python`
-> the python server, `browser`/`web_search`/`web_search_preview` -> the browser server;
a config entry with that label replaces the built-in command); a config entry with
its `server_label` (the operator's config wins over the request's `server_url`; the
request's `headers`/`authorization` still go to an HTTP entry); its `server_url`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

PYTHON_LABELS = ("code_interpreter", "python")
BROWSER_LABELS = ("browser", "web_search", "web_search_preview")
_BUILTIN_MODULES = {"python": "tools.python_server", "browser": "tools.browser_server"}
# The runner resets a response's python session when the response ends, so live sessions
# never exceed the requests in flight: the server must not evict one mid-response.
_BUILTIN_ARGS = {"python": ("--max-sessions", "4096", "--idle-s", "86400"), "browser": ()}
_PASS_THROUGH_ENV = ("BATCHRUN_CORPUS",)  # stdio servers get a minimal environment otherwise
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 3  # shorter values would mask ordinary text (the mark a CI system leaves alone too)


class McpConfigError(ValueError):
    """The --mcp-config file is unreadable or malformed (names the entry and field)."""


class UnknownServerError(ValueError):
    """A request's mcp tool names no server this run can reach."""


@dataclass(frozen=True)
class ServerSpec:
    """How to reach one MCP server. Equal specs share one connection per run."""

    label: str
    command: tuple[str, ...] = ()  # stdio: executable and arguments
    url: str | None = None  # streamable HTTP
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    cwd: str | None = None
    builtin: str | None = None  # "python" | "browser": keeps per-response state by session_id
    secrets: tuple[str, ...] = field(default=(), repr=False)  # values substituted from ${NAME}

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError(f"server {self.label!r}: give exactly one of a command or a url")

    @property
    def is_stdio(self) -> bool:
        return bool(self.command)

    @property
    def secret_values(self) -> tuple[str, ...]:
        """Every value to mask wherever it would be stored or printed: what `${NAME}` substituted,
        and every header value (an Authorization token among them); longest first."""
        headers = [v for _, v in self.headers] + [v.split(" ", 1)[1] for _, v in self.headers if " " in v.strip()]
        values = {value for value in (*self.secrets, *headers) if len(value) >= MIN_SECRET_CHARS}
        return tuple(sorted(values, key=lambda value: (-len(value), value)))

    def mask(self, text: str | None) -> str | None:
        """`text` with every secret value replaced by `[redacted]`, as CI systems mask logs."""
        if text:
            for value in self.secret_values:
                text = text.replace(value, REDACTED)
        return text

    def describe(self) -> str:
        """Safe to log and store: the label and where it runs, no headers or env values."""
        where = self.url if self.url else " ".join(self.command)
        return f"{self.label} ({where})"

    def with_headers(self, headers: dict[str, str]) -> ServerSpec:
        if not headers or self.is_stdio:
            return self
        merged = dict(self.headers) | headers
        return ServerSpec(self.label, url=self.url, headers=tuple(sorted(merged.items())),
                          builtin=self.builtin, secrets=self.secrets)


def builtin_spec(kind: str) -> ServerSpec:
    """The built-in python or browser server, run from this interpreter."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path} | {k: os.environ[k] for k in _PASS_THROUGH_ENV if k in os.environ}
    return ServerSpec(kind, command=(sys.executable, "-m", _BUILTIN_MODULES[kind], *_BUILTIN_ARGS[kind]),
                      env=tuple(sorted(env.items())), builtin=kind)


def builtin_kind(label: str) -> str | None:
    if label in PYTHON_LABELS:
        return "python"
    if label in BROWSER_LABELS:
        return "browser"
    return None


def request_headers(tool: dict) -> dict[str, str]:
    """The headers an mcp tool's calls carry: its `headers` and `authorization` (a bearer token)."""
    headers = dict(tool.get("headers") or {})
    token = tool.get("authorization")
    if token:
        headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
    return headers


class ServerCatalog:
    """The servers of one run: `--mcp-config` entries and the built-in servers."""

    def __init__(self, config: dict[str, ServerSpec] | None = None):
        self.config = dict(config or {})

    def builtin(self, kind: str) -> ServerSpec:
        labels = PYTHON_LABELS if kind == "python" else BROWSER_LABELS
        for label in labels:
            if label in self.config:
                spec = self.config[label]
                return ServerSpec(spec.label, spec.command, spec.url, spec.headers, spec.env,
                                  spec.cwd, builtin=kind, secrets=spec.secrets)
        return builtin_spec(kind)

    def for_tool(self, tool: dict) -> ServerSpec:
        """The server of a request's mcp tool; UnknownServerError when there is none."""
        label = tool["server_label"]
        kind = builtin_kind(label)
        if kind is not None:
            return self.builtin(kind)
        if label in self.config:
            return self.config[label].with_headers(request_headers(tool))
        if tool.get("server_url"):
            return ServerSpec(label, url=tool["server_url"],
                              headers=tuple(sorted(request_headers(tool).items())))
        if tool.get("connector_id"):
            raise UnknownServerError(f"mcp server {label!r}: connector_id {tool['connector_id']!r} names one of "
                                     "OpenAI's connectors, which cannot be reached offline; give an --mcp-config "
                                     f"entry labelled {label!r} (or a server_url) that serves it")
        raise UnknownServerError(f"mcp server {label!r} has no server_url and no --mcp-config entry")


# -- --mcp-config -------------------------------------------------------------

def load_mcp_config(path: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, ServerSpec]:
    """Parse an `mcpServers` JSON file, expanding `${NAME}`; raises McpConfigError."""
    environ = os.environ if environ is None else environ
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise McpConfigError(f"--mcp-config {path}: {exc}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f"--mcp-config {path}: expected an object with an 'mcpServers' object")
    return {label: _spec(f"--mcp-config {path}: mcpServers.{label}", label, entry, environ)
            for label, entry in servers.items()}


def _spec(where: str, label: str, entry: object, environ) -> ServerSpec:
    if not isinstance(entry, dict) or ("command" in entry) == ("url" in entry):
        raise McpConfigError(f"{where}: expected an object with either 'command' or 'url'")
    substituted: list[str] = []
    entry = cast(dict, _expand(where, entry, environ, substituted))  # a dict expands to a dict
    secrets = tuple(sorted(set(substituted)))
    unknown = set(entry) - {"command", "args", "env", "cwd", "url", "headers", "type"}
    if unknown:
        raise McpConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    if "url" in entry:
        headers = _string_map(where, "headers", entry.get("headers"))
        return ServerSpec(label, url=_string(where, "url", entry["url"]),
                          headers=tuple(sorted(headers.items())), secrets=secrets)
    args = entry.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}.args: expected a list of strings")
    env = _string_map(where, "env", entry.get("env"))
    return ServerSpec(label, command=(_string(where, "command", entry["command"]), *args),
                      env=tuple(sorted(env.items())), cwd=entry.get("cwd"), secrets=secrets)


def _expand(where: str, value, environ, substituted: list[str]):
    """`value` with `${NAME}` expanded; every value put in is appended to `substituted`."""
    if isinstance(value, str):
        def variable(match: re.Match) -> str:
            if match.group(1) not in environ:
                raise McpConfigError(f"{where}: environment variable {match.group(1)} is not set")
            substituted.append(environ[match.group(1)])
            return environ[match.group(1)]
        return _VARIABLE.sub(variable, value)
    if isinstance(value, list):
        return [_expand(where, item, environ, substituted) for item in value]
    if isinstance(value, dict):
        return {key: _expand(where, item, environ, substituted) for key, item in value.items()}
    return value


def _string(where: str, name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise McpConfigError(f"{where}.{name}: expected a non-empty string")
    return value


def _string_map(where: str, name: str, value) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f"{where}.{name}: expected an object of strings")
    return value
