"""A local document corpus with BM25 search in DuckDB, for the built-in browser tool.

A corpus is one or more directories of documents:
- `*.md`, `*.markdown`, `*.txt`: one page each; the id is the path relative to the
  directory without its suffix, the title the first line (a leading `#` stripped);
- `*.jsonl`: one page per line, `{"id", "title", "text", "url"}` (`text` required).
A page's url is its `url` field, else `corpus://<directory name>/<id>` (`corpus://sample/<id>`
for the sample shipped in data/corpus/). Markdown links `[text](url)` become browser links.

Search is Okapi BM25 (k1=1.2, b=0.75) in plain DuckDB SQL over a (doc, term, tf) table:
DuckDB's `fts` extension cannot be installed offline here (`INSTALL fts` downloads it),
and plain SQL ranks the same way without it. Terms are lowercased runs of letters and
digits, for documents and queries alike; a short list of stopwords is left out of queries.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data" / "corpus"
_TEXT_SUFFIXES = {".md", ".markdown", ".txt"}
_TERMS_SQL = r"regexp_extract_all(lower({}), '[\pL\pN]+')"
_K1, _B = 1.2, 0.75
# Query words too common to say anything (documents keep them: BM25's idf weighs the rest).
STOPWORDS = ("a", "an", "and", "are", "as", "at", "be", "by", "did", "does", "for", "from", "how", "in", "is", "it",
             "its", "of", "on", "or", "that", "the", "this", "to", "was", "what", "when", "where", "which", "who",
             "why", "with")
MARKDOWN_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Document:
    doc_id: str
    url: str
    title: str
    text: str


@dataclass(frozen=True)
class Hit:
    document: Document
    score: float
    snippet: str


def load_directory(directory: Path, name: str | None = None) -> list[Document]:
    """Every page in `directory` (recursively), in path order; malformed JSONL lines raise.

    `name` (default: the directory's name) is the host part of the pages' default urls.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"corpus directory not found: {directory}")
    name = name or directory.name
    documents = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).with_suffix("").as_posix()
        if path.suffix in _TEXT_SUFFIXES:
            documents.append(_text_document(name, relative, path.read_text(encoding="utf-8")))
        elif path.suffix == ".jsonl":
            documents += _jsonl_documents(name, relative, path)
    return documents


def _text_document(corpus_name: str, doc_id: str, text: str) -> Document:
    first_line = text.strip().splitlines()[0] if text.strip() else doc_id
    title = first_line.lstrip("#").strip()
    return Document(doc_id, f"corpus://{corpus_name}/{doc_id}", title, text.strip())


def _jsonl_documents(corpus_name: str, stem: str, path: Path) -> list[Document]:
    documents = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{path}:{line_no}: a page needs a string `text`")
        doc_id = str(record.get("id") or f"{stem}-{line_no}")
        url = record.get("url") or f"corpus://{corpus_name}/{doc_id}"
        documents.append(Document(doc_id, url, str(record.get("title") or doc_id), record["text"].strip()))
    return documents


class Corpus:
    """Documents indexed for BM25 in an in-memory DuckDB database."""

    def __init__(self, documents: list[Document]):
        self._by_key: dict[str, Document] = {}
        for document in documents:
            self._by_key.setdefault(document.url, document)
            self._by_key.setdefault(document.doc_id, document)
        self.documents = documents
        self._con = duckdb.connect()
        self._index(documents)

    @classmethod
    def from_directories(cls, directories: list[Path] | None = None) -> Corpus:
        """The given directories, or the shipped sample (urls `corpus://sample/<id>`) when none is given."""
        if not directories:
            return cls(load_directory(SAMPLE_DIR, "sample"))
        return cls([doc for directory in directories for doc in load_directory(directory)])

    def __len__(self) -> int:
        return len(self.documents)

    def _index(self, documents: list[Document]) -> None:
        # `bodies` is read by name in the SQL below (a DuckDB replacement scan).
        bodies = pa.table({"doc": list(range(len(documents))),  # noqa: F841
                          "body": [f"{d.title}\n{d.text}" for d in documents]})
        con = self._con
        con.sql(f"CREATE TABLE terms AS SELECT doc, term, count(*)::DOUBLE AS tf FROM "
                f"(SELECT doc, unnest({_TERMS_SQL.format('body')}) AS term FROM bodies) GROUP BY ALL")
        con.sql("CREATE TABLE doc_len AS SELECT doc, sum(tf) AS len FROM terms GROUP BY doc")
        con.sql("CREATE TABLE term_idf AS SELECT term, ln(1 + (n - df + 0.5) / (df + 0.5)) AS idf FROM "
                f"(SELECT term, count(*) AS df FROM terms GROUP BY term), (SELECT {len(documents)} AS n)")
        avgdl = con.sql("SELECT coalesce(avg(len), 1) FROM doc_len").fetchall()[0][0]
        self._avgdl = max(float(avgdl), 1.0)

    def search(self, query: str, topn: int = 10) -> list[Hit]:
        """The `topn` best documents for `query`, best first (ties by corpus order). Safe to
        call from several threads at once (the browser server runs tool calls in a pool)."""
        with self._con.cursor() as con:  # a DuckDB connection refuses a second concurrent query
            rows = con.execute(
                f"""WITH q AS (SELECT DISTINCT unnest({_TERMS_SQL.format('$query')}) AS term EXCEPT
                           SELECT unnest($stopwords))
                SELECT t.doc, sum(i.idf * t.tf * ({_K1} + 1)
                                  / (t.tf + {_K1} * (1 - {_B} + {_B} * l.len / $avgdl))) AS score
                FROM terms t JOIN q USING (term) JOIN term_idf i USING (term) JOIN doc_len l USING (doc)
                GROUP BY t.doc ORDER BY score DESC, t.doc LIMIT $topn""",
                {"query": query, "stopwords": list(STOPWORDS), "avgdl": self._avgdl, "topn": topn}).fetchall()
        terms = set(re.findall(r"\w+", query.lower()))
        return [Hit(self.documents[doc], score, _snippet(self.documents[doc], terms)) for doc, score in rows]

    def get(self, key: str) -> Document | None:
        """A document by url or id."""
        return self._by_key.get(key.strip())


def strip_links(text: str) -> str:
    """Markdown links reduced to their text."""
    return MARKDOWN_LINK.sub(lambda m: m.group(1), text)


def _snippet(document: Document, terms: set[str], max_chars: int = 200) -> str:
    """The paragraph (title and headings skipped) with the most query terms, shortened."""
    paragraphs = [strip_links(" ".join(p.split())) for p in re.split(r"\n\s*\n", document.text)]
    paragraphs = [p for p in paragraphs if p and not p.startswith("#") and p != document.title]
    if not paragraphs:
        return ""
    best = max(paragraphs, key=lambda p: len(terms & set(re.findall(r"\w+", p.lower()))))
    return best if len(best) <= max_chars else best[:max_chars].rsplit(" ", 1)[0] + " …"
