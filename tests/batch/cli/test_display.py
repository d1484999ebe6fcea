"""What the CLI prints: `batchrun show`'s items, the run summary, the progress bar."""

from batch.cli.display import progress_bar
from batch.cli.show_text import _item_text
from batch.run.runner import ProgressSnapshot


def test_item_text_names_what_each_item_did():
    assert _item_text({"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}) == "Hi"
    assert _item_text({"type": "mcp_list_tools", "server_label": "calc",
                       "tools": [{"name": "add"}, {"name": "sub"}]}) == "calc: add, sub"
    assert _item_text({"type": "mcp_list_tools", "server_label": "calc", "tools": [],
                       "error": "unreachable"}) == "calc: no tools (error: unreachable)"
    assert _item_text({"type": "mcp_call", "name": "add", "arguments": "{}"}) == "add({})"


def test_the_run_summary_says_why_lines_failed_one_line_per_kind():
    from collections import Counter

    from batch.cli.display import summary_text
    from batch.run.runner import RunSummary, failure_kind

    assert failure_kind("prompt has 20003 tokens, context 304") == failure_kind("prompt has 9 tokens, context 1")
    summary = RunSummary("r1", False, Counter(failed=3), 0, 0, 0, 1.0, Counter(),
                         failed_reasons=Counter({"prompt has 20003 tokens": 2, "internal error: boom": 1}))
    lines = summary_text(summary, "x.duckdb").splitlines()
    assert "  failed x2, the first: prompt has 20003 tokens" in lines
    assert "  failed x1: internal error: boom" in lines


def test_counts_take_the_number_of_their_noun():
    from batch.cli.display import plural, worker_lines

    assert (plural(0, "line"), plural(1, "line"), plural(2, "line")) == ("0 lines", "1 line", "2 lines")
    row = {"worker": "shard-1/2", "n_requests": 1, "n_output_tokens": 1, "output_tokens_per_s": 2.0, "busy_s": 0.5}
    assert worker_lines([row]) == ["  shard-1/2: 1 request, 1 output token, 2.0 output tok/s over 0.5s busy"]


def test_the_finished_bar_says_done_with_the_final_counts(capsys):
    # The bar redraws at most every REFRESH_S: without a last redraw it closed on whatever it showed
    # then ("starting tool servers", 8 tokens) while the run had finished with more.
    with progress_bar() as update:
        update(ProgressSnapshot(0, 2, 0, 8, "starting tool servers", 0, 0))
        update(ProgressSnapshot(2, 2, 0, 16, "decoding", 1, 0))  # within REFRESH_S of the first
    final = capsys.readouterr().err.split("\r")[-1]
    assert final.startswith("done: 100%"), final
    assert "tokens=16" in final and "failed=1" in final, final
