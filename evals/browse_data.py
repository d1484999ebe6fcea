"""The data the browsable report embeds: cases and transcripts of one run, or of two side by side.

Every number comes from a view (case_summary, sample_summary, event_runs, pass_rate_per_*,
paired_differences) through the store; this module only shapes rows for the page's script.
Long texts are cut at MAX_TEXT characters so one runaway output cannot make the file unusable.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from batch.responses.standard_json import dumps_nulling_non_finite
from batch.store.store import Store
from evals.stats import paired_difference

MAX_TEXT = 20_000
CASE_KEYS = ("status", "pass_mean", "n_grades", "n_passed", "score", "input_tokens", "output_tokens",
             "reasoning_tokens", "num_turns", "latency_s", "ttft_s", "n_tool_calls", "n_tool_errors", "n_epochs")


def cut(text: Any) -> Any:
    """A string cut at MAX_TEXT characters (with a note); anything else as is."""
    if isinstance(text, str) and len(text) > MAX_TEXT:
        return text[:MAX_TEXT] + f"\n... [{len(text) - MAX_TEXT:,} more characters in the database]"
    return text


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else json.dumps(content)


def input_messages(body: dict | None) -> list[dict]:
    """The request's instructions and input as [{role, text}] (other input items as JSON)."""
    if not isinstance(body, dict):
        return []
    messages = [{"role": "instructions", "text": cut(body["instructions"])}] if body.get("instructions") else []
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "text": cut(given)}]
    for item in given if isinstance(given, list) else []:
        if isinstance(item, dict) and "content" in item:
            messages.append({"role": str(item.get("role", item.get("type", "item"))),
                             "text": cut(_content_text(item["content"]))})
        else:
            messages.append({"role": "item", "text": cut(json.dumps(item))})
    return messages


def output_items(response: dict | None) -> list[dict]:
    """The response's output items as [{kind, text, name?}]: reasoning and message texts, and each
    tool call item (its name, arguments and output)."""
    items = []
    for item in (response or {}).get("output") or []:
        kind = item.get("type", "item")
        if kind in ("reasoning", "message"):
            items.append({"kind": kind, "text": cut(_content_text(item.get("content")))})
            continue
        name = item.get("name") or kind
        if item.get("server_label"):
            name = f"{item['server_label']}.{name}"
        # Ids differ in every run: left out, so two runs' outputs differ only where the model did.
        detail = {k: v for k, v in item.items() if k not in ("id", "call_id", "type", "name", "server_label")}
        items.append({"kind": kind, "name": name, "text": cut(json.dumps(detail, indent=1))})
    return items


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _sample(row: dict, event_types: dict[str, int]) -> dict:
    # Events as [sequence_number, type (an index into the run's event_types), count, turn, first ms,
    # last ms]: a 10,000-case page stays a few bytes per folded run of events.
    events = [[e["sequence_number"], event_types.setdefault(e["type"], len(event_types)), e["n_events"], e["turn"],
               _ms(e["first_ms"]), _ms(e["last_ms"])] for e in row["events"]]
    calls = [{**call, "arguments": cut(call["arguments"]), "output": cut(call["output"])} for call in row["tool_calls"]]
    keys = ("epoch", "status", "error", "response_id", "input_tokens", "cached_tokens", "output_tokens",
            "reasoning_tokens", "num_turns", "latency_s", "ttft_s", "passed")
    return {**{key: row[key] for key in keys}, "input": input_messages(row["body"]),
            "output": output_items(row["response"]), "tool_calls": calls, "turns": row["turns"],
            "events": events, "grades": row["grades"]}


