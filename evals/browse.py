"""The browsable part of `batchrun report`: pass rates with their intervals, the case table and
the transcripts (one run, or two side by side), as HTML with the data and a small script inline.

No network and no external file: the page opens from disk. The script (browse_page.js) builds
the table one page at a time and a transcript only when it is opened.
"""

from __future__ import annotations

from html import escape
from importlib import resources

from evals.browse_data import script_json

CSS = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #222; font-size: 14px; }
h1 { font-size: 20px; margin: 4px 0 12px; } h2 { font-size: 16px; margin: 20px 0 8px; }
h3 { font-size: 15px; margin: 6px 0; } h4 { font-size: 13px; margin: 14px 0 4px; color: #444; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #d6d6d6; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.top, .run-col { display: flex; flex-wrap: wrap; gap: 12px 24px; align-items: flex-start; }
.runs { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 16px 32px; }
#paired { font-size: 16px; padding: 6px 10px; background: #f6f8fa; border-left: 4px solid #4a7bd0; }
.headline { font-size: 15px; font-weight: 600; margin: 4px 0 8px; max-width: 640px; }
.muted { color: #777; font-size: 12px; }
#case-table { width: 100%; } #case-head th { cursor: pointer; user-select: none; white-space: nowrap; }
.case-row { cursor: pointer; } .case-row:hover { background: #eef5ff; } .case-row.open { background: #dceaff; }
.filters { display: flex; gap: 8px; align-items: center; margin: 6px 0; }
.filters input { width: 220px; padding: 3px 6px; }
.st-completed, .v-pass { color: #1a7f37; } .st-incomplete, .v-partial { color: #9a6700; }
.st-failed, .st-invalid, .v-fail { color: #cf222e; } .v-ungraded { color: #777; }
.ch { padding: 0 5px; border-radius: 3px; font-size: 12px; }
.ch-regression, .ch-missing { background: #ffd7d5; } .ch-improvement, .ch-new { background: #d3f5dc; }
.ch-changed { background: #fff1c2; } .ch-same { background: #eee; }
.arrow { color: #999; } .flip { outline: 2px solid #d4a72c; padding: 0 3px; }
.side-by-side { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.transcript { border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; min-width: 0; }
.msg { border-left: 3px solid #ccc; margin: 4px 0; padding: 2px 8px; }
.msg .role { font-size: 11px; text-transform: uppercase; color: #666; }
.msg-user { border-color: #4a7bd0; } .msg-instructions { border-color: #888; }
.out-reasoning { border-color: #b9a5e8; background: #faf8ff; } .out-message { border-color: #1a7f37; }
pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0; font-size: 12px; max-height: 320px;
      overflow: auto; }
.differs { color: #9a6700; } .differs-box { outline: 2px solid #f0c75e; }
.error { color: #cf222e; } .expl { font-size: 12px; }
.epochs a { margin-right: 8px; } .epochs a.on { font-weight: bold; text-decoration: none; color: #222; }
details.plots summary, details summary { cursor: pointer; }
.plots-grid { display: flex; flex-wrap: wrap; gap: 12px; }
"""


def _ci(row: dict) -> str:
    return "–" if row.get("ci_low") is None else f"{row['ci_low']:.1%}–{row['ci_high']:.1%}"


def headline_html(run: dict) -> str:
    """A run's headline (view pass_rate_per_run): cases that passed every grader, with epochs the mean."""
    row = run["headline"]
    if row is None:
        return f'<p class="headline">{escape(run["run_id"])}: no grades</p>'
    epochs = f", mean over {row['n_epochs']} epochs" if row["n_epochs"] > 1 else ""
    return (f'<p class="headline">{escape(run["run_id"])}: {row["pass_rate"]:.1%} of {row["n_requests"]} cases '
            f'passed every grader (95% CI {_ci(row)}, {escape(row["ci_method"])}{epochs})</p>')


def rates_html(run: dict) -> str:
    """Pass rates per grader and per tag with n and the 95% interval (views pass_rate_per_*)."""
    if run["headline"] is None:
        return headline_html(run)
    graders = "".join(f"<tr><td>{escape(r['grader'])}</td><td>{r['n_graded']}</td><td>{r['pass_rate']:.1%}</td>"
                      f"<td>{_ci(r)}</td></tr>" for r in run["graders"])
    tags = "".join(f"<tr><td>{escape(r['tag'])}</td><td>{r['n_requests']}</td><td>{r['pass_rate']:.1%}</td>"
                   f"<td>{_ci(r)}</td></tr>" for r in run["tags"])
    return (headline_html(run) + '<div class="top">'
            f"<table><tr><th>grader</th><th>n</th><th>pass rate</th><th>95% CI</th></tr>{graders}</table>"
            f"<table><tr><th>tag</th><th>n</th><th>pass rate</th><th>95% CI</th></tr>{tags}</table></div>")


def paired_html(paired: dict | None) -> str:
    """B minus A over the cases both graded (view paired_differences), in words."""
    if paired is None:
        return '<p class="headline">B − A: the runs share no graded case</p>'
    significant = paired["p_value"] < 0.05
    word = ("significant " + ("regression" if paired["difference"] < 0 else "improvement")) if significant \
        else "no significant difference (within noise)"
    return (f'<p class="headline" id="paired">B − A pass rate: {paired["difference"]:+.1%} '
            f'(95% CI {paired["ci_low"]:+.1%} to {paired["ci_high"]:+.1%}, n={paired["n"]} paired, '
            f'{escape(paired["method"])}, p = {paired["p_value"]:.3g}): {word}</p>')


def cases_html(payload: dict) -> str:
    """The case table's frame, the transcript box and the script with its data."""
    script = resources.files("evals").joinpath("browse_page.js").read_text(encoding="utf-8")
    return ('<section id="cases"><h2>Cases</h2><div class="filters">'
            '<input id="f-q" type="search" placeholder="filter by case id">'
            '<select id="f-status"></select><select id="f-verdict"></select>'
            '<button id="prev">‹ prev</button><span id="pager-text"></span><button id="next">next ›</button></div>'
            '<table id="case-table"><thead id="case-head"></thead><tbody id="case-body"></tbody></table></section>'
            '<section id="detail"></section>'
            f'<script type="application/json" id="report-data">{script_json(payload)}</script>'
            f"<script>{script}</script>")


def page(title: str, top: str, payload: dict, plots: str, footer: str) -> str:
    """The whole report page."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1>{top}{cases_html(payload)}"
            '<details class="plots"><summary><h2 style="display:inline">Plots and timings</h2></summary>'
            f"{plots}</details>"
            f'<p class="muted">{footer}</p></body></html>\n')
