"""The built-in browser tool (harmony `to=browser.*`, Responses `web_search`) as an MCP server.

    python -m tools.browser_server [--corpus DIR ...] [--view-chars 4000]

serves, over stdio, gpt-oss's simple browser over a local corpus (tools/corpus.py; the
sample in data/corpus/ unless `--corpus` or `BATCHRUN_CORPUS`, os.pathsep-separated,
names directories):
- `search(query, topn=10)`: a results page of numbered links `【{id}†{title}†{host}】`;
- `open(id=-1, cursor=-1, loc=-1, num_lines=-1)`: `id` a link number on the page at
  `cursor` (default: the last page), or a url/page id; `id=-1` scrolls that page;
- `find(pattern, cursor=-1)`: case-insensitive matches on a page, as numbered links;
- `reset()`: forget the session's pages.
Each call pushes a page: its cursor is the `[n]` before the title. A page shows
`L{n}: ` numbered lines (wrapped at 80 characters), about `--view-chars` characters at
a time (gpt-oss counts 1,024 tokens). Every tool takes `session_id` (default "default"):
pages and cursors are kept per session id, as in the python server. Mistakes (an unknown
page or link, a bad cursor or line) come back as `is_error` text for the model.
"""

from __future__ import annotations

import argparse
import os
import textwrap
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlparse

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

from tools.corpus import MARKDOWN_LINK, Corpus, Document, Hit

DEFAULT_SESSION = "default"
INSTRUCTIONS = """Tool for browsing.
The `cursor` appears in brackets before each browsing display: `[{cursor}]`.
Cite information from the tool using the following format:
`【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.
Do not quote more than 10 words directly from the tool output."""


class BrowserError(Exception):
    """A mistake in a call, told to the model as the tool's output."""


@dataclass
class Page:
    url: str
    title: str
    lines: list[str]
    links: dict[int, str] = field(default_factory=dict)  # link id -> url
    link_locs: dict[int, int] = field(default_factory=dict)  # link id -> line to open at
    is_listing: bool = False  # search or find results


@dataclass
class BrowserState:
    pages: list[Page] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)

    def get(self, cursor: int = -1) -> Page:
        if not self.pages:
            raise BrowserError("No pages to access! Use `search` first, or `open` a url.")
        if cursor == -1:
            return self.pages[-1]
        if not 0 <= cursor < len(self.pages):
            raise BrowserError(f"Cursor `{cursor}` is out of range. "
                               f"Available cursor indices: [0 - {len(self.pages) - 1}].")
        return self.pages[cursor]


def wrap_lines(text: str, width: int = 80) -> list[str]:
    return [piece for line in text.split("\n")
            for piece in (textwrap.wrap(line, width, replace_whitespace=False, drop_whitespace=False) or [""])]


def _host(url: str) -> str:
    return urlparse(url).netloc


def document_page(document: Document, corpus: Corpus) -> Page:
    """A document with its markdown links turned into numbered `【id†text】` links."""
    links: dict[int, str] = {}

    def link(match) -> str:
        target = corpus.get(match.group(2))
        url = target.url if target else match.group(2)
        link_id = next((i for i, u in links.items() if u == url), len(links))
        links[link_id] = url
        host = _host(url)
        suffix = "" if host == _host(document.url) else f"†{host}"
        return f"【{link_id}†{match.group(1)}{suffix}】"

    return Page(document.url, document.title, wrap_lines(MARKDOWN_LINK.sub(link, document.text)), links)


def search_page(query: str, hits: list[Hit]) -> Page:
    lines = ["# Search Results", ""]
    for link_id, hit in enumerate(hits):
        host = _host(hit.document.url)
        suffix = f"†{host}" if host else ""
        lines += wrap_lines(f"  * 【{link_id}†{hit.document.title}{suffix}】 {hit.snippet}")
    if not hits:
        lines.append(f"No results for `{query}`.")
    return Page("", f"Search results for `{query}`", lines,
                {i: hit.document.url for i, hit in enumerate(hits)}, is_listing=True)


def find_page(pattern: str, page: Page, max_results: int = 50, show_lines: int = 4) -> Page:
    chunks: list[str] = []
    links, locs = {}, {}
    line_no = 0
    while line_no < len(page.lines) and len(chunks) < max_results:
        if pattern.lower() not in page.lines[line_no].lower():
            line_no += 1
            continue
        link_id = len(chunks)
        snippet = "\n".join(page.lines[line_no:line_no + show_lines])
        chunks.append(f"# 【{link_id}†match at L{line_no}】\n{snippet}")
        links[link_id], locs[link_id] = page.url, line_no
        line_no += show_lines
    text = "\n\n".join(chunks) or f"No `find` results for pattern: `{pattern}`"
    title = f"Find results for text: `{pattern}` in `{page.title}`"
    return Page(f"{page.url}/find?pattern={quote(pattern)}", title, wrap_lines(text), links, locs, is_listing=True)


def render(page: Page, cursor: int, loc: int, num_lines: int, view_chars: int) -> str:
    """gpt-oss's page display: `[cursor] title (url)`, a scrollbar, then numbered lines."""
    total = len(page.lines)
    if not 0 <= loc < total:
        raise BrowserError(f"Invalid location parameter: `{loc}`. Cannot exceed page maximum of {total - 1}.")
    end = min(loc + num_lines, total) if num_lines > 0 else _view_end(page.lines, loc, view_chars)
    body = "\n".join(f"L{i}: {line}" for i, line in enumerate(page.lines[loc:end], start=loc))
    header = f"{page.title} ({page.url})" if page.url else page.title
    return f"[{cursor}] {header}\n**viewing lines [{loc} - {end - 1}] of {total - 1}**\n\n{body}"


