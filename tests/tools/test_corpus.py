"""tools/corpus.py: the search index under concurrent use."""

from concurrent.futures import ThreadPoolExecutor

from tools.corpus import Corpus


def test_concurrent_searches_on_one_corpus():
    # The browser server runs tool calls in worker threads: one corpus serves them at once.
    corpus = Corpus.from_directories()
    queries = ["eiffel tower", "black hole", "france country", "apollo 11 moon landing"] * 25
    expected = {q: [h.document.doc_id for h in corpus.search(q, 3)] for q in set(queries)}
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda q: [h.document.doc_id for h in corpus.search(q, 3)], queries))
    assert results == [expected[q] for q in queries]
