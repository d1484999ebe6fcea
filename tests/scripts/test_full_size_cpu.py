"""scripts/full_size_cpu.py at a tiny width: it writes the published layout, decodes through `batchrun
submit` with the experts packed, and prints the README's table row (the 20b run itself is a benchmark)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_full_size_script_runs_at_a_tiny_width(tmp_path):
    model = tmp_path / "real-tiny"
    done = subprocess.run([sys.executable, "scripts/full_size_cpu.py", "--model", str(model), "--shape", "tiny",
                           "--max-output-tokens", "8", "--threads", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (model / "model.safetensors.index.json").is_file() and (model / "original").is_dir()
    row = done.stdout.strip().splitlines()[-1]
    # disk, load, peak RSS, input, output, tok/s, run, statuses: every request ends as a row with a status
    match = re.fullmatch(r"\| [\d.]+ GB \| \d+ s \| [\d.]+ GiB \| (\d+) \| (\d+) \| [\d.]+ \| .* \| (.*) \|", row)
    assert match, row
    statuses = dict(reversed(part.split(" ", 1)) for part in match[3].split(", "))
    assert sum(map(int, statuses.values())) == 5 and int(match[2]) > 0