def _view_end(lines: list[str], loc: int, view_chars: int) -> int:
    used, end = 0, loc
    while end < len(lines) and (end == loc or used + len(lines[end]) + 8 <= view_chars):
        used += len(lines[end]) + 8  # "L123: " and the newline
        end += 1
    return end


class Browser:
    """The three browser actions over one corpus, with pages kept per session id."""

    def __init__(self, corpus: Corpus, view_chars: int = 4000, max_sessions: int = 256, idle_s: float = 3600.0):
        self.corpus, self.view_chars = corpus, view_chars
        self.max_sessions, self.idle_s = max_sessions, idle_s
        self._sessions: OrderedDict[str, BrowserState] = OrderedDict()

    def state(self, session_id: str) -> BrowserState:
        now = time.monotonic()
        for sid in [s for s, st in self._sessions.items() if now - st.last_used > self.idle_s]:
            del self._sessions[sid]
        state = self._sessions.pop(session_id, None) or BrowserState()
        state.last_used = now
        self._sessions[session_id] = state  # most recently used last
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return state

    def reset(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None

    def _show(self, state: BrowserState, page: Page, loc: int = 0, num_lines: int = -1) -> str:
        state.pages.append(page)
        try:
            return render(page, len(state.pages) - 1, loc, num_lines, self.view_chars)
        except BrowserError:
            state.pages.pop()
            raise

    def search(self, session_id: str, query: str, topn: int = 10) -> str:
        if not query.strip():
            raise BrowserError("Empty search query.")
        hits = self.corpus.search(query, max(1, min(topn, 50)))
        return self._show(self.state(session_id), search_page(query, hits))

    def open(self, session_id: str, id: int | str = -1, cursor: int = -1, loc: int = -1, num_lines: int = -1) -> str:
        state = self.state(session_id)
        if isinstance(id, str) and not id.strip().lstrip("-").isdigit():
            return self._show(state, self._document_page(id), max(loc, 0), num_lines)
        link_id, page = int(id), state.get(cursor)
        if link_id < 0:  # scroll the page at `cursor`
            return self._show(state, page, max(loc, 0), num_lines)
        if link_id not in page.links:
            shown = cursor if cursor >= 0 else len(state.pages) - 1
            raise BrowserError(f"Invalid link id `{link_id}`. The page at cursor {shown} "
                               f"has links {_id_range(page.links)}.")
        if loc < 0:
            line = page.link_locs.get(link_id, 0)
            loc = line - 4 if line > 4 else line
        return self._show(state, self._document_page(page.links[link_id]), loc, num_lines)

    def _document_page(self, key: str) -> Page:
        document = self.corpus.get(key)
        if document is None:
            raise BrowserError(f"Page not found: `{key}`. Open a link by its number on the current page, "
                               "or a url from the search results.")
        return document_page(document, self.corpus)

    def find(self, session_id: str, pattern: str, cursor: int = -1) -> str:
        state = self.state(session_id)
        page = state.get(cursor)
        if page.is_listing:
            raise BrowserError("Cannot run `find` on search results page or find results page")
        if not pattern:
            raise BrowserError("Empty find pattern.")
        return self._show(state, find_page(pattern, page))


def _id_range(links: dict[int, str]) -> str:
    return f"[0 - {max(links)}]" if links else "none"


def text_result(text: str, is_error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=is_error)


def build_server(browser: Browser) -> MCPServer:
    server = MCPServer("browser", instructions=INSTRUCTIONS)

    def call(action, *args) -> CallToolResult:
        try:
            return text_result(action(*args))
        except BrowserError as exc:
            return text_result(str(exc), is_error=True)

    @server.tool(name="search")
    def search(query: str, topn: int = 10, session_id: str = DEFAULT_SESSION) -> CallToolResult:
        """Search the corpus for `query`; returns a page of numbered result links."""
        return call(browser.search, session_id, query, topn)

    @server.tool(name="open")
    def open_(id: int | str = -1, cursor: int = -1, loc: int = -1, num_lines: int = -1,
              session_id: str = DEFAULT_SESSION) -> CallToolResult:
        """Open link `id` of the page at `cursor`, or a url/page id; `id=-1` scrolls to line `loc`."""
        return call(browser.open, session_id, id, cursor, loc, num_lines)

    @server.tool(name="find")
    def find(pattern: str, cursor: int = -1, session_id: str = DEFAULT_SESSION) -> CallToolResult:
        """Find `pattern` (case-insensitive) in the page at `cursor`."""
        return call(browser.find, session_id, pattern, cursor)

    @server.tool(name="reset")
    def reset(session_id: str = DEFAULT_SESSION) -> str:
        """Forget a session's pages and cursors."""
        if browser.reset(session_id):
            return f"Session {session_id!r} was reset."
        return f"Session {session_id!r} had no pages."

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.browser_server", description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", action="append", type=Path, metavar="DIR",
                        help="corpus directory (repeatable); default $BATCHRUN_CORPUS, else the shipped sample")
    parser.add_argument("--view-chars", type=int, default=4000, help="characters shown per page view")
    args = parser.parse_args(argv)
    directories = args.corpus or [Path(p) for p in os.environ.get("BATCHRUN_CORPUS", "").split(os.pathsep) if p]
    build_server(Browser(Corpus.from_directories(directories), view_chars=args.view_chars)).run("stdio")


if __name__ == "__main__":
    main()
