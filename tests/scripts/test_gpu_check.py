"""scripts/gpu_check.sh: the GPU check's steps, timeouts and log, run here as its CPU dry run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = ["env", "imports", "memory_plan", "gpu_tests", "bench_sharegpt", "decode_120b", "bench_random", "profile",
         "moe_tiles", "routing", "sampler", "attention_parts", "moe_dense", "deterministic", "fp8_kv", "vllm_settings",
         "proxies"]


def gpu_check(out: Path, python: str = sys.executable, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    environment = {**os.environ, "GPU_CHECK_DRY_RUN": "1", "PYTHON": python, **env}
    done = subprocess.run(["bash", str(SCRIPT), str(out)], env=environment, capture_output=True, text=True,
                          timeout=1800)
    return done, (out / "gpu_check.log").read_text()


def summary(log: str) -> dict[str, str]:
    """Step name -> PASS, FAIL(rc), TIMEOUT or SKIPPED, from the log's last lines."""
    lines = log.split("=== summary:")[1].splitlines()[1:]
    return {line.split()[1]: line.split()[0] for line in lines if not line.startswith("to run the skipped steps")}


def test_the_packages_the_gpu_image_lacks_cannot_be_imported_under_the_check():
    code = "import importlib.util; print(importlib.util.find_spec('openai_harmony')); import duckdb"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "scripts" / "engine_only")})
    assert done.stdout.strip() == "None"  # what transformers' availability checks see
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr


def test_the_gpu_tests_collect_without_the_packages_the_gpu_image_lacks():
    # the check's gpu_tests step: the test tree's conftest hooks must not import the runner (llguidance,
    # duckdb, ...): a collection hook that did left the GPU check with no tests at all
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p",
                           "no:cacheprovider", "tests/engine/test_mxfp4.py", "tests/engine/test_triton_moe.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": f"{REPO / 'scripts' / 'engine_only'}:{REPO}"})
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]  # 5: no gpu test in these files
    assert "INTERNALERROR" not in done.stdout + done.stderr


def test_a_hung_step_times_out_and_the_budget_skips_the_rest(tmp_path):
    hang = tmp_path / "python"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    done, log = gpu_check(tmp_path / "out", python=str(hang), GPU_CHECK_BUDGET_S="6",
                          GPU_CHECK_STEPS="imports,memory_plan,proxies")
    assert done.returncode == 1
    assert summary(log) == {"imports": "TIMEOUT", "memory_plan": "SKIPPED", "proxies": "SKIPPED"}
    rerun = ("to run the skipped steps: GPU_CHECK_STEPS=memory_plan,proxies bash scripts/gpu_check.sh "
             "[another OUT_DIR: this log is rewritten]")
    assert log.rstrip().endswith(rerun)


def test_the_figures_are_copied_once_however_long_the_log(tmp_path):
    # a grep reading the log while its matches are appended to it fed on itself: GBs in seconds
    chatty = tmp_path / "python"
    chatty.write_text("#!/bin/sh\nfor i in $(seq 30000); do echo \"sharegpt engine: line $i\"; done\n")
    chatty.chmod(0o755)
    out = tmp_path / "out"
    environment = {**os.environ, "GPU_CHECK_DRY_RUN": "1", "PYTHON": str(chatty), "GPU_CHECK_STEPS": "imports"}
    # files capped at 64 MiB and a minute: a regression must fail this test, not fill the disk
    done = subprocess.run(["bash", "-c", f"ulimit -f 65536; exec bash {SCRIPT} {out}"], env=environment,
                          capture_output=True, text=True, timeout=60)
    log = (out / "gpu_check.log").read_text()
    assert done.returncode == 0 and summary(log) == {"imports": "PASS"}
    assert log.count("sharegpt engine: line 30000\n") == 2  # the step's output, and once under figures
    assert log.count("sharegpt engine: line ") == 60000 and log.count("=== figures") == 1


def test_a_failing_step_is_reported_and_fails_the_check(tmp_path):
    done, log = gpu_check(tmp_path, python="false", GPU_CHECK_STEPS="imports")
    assert done.returncode == 1 and summary(log) == {"imports": "FAIL(1)"}


@pytest.mark.slow
def test_the_dry_run_passes_every_step_and_logs_every_figure(tmp_path):
    done, log = gpu_check(tmp_path)
    assert done.returncode == 0, log[-3000:]
    assert summary(log) == dict.fromkeys(STEPS, "PASS")
    assert list(summary(log)) == STEPS  # in this order
    assert "to run the skipped steps" not in log
    assert "none of batch, tools, evals, trainer, duckdb, mcp, openai_harmony, openai, llguidance" in log
    assert "gpt-oss-120b-shaped memory plan" in log and "fits: yes" in log
    assert "skipped" in log  # the GPU tests skip on CPU, with their reason
    for workload in ("sharegpt", "random"):
        assert f"{workload} engine stats: num_steps=" in log
        rows = [line.split() for line in log.splitlines() if line.startswith(f"{workload} ")]
        assert {row[1] for row in rows} >= {"engine", "hf_generate_bs2"}
    assert log.count("batch-1 decode: ") >= 4  # in each bench step and again under figures
    for system, packed in (("engine_dense", False), ("engine_deterministic", True), ("engine_fp8_kv", True)):
        assert f"sharegpt {system} stats: num_steps=" in log and f"batch-1 decode ({system}): " in log
        assert f"mxfp4_experts={packed}" in log.split(f"sharegpt {system} stats:")[1].splitlines()[0]
    assert "kv_cache_dtype=float8_e4m3fn" in log.split("sharegpt engine_fp8_kv stats:")[1].splitlines()[0]
    figures = log.split("=== figures")[1]
    decode_120b = figures.split("=== decode_120b")[1].split("\n=== ")[0]  # each step's lines under its name
    assert "random engine stats: num_steps=" in decode_120b and "batch-1 decode: " in decode_120b
    assert "sharegpt engine_dense: " in figures and "batch-1 decode (engine_dense): " in figures
    vllm_settings = figures.split("=== vllm_settings")[1].split("\n=== ")[0]
    assert "sharegpt engine: 6 requests" in vllm_settings and "batch-1 decode: " in vllm_settings
    assert "proxies: none registered" in log or "proxy " in log
    assert "routing T=16 (64 pairs; the engine's kernel up to 4096): kernel " in figures
    assert "sampler B=2 over 4,096 tokens, top-p 0.9: kernels " in figures
    assert "attention B=3 ctx=130 partition 64 (3 a sequence): " in figures
    moe_tiles = figures.split("=== moe_tiles")[1].split("\n=== ")[0]  # the default, dense and fastest lines only
    assert [line.split(":")[0] for line in moe_tiles.splitlines()[1:]] == [
        "moe T=4 64x64w4s3 (default)", "moe T=4 dense", "moe T=4 fastest"], moe_tiles
    profile = figures.split("=== profile")[1].split("\n=== ")[0]  # each batch's summary and parts, no kernels
    assert "profile B=4 ctx~" in profile and "profile B=1 ctx~" in profile and " part gemm (cuBLAS): " in profile
    assert " kernel " not in profile
