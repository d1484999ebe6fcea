"""gpt-oss-20b at full size on a CPU: load time, peak RSS and output tok/s of `batchrun submit` (issue #27).

    python scripts/full_size_cpu.py [--model DIR] [--max-output-tokens N] [--threads N]

Writes a random checkpoint in openai/gpt-oss-20b's published layout (`python -m engine.real_layout
DIR --shape 20b`, ~13 GB) unless DIR holds one, then decodes a handful of requests through
`batchrun submit` (plain text, a forced function call, a replayed function call and its output,
the python tool, a JSON schema) with the experts kept packed (`--moe-weights auto`). Prints one
table row for the README. A benchmark, not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                                           "unit": {"type": "string", "enum": ["c", "f"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}


def requests(max_output_tokens: int) -> list[dict]:
    """A handful of bodies covering what a user's batch holds: text, tools, a tool loop's second turn, JSON."""
    common = {"max_output_tokens": max_output_tokens, "reasoning": {"effort": "low"}}
    bodies = [
        {"input": "Write one sentence about the sea."},
        {"input": "What is the weather in Oslo?", "tools": [WEATHER],
         "tool_choice": {"type": "function", "name": "get_weather"}},
        {"input": [{"role": "user", "content": "Weather in Paris?"},
                   {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                    "arguments": json.dumps({"city": "Paris", "unit": "c"})},
                   {"type": "function_call_output", "call_id": "call_1", "output": json.dumps({"temp_c": 14})}],
         "tools": [WEATHER]},
        {"input": "Compute 2**20 with python.", "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
         "tool_choice": "required"},
        {"input": "Name a colour.", "text": {"format": {
            "type": "json_schema", "name": "colour", "strict": True,
            "schema": {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
                       "required": ["colour"], "additionalProperties": False}}}},
    ]
    return [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses", "body": {**common, **body}}
            for i, body in enumerate(bodies)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / ".cache" / "gpt-oss-20b-random")
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--db", type=Path, help="keep the run's database here (default: a temporary one)")
    parser.add_argument("--shape", default="20b", help="of engine.real_layout.SHAPES, for a checkpoint it writes")
    args = parser.parse_args()
    if not (args.model / "model.safetensors.index.json").is_file():
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "engine.real_layout", str(args.model), "--shape", args.shape],
                       check=True, cwd=REPO)
        print(f"wrote {args.model} in {time.monotonic() - started:.0f}s", flush=True)
    size_gb = sum(p.stat().st_size for p in args.model.glob("*.safetensors")) / 1e9
    with tempfile.TemporaryDirectory() as tmp:
        source, db = Path(tmp) / "requests.jsonl", args.db or Path(tmp) / "run.duckdb"
        source.write_text("".join(json.dumps(r) + "\n" for r in requests(args.max_output_tokens)))
        command = [sys.executable, "-m", "batch.cli", "submit", str(source), "--db", str(db), "--model",
                   str(args.model), "--device", "cpu", "--kernels", "torch", "--threads", str(args.threads)]
        started = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.monotonic() - started
        # the largest resident set of any child waited for: batchrun's own process (tool servers are smaller)
        peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 2**30
        output = done.stdout + done.stderr
        print(output)
        if done.returncode != 0:
            sys.exit(f"batchrun submit exited {done.returncode}")
        loaded = re.search(r"model loaded in ([\d.]+)s", output)
        tokens = re.search(r"tokens: (\d+) input, (\d+) output \(([\d.]+) output tok/s\) in ([\d.]+)s", output)
        statuses = re.search(r"requests this time \(([^)]*)\)", output)
        if not (loaded and tokens and statuses):
            sys.exit("could not read the load time, tokens or statuses from batchrun's output")
    print("| checkpoint on disk | load | peak RSS | input tok | output tok | output tok/s | run | statuses |")
    print("|---|---|---|---|---|---|---|---|")
    run_s = float(tokens[4])  # the summary's rate has one decimal: too coarse at this speed
    print(f"| {size_gb:.1f} GB | {float(loaded[1]):.0f} s | {peak_gb:.1f} GiB | {tokens[1]} | {tokens[2]} | "
          f"{int(tokens[2]) / run_s if run_s else 0.0:.3f} | {run_s:.0f} s (all {wall:.0f} s) | {statuses[1]} |")


if __name__ == "__main__":
    main()