def run_part(store: Store, run_id: str) -> dict:
    """One run's part of the page: its cases (case_summary) and their samples' transcripts, the
    headline (pass_rate_per_run) and the per-grader and per-tag rates with intervals."""
    samples = store.transcripts.samples(run_id)
    event_types: dict[str, int] = {}
    shaped = {custom_id: [_sample(row, event_types) for row in rows] for custom_id, rows in samples.items()}
    return {"run_id": run_id,
            "headline": store.reports.pass_rate_per_run(run_id),
            "graders": store.reports.pass_rates_per_grader(run_id),
            "tags": store.reports.pass_rates_per_tag(run_id),
            "cases": {row["custom_id"]: {key: row[key] for key in ("line_no", *CASE_KEYS)}
                      for row in store.transcripts.cases(run_id)},
            "samples": shaped, "event_types": list(event_types)}


def change_kind(a: dict | None, b: dict | None, samples_a: list[dict], samples_b: list[dict]) -> str:
    """How a case changed from A to B: regression or improvement (its pass share over epochs; without
    grades, its status), missing (only in A), new (only in B), changed (other status or output), same."""
    if b is None:
        return "missing"
    if a is None:
        return "new"
    if a["pass_mean"] is not None and b["pass_mean"] is not None and a["pass_mean"] != b["pass_mean"]:
        return "regression" if b["pass_mean"] < a["pass_mean"] else "improvement"
    if a["pass_mean"] is None and a["status"] != b["status"] and "completed" in (a["status"], b["status"]):
        return "regression" if a["status"] == "completed" else "improvement"
    texts = [[item["text"] for s in side for item in s["output"]] for side in (samples_a, samples_b)]
    return "changed" if a["status"] != b["status"] or texts[0] != texts[1] else "same"


def paired_from_samples(part_a: dict, part_b: dict) -> dict | None:
    """The paired_differences row for two runs in two files (no one query sees both): the same test
    (evals/stats.py) over each case's graded epochs."""
    def outcomes(part: dict) -> dict[str, Sequence[bool]]:
        return {custom_id: [s["passed"] for s in samples if s["passed"] is not None]
                for custom_id, samples in part["samples"].items()}

    a, b = outcomes(part_a), outcomes(part_b)
    difference = paired_difference(a, b)
    if not difference.n:
        return None
    epochs = max(len(v) for v in [*a.values(), *b.values()])
    return {"n": difference.n, "n_epochs": epochs, "difference": difference.difference,
            "a_only": difference.a_only, "b_only": difference.b_only, "ci_low": difference.low,
            "ci_high": difference.high, "p_value": difference.p_value, "method": difference.method}


def browse_payload(store: Store, run_a: str, run_b: str | None = None, store_b: Store | None = None) -> dict:
    """Everything the page's script shows: one run, or two runs paired by custom_id with each case's
    change kind and the paired difference (view paired_differences; run B from ``store_b`` when it
    lives in another file, and then the difference from evals/stats.py)."""
    parts = [run_part(store, run_a)] + ([run_part(store_b or store, run_b)] if run_b else [])
    order = list(parts[0]["cases"]) + ([c for c in parts[1]["cases"] if c not in parts[0]["cases"]] if run_b else [])
    cases = []
    for custom_id in order:
        entry: dict[str, Any] = {"id": custom_id}
        for label, part in zip("ab", parts):
            entry[label] = part["cases"].get(custom_id)
        if run_b:
            entry["change"] = change_kind(entry["a"], entry["b"], parts[0]["samples"].get(custom_id, []),
                                          parts[1]["samples"].get(custom_id, []))
        cases.append(entry)
    return {"mode": "compare" if run_b else "run", "cases": cases,
            "runs": [{k: v for k, v in part.items() if k != "cases"} for part in parts],
            "paired": None if not run_b else paired_from_samples(*parts) if store_b not in (None, store)
            else store.reports.paired_difference(run_a, run_b)}


def script_json(payload: dict) -> str:
    """The payload as JSON safe inside a <script> element (no "</" can end it early), standard JSON for the
    page's JSON.parse: a NaN or Infinity (in a database an older batchrun wrote) is null, not a blank page."""
    text, _ = dumps_nulling_non_finite(payload, separators=(",", ":"), default=str)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")
