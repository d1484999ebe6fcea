"""The browser tool server through real MCP clients: in-process, and one over stdio."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from tools.browser_server import Browser, build_server
from tools.corpus import Corpus, Document, load_directory

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus():
    return Corpus.from_directories()


@pytest.fixture
def server(corpus):
    return build_server(Browser(corpus))


async def calls(server, *steps: tuple[str, dict]) -> list[tuple[bool, str]]:
    """Run tool calls in order on one client; (is_error, text) for each."""
    async with Client(server) as client:
        results = [await client.call_tool(name, args) for name, args in steps]
    return [(r.is_error, r.content[0].text) for r in results]


def link_id(page: str, title: str) -> int:
    return int(re.search(rf"【(\d+)†{re.escape(title)}[†】]", page).group(1))


async def test_search_finds_the_page(server):
    [(is_error, page)] = await calls(server, ("search", {"query": "Paris"}))
    assert not is_error
    assert page.startswith("[0] Search results for `Paris`\n**viewing lines [0 - ")
    assert "L2:   * 【0†Paris†sample】 Paris is the capital of France" in page
    [(_, page)] = await calls(server, ("search", {"query": "highest mountain on Earth", "topn": 1}))
    assert "【0†Mount Everest†sample】" in page and "【1†" not in page


async def test_open_a_result_shows_numbered_lines(server):
    async with Client(server) as client:
        results = (await client.call_tool("search", {"query": "capital of France"})).content[0].text
        opened = await client.call_tool("open", {"id": link_id(results, "Paris")})
    is_error, page = opened.is_error, opened.content[0].text
    assert not is_error and page.startswith("[1] Paris (corpus://sample/paris)\n**viewing lines [0 - 25] of 25**\n\n")
    lines = page.split("\n\n", 1)[1].splitlines()
    assert all(line.startswith(f"L{i}: ") for i, line in enumerate(lines))


async def test_open_by_url_scroll_and_follow_a_link(server):
    (_, paris), (_, scrolled), (_, tower) = await calls(
        server, ("open", {"id": "corpus://sample/paris"}),
        ("open", {"id": -1, "loc": 2, "num_lines": 2}),
        ("open", {"id": 0, "cursor": 0}))
    assert paris.startswith("[0] Paris (corpus://sample/paris)\n")
    assert "L2: Paris is the capital of France and its largest city." in paris
    assert "【0†Eiffel Tower】" in paris
    assert scrolled.startswith("[1] Paris (corpus://sample/paris)\n**viewing lines [2 - 3] of ")
    assert scrolled.split("\n\n", 1)[1].splitlines()[0].startswith("L2: Paris is the capital")
    assert tower.startswith("[2] Eiffel Tower (corpus://sample/eiffel_tower)\n")


async def test_find_locates_a_pattern_and_its_links_jump_there(server):
    (_, _), (is_error, found), (_, jumped), (_, missing) = await calls(
        server, ("open", {"id": "eiffel_tower"}), ("find", {"pattern": "CHRYSLER"}),
        ("open", {"id": 0}), ("find", {"pattern": "zebra", "cursor": 0}))
    assert not is_error
    assert found.startswith("[1] Find results for text: `CHRYSLER` in `Eiffel Tower`")
    line = int(re.search(r"【0†match at L(\d+)】", found).group(1))
    assert "Chrysler" in found
    assert f"L{line - 4}: " in jumped.split("\n\n", 1)[1].splitlines()[0]
    assert "No `find` results for pattern: `zebra`" in missing


async def test_mistakes_are_errors_the_model_can_read(server):
    results = await calls(
        server, ("open", {"id": 0}), ("open", {"id": "no-such-page"}), ("search", {"query": "Nile river"}),
        ("open", {"id": 42}), ("open", {"id": 0, "cursor": 7}), ("find", {"pattern": "Nile"}),
        ("open", {"id": -1, "loc": 10_000}), ("search", {"query": "  "}))
    assert all(is_error for is_error, _ in results[:2] + results[3:])
    texts = [text for _, text in results]
    assert texts[0] == "No pages to access! Use `search` first, or `open` a url."
    assert texts[1].startswith("Page not found: `no-such-page`.")
    assert texts[3].startswith("Invalid link id `42`.")
    assert texts[4] == "Cursor `7` is out of range. Available cursor indices: [0 - 0]."
    assert texts[5] == "Cannot run `find` on search results page or find results page"
    assert texts[6].startswith("Invalid location parameter: `10000`.")
    assert texts[7] == "Empty search query."


async def test_pages_are_kept_per_session(server):
    (_, first), (other_error, other), (_, again) = await calls(
        server, ("search", {"query": "jazz", "session_id": "a"}), ("open", {"id": 0, "session_id": "b"}),
        ("open", {"id": 0, "session_id": "a"}))
    assert first.startswith("[0] ") and again.startswith("[1] Jazz")
    assert other_error and other.startswith("No pages to access!")
    [(_, reset), (error_after, _)] = await calls(server, ("reset", {"session_id": "a"}),
                                                 ("open", {"id": -1, "session_id": "a"}))
    assert reset == "Session 'a' was reset." and error_after


async def test_long_pages_are_shown_a_window_at_a_time(tmp_path):
    (tmp_path / "long.md").write_text("# Long\n" + "\n".join(f"line number {i}" for i in range(500)))
    [(_, page)] = await calls(build_server(Browser(Corpus.from_directories([tmp_path]), view_chars=400)),
                              ("open", {"id": "long"}))
    start, end, last = map(int, re.search(r"viewing lines \[(\d+) - (\d+)\] of (\d+)", page).groups())
    assert (start, last) == (0, 500) and 5 < end < 30


def test_user_corpus_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("Quokkas\n\nQuokkas live on Rottnest Island.\n")
    (tmp_path / "more.jsonl").write_text(json.dumps({"id": "q2", "title": "Wombats", "text": "Wombats dig.",
                                                     "url": "https://example.org/wombats"}) + "\n")
    corpus = Corpus.from_directories([tmp_path])
    assert [d.doc_id for d in corpus.documents] == ["q2", "notes"]
    assert corpus.get("https://example.org/wombats").title == "Wombats"
    assert corpus.get(f"corpus://{tmp_path.name}/notes").title == "Quokkas"
    assert corpus.search("rottnest")[0].snippet == "Quokkas live on Rottnest Island."
    (tmp_path / "bad.jsonl").write_text('{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a page needs a string `text`"):
        load_directory(tmp_path)


def test_bm25_scores_match_the_formula():
    texts = ["red fox jumps", "red red car", "blue sky", "fox den fox fox"]
    corpus = Corpus([Document(str(i), f"corpus://t/{i}", f"t{i}", text) for i, text in enumerate(texts)])
    docs = [f"t{i}\n{text}".split() for i, text in enumerate(texts)]  # titles are indexed too
    avgdl = sum(map(len, docs)) / len(docs)

    def bm25(query: list[str], doc: list[str]) -> float:
        score = 0.0
        for term in query:
            df = sum(term in d for d in docs)
            tf = doc.count(term)
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(doc) / avgdl)) if tf else 0.0
        return score

    hits = corpus.search("Red FOX", topn=10)
    expected = sorted(((bm25(["red", "fox"], d), str(i)) for i, d in enumerate(docs) if bm25(["red", "fox"], d)),
                      key=lambda pair: -pair[0])
    assert [h.document.doc_id for h in hits] == [doc_id for _, doc_id in expected]
    assert [h.score for h in hits] == pytest.approx([score for score, _ in expected])


async def test_over_stdio_in_its_own_process(tmp_path):
    (tmp_path / "own.md").write_text("# Own page\n\nThe answer is forty-two.\n")
    params = StdioServerParameters(command=sys.executable, args=["-m", "tools.browser_server"], cwd=str(REPO),
                                   env={**os.environ, "BATCHRUN_CORPUS": str(tmp_path)})
    async with Client(params) as client:
        assert {t.name for t in (await client.list_tools()).tools} == {"search", "open", "find", "reset"}
        found = await client.call_tool("search", {"query": "answer"})
        opened = await client.call_tool("open", {"id": 0})
    assert f"【0†Own page†{tmp_path.name}】 The answer is forty-two." in found.content[0].text
    assert "L2: The answer is forty-two." in opened.content[0].text
