"""Held-out evaluation of a checkpoint through `batchrun submit`, not by calling the model.

    python -m trainer.evaluate [--model data/models/batchrun-tiny] [--n 240] [--seed 7] [--sets ...]

Three sets of tasks training never sees, each written to a JSONL file and run through
`batchrun submit` greedily with the built-in python and browser tools:

- `values`: `n` generated tasks from a seed training never uses, in the training
  phrasings (fresh values, familiar wording);
- `templates`: `n` tasks in the held-out phrasings (trainer/tasks.py `Phrasings.held_out`):
  wording the model has never seen, so template memorisation cannot pass them;
- `long`: 40 "Multiply 9953*424 using the code_interpreter tool." tasks with 4-7 digit
  times 3-6 digit operands (6 to 13-digit products to copy from the tool's output).

For each set it reads the DuckDB file and prints, per family and overall: correct final
answers (the expected answer in the response's message text; a JSON answer under
`text.format` parsed and equal to the expected object; for function calls, the exact
call), well-formed harmony (the response completed: no parse failure, no budget overrun),
and tool calls (every call made goes to the expected tool with well-formed arguments: a
JSON object for JSON tools, the expected code for python).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast
import argparse
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from batch.store.store import Store
from evals.grading import run_outputs
from evals.output import Output
from trainer.tasks import Task, generate, long_product_tasks

HELD_OUT_SEED = 7  # training uses the seed it is given (0 by default) and seed + 1,000,003 / + 2,000,003
SETS = ("values", "templates", "long")
LONG_TASKS = 40
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "data" / "models" / "batchrun-tiny"


def write_requests(tasks: list[Task], path: Path) -> None:
    with path.open("w") as f:
        for task in tasks:
            f.write(json.dumps({"custom_id": task.custom_id, **task.body}) + "\n")


def submit(requests: Path, db: Path, model: Path, run_id: str, extra: Sequence[str] = ()) -> None:
    command = [sys.executable, "-m", "batch.cli", "submit", str(requests), "--db", str(db), "--model", str(model),
               "--run-id", run_id, "--temperature", "0", "--max-output-tokens", "400", "--quiet", *extra]
    subprocess.run(command, check=True)


def _recipient(tool_type: str | None, name: str | None) -> str:
    """The harmony recipient of a stored hosted call (the tasks' tools: python, browser)."""
    if name == "python":
        return "python"
    return f"browser.{name}" if tool_type in ("web_search", "mcp") else str(name)


def _call_ok(recipient: str, arguments: str, expected: tuple[str, object] | None) -> tuple[bool, bool]:
    """(well-formed for the right tool, exactly the expected arguments)."""
    if expected is None or recipient != expected[0]:
        return False, False
    if recipient == "python":
        return bool(arguments.strip()), arguments.strip() == expected[1]
    try:
        value = json.loads(arguments)
    except ValueError:
        return False, False
    return isinstance(value, dict), value == expected[1]


def grade(tasks: list[Task], db: Path, run_id: str) -> list[dict]:
    """One row per task: family, correct, harmony_ok, calls made, calls right."""
    with Store(db, read_only=True) as store:
        outputs = run_outputs(store, run_id, {t.custom_id for t in tasks})
        hosted = defaultdict(list)
        for call in store.reports.list_tool_calls(run_id):
            hosted[call["custom_id"]].append((_recipient(call["tool_type"], call["name"]),
                                              call["arguments"] or ""))
    rows = []
    for task in tasks:
        output = outputs.get(task.custom_id)
        calls = list(hosted[task.custom_id])
        calls += [(f"functions.{i['name']}", i.get("arguments") or "") for i in (output.items if output else [])
                  if i.get("type") == "function_call"]
        checks = [_call_ok(r, a, task.calls[k] if k < len(task.calls) else None) for k, (r, a) in enumerate(calls)]
        exact_calls = len(calls) == len(task.calls) and all(exact for _, exact in checks)
        harmony_ok = output is not None and output.status == "completed"
        correct = harmony_ok and exact_calls and _answer_ok(task, cast(Output, output).text)
        rows.append({"custom_id": task.custom_id, "family": task.family, "correct": correct,
                     "harmony_ok": harmony_ok, "num_calls": len(calls),
                     "num_calls_ok": sum(ok for ok, _ in checks), "text": output.text if output else None})
    return rows


def _answer_ok(task: Task, text: str) -> bool:
    """The expected answer in the text; under a JSON text.format, the parsed text equals it."""
    if not task.answer:
        return not text
    if task.body.get("text", {}).get("format", {}).get("type") in ("json_schema", "json_object"):
        try:
            return json.loads(text) == json.loads(task.answer)
        except ValueError:
            return False
    return task.answer in text


def set_tasks(name: str, n: int, seed: int) -> list[Task]:
    """The tasks of one evaluation set (see the module docstring)."""
    if name == "values":
        return generate(seed, n, prefix="heldout")
    if name == "templates":
        return generate(seed + 1, n, prefix="phrasing", split="held_out")
    if name == "long":
        return long_product_tasks(seed + 2, LONG_TASKS)
    raise ValueError(f"unknown evaluation set {name!r}; expected one of {SETS}")


def summary(rows: list[dict]) -> str:
    lines = [f"{'family':<16} {'n':>4} {'correct':>8} {'harmony':>8} {'tool calls ok':>14}"]
    groups = defaultdict(list)
    for row in rows:
        groups[row["family"]].append(row)
    for family, group in sorted(groups.items()) + [("all", rows)]:
        calls = sum(r["num_calls"] for r in group)
        calls_ok = sum(r["num_calls_ok"] for r in group)
        lines.append(f"{family:<16} {len(group):>4} {_pct(sum(r['correct'] for r in group), len(group)):>8} "
                     f"{_pct(sum(r['harmony_ok'] for r in group), len(group)):>8} "
                     f"{f'{calls_ok}/{calls}':>14}")
    return "\n".join(lines)


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f}%" if n else "-"


def evaluate(model: Path, n: int = 240, seed: int = HELD_OUT_SEED, workdir: Path | None = None,
             name: str = "values") -> list[dict]:
    """Run one evaluation set through `batchrun submit` on `model`; its graded rows."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="batchrun-eval-"))
    workdir.mkdir(parents=True, exist_ok=True)
    tasks = set_tasks(name, n, seed)
    requests, db = workdir / f"{name}.jsonl", workdir / f"{name}.duckdb"
    write_requests(tasks, requests)
    db.unlink(missing_ok=True)
    submit(requests, db, model, name)
    return grade(tasks, db, name)


TITLES = {"values": "fresh values, training phrasings", "templates": "held-out phrasings (never trained on)",
          "long": f"long products ({LONG_TASKS} tasks, 6-13 digit results)"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=240, help="tasks in each of the values and templates sets")
    parser.add_argument("--seed", type=int, default=HELD_OUT_SEED)
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--workdir", type=Path, help="where the JSONL and DuckDB files go (default: a temp dir)")
    parser.add_argument("--show-failures", action="store_true")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.sets.split(",") if name.strip()]
    unknown = [name for name in names if name not in SETS]
    if unknown:
        parser.error(f"--sets: unknown set {unknown[0]!r}; expected some of {', '.join(SETS)}")
    for name in names:
        rows = evaluate(args.model, args.n, args.seed, args.workdir, name)
        print(f"## {name}: {TITLES[name]}")
        if args.show_failures:
            for row in rows:
                if not row["correct"]:
                    print(f"FAIL {row['custom_id']}: {row['text']!r}")
        print(summary(rows))


if __name__ == "__main__":
    main()
