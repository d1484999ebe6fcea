#!/usr/bin/env bash
# The GPU check (issue #24, item 7): everything a lent GPU should tell us, in one log, in <= 8 minutes.
#
#   scripts/gpu_check.sh [OUT_DIR]          # OUT_DIR, else $OUT (the device machine's), else ./gpu-check-out
#   GPU_CHECK_DRY_RUN=1 scripts/gpu_check.sh /tmp/x   # every step on CPU at tiny shapes (minutes, no GPU)
#
# Runs the engine-only path (torch, transformers, triton, safetensors): the GPU machines' image has no
# duckdb, mcp, openai-harmony, openai or llguidance, and scripts/engine_only/sitecustomize.py makes them
# unimportable here too. Each step has its own timeout, clamped to what is left of GPU_CHECK_BUDGET_S,
# so one hang cannot eat the budget; the log ends with which steps passed. GPU_CHECK_STEPS=a,b runs
# only those steps. Exit status 0 only when every step that ran passed.
set -u

REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${1:-${OUT:-gpu-check-out}}
PY=${PYTHON:-python3}
DRY=${GPU_CHECK_DRY_RUN:-0}
ONLY=${GPU_CHECK_STEPS:-}
mkdir -p "$OUT_DIR"
LOG=$(cd "$OUT_DIR" && pwd)/gpu_check.log
cd "$REPO" || exit 2
export PYTHONPATH="$REPO/scripts/engine_only:$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

if [ "$DRY" = 1 ]; then
    BUDGET_S=${GPU_CHECK_BUDGET_S:-1500}
    SCALE=4  # a shared CPU imports and runs everything several times slower than the GPU machine
    DEVICE=cpu
    # the presets' code at a tiny shape; few, short requests
    PRESET_OPTS=(--dry-run --device cpu --kernels torch --max-num-seqs 8)
    BENCH=(--preset 20b "${PRESET_OPTS[@]}" --batch-size 2)
    SHAREGPT=(--num-requests 4 --baseline-requests 2 --baseline-output-len 4 --sharegpt-output-len 6)
    RANDOM_MIX=(--num-requests 4 --baseline-requests 2 --baseline-output-len 4 --random-input-len 48
                --random-output-len 12)
    MIX_120B=(--num-requests 4 --random-input-len 48 --random-output-len 12)
    VLLM_SETTINGS=(--num-requests 6 --max-num-seqs 12 --max-num-batched-tokens 64)
    ROUTING=(--device cpu --tokens 1,16)
    SAMPLER=(--device cpu --batches 1,2 --vocab 4096)
    MOE_TILES=(--device cpu --shape tiny --tokens 4 --repeats 2)
    ATTENTION_PARTS=(--device cpu --shape tiny --steps 3x130 --partitions 64 --repeats 2)
    PROFILE=(--dry-run --device cpu --kernels torch --batches 4,1 --context 48 --steps 2)
else
    BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
    SCALE=1
    DEVICE=cuda
    # transformers' eager attention with sinks holds ~4 copies of a prefill's [batch, 64 heads, prompt, prompt]
    # scores: the first 64 ShareGPT-like prompts pad to 1,024 tokens, ~32 GiB beside ~42 GB of bf16 weights and
    # the KV cache, past an H100's 80 GB; the first 32 pad to 312 (the random mix's 32 x 1,000: ~16 GiB)
    BENCH=(--preset 20b --device cuda --max-num-seqs 256 --batch-size 32)
    # 120b: ~61 GB of weights leave ~104k KV tokens on an 80 GB GPU (engine.memory_plan): 64 x 1,200 fit
    PRESET_OPTS=(--device cuda --max-num-seqs 64)
    MIX_120B=(--num-requests 64 --random-input-len 1000 --random-output-len 200)
    # transformers decodes one static batch of each workload, its outputs capped at 64 tokens: a batch runs
    # to its longest output (1,084 tokens for the first 32 ShareGPT-like requests), and transformers 5.17's
    # expert loop waits on the GPU twice per expert and layer: 0.41 s a step at batch 32 on an H200, so 256
    # tokens took ~110 of bench_sharegpt's 168 s. At 64 more of its tokens are prompt: its tok/s (and the
    # engine's ratio to it) is not comparable with a 256-token cap's (81 tok/s, 129x on that H200)
    SHAREGPT=(--num-requests 512 --baseline-requests 32 --baseline-output-len 64)
    RANDOM_MIX=(--num-requests 128 --baseline-requests 32 --baseline-output-len 64)
    # `vllm serve`'s defaults on a GPU of 70 GiB or more, the A100 aside, under which its published 20b figure was
    # taken on 1,000 ShareGPT prompts: 1,024 sequences, 8,192-token steps
    VLLM_SETTINGS=(--num-requests 1000 --max-num-seqs 1024 --max-num-batched-tokens 8192)
    ROUTING=(--device cuda)
    SAMPLER=(--device cuda)
    MOE_TILES=(--device cuda)
    ATTENTION_PARTS=(--device cuda)
    PROFILE=(--preset 20b --device cuda)
fi

START=$(date +%s)
SUMMARY=()
FAILED=0

step() {  # step NAME TIMEOUT_S COMMAND...: run COMMAND into the log under min(TIMEOUT_S, budget left)
    local name=$1 limit=$(($2 * SCALE))
    shift 2
    if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then
        return 0
    fi
    local left=$((BUDGET_S - ($(date +%s) - START)))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        SUMMARY+=("$(printf '%-8s %-14s %5s s  (budget of %s s spent)' SKIPPED "$name" 0 "$BUDGET_S")")
        FAILED=1
        return 0
    fi
    echo "=== $name (timeout ${limit} s): $*" | tee -a "$LOG"
    local t0 rc status
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    case $rc in
        0) status=PASS ;;
        124 | 137) status=TIMEOUT ;;
        *) status="FAIL($rc)" ;;
    esac
    [ "$rc" -ne 0 ] && FAILED=1
    SUMMARY+=("$(printf '%-8s %-14s %5s s' "$status" "$name" $(($(date +%s) - t0)))")
    echo "--- $name: $status in $(($(date +%s) - t0)) s" | tee -a "$LOG"
}

env_report() {  # exported: timeout runs it in a child bash
    date -u '+%Y-%m-%d %H:%M:%S UTC'
    echo "commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        "$(git -C "$REPO" status --porcelain 2>/dev/null | grep -q . && echo '(with uncommitted changes)')"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
        --format=csv
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
torch.cuda.get_device_name() if torch.cuda.is_available() else "(no CUDA device)")'
}

export -f env_report
export PY REPO
: >"$LOG"
echo "gpu check: dry run=$DRY, device=$DEVICE, budget ${BUDGET_S} s, log $LOG" | tee -a "$LOG"
# Timeouts sum past the budget on purpose: most steps take far less, and the clamp keeps the total.
step env 30 bash -c env_report
step imports 45 "$PY" scripts/engine_only/check_imports.py
step memory_plan 45 "$PY" -m engine.memory_plan --preset 120b
# one line per test as it ends (-v), so a step stopped by its timeout still says which passed
# the kernels' own numerics first (tl.dot_scaled's MoE at the 20b shape): a cold Triton cache compiles every
# variant, and a step stopped by its timeout should have cut the end-to-end tests, not these. Two runs: given
# a folder beside them, pytest would collect the files in the folder's order
FIRST_TESTS="tests/engine/test_triton_moe.py tests/engine/test_triton_moe_words.py tests/engine/test_triton_moe_gemv.py"
FIRST_TESTS+=" tests/engine/test_triton_attention.py"
FIRST_TESTS+=" tests/engine/test_triton_fused.py tests/engine/test_triton_sampler.py"
export FIRST_TESTS
step gpu_tests 200 bash -c 'opts="-m gpu -v -rs --durations=10 -p no:cacheprovider"
    "$PY" -m pytest $opts $FIRST_TESTS; first=$?
    "$PY" -m pytest $opts tests/engine ${FIRST_TESTS//tests\//--ignore=tests/}; rest=$?
    exit $((first || rest))'
step bench_sharegpt 170 "$PY" -m engine.bench "${BENCH[@]}" --workloads sharegpt "${SHAREGPT[@]}"
# gpt-oss-120b's shape decodes within an H100 80GB's memory (--memory-gib h100 caps a bigger GPU's KV cache)
step decode_120b 120 "$PY" -m engine.bench --preset 120b "${PRESET_OPTS[@]}" --memory-gib h100 --systems engine \
    --workloads random "${MIX_120B[@]}"
step bench_random 130 "$PY" -m engine.bench "${BENCH[@]}" --workloads random "${RANDOM_MIX[@]}"
# where a decode step's time goes: the kernels of 5 steady steps at batch 256 and 1 (1,024-token prompts, temperature
# 1), summed by part of the step, and the share of the steps' wall time the device was busy
step profile 150 "$PY" -m engine.step_profile "${PROFILE[@]}"
# the MoE's grouped GEMMs, one 20b-shaped layer at 256, 64, 16, 4, 1, 1,024 and 2,048 tokens, through each shape of
# engine.kernels.moe_tiles (and the experts held as bf16), each output against the default's: what DEFAULT_TILES
# should be (compiled for sm_90, a K step of 128 issues ~9% less than the default's 64), then each shape on the
# experts re-packed as words ("+words" rows: the engine's form on a GPU; sm_90 loop 214 against 270, and no load the
# loop waits for), and the default shape on words with the checkpoint's scale bytes ("+words(scale bytes)": 191, a
# synchronous load a step), and up to 16 tokens the matrix-vector kernel's shapes on words ("gemv...+words":
# engine.kernels.moe_gemv, whether GEMV_MAX_PAIRS should turn it on for the smallest steps). Mostly compiles.
step moe_tiles 180 "$PY" -m engine.kernels.moe_tiles "${MOE_TILES[@]}"
# the MoE's one-program routing kernel against torch's ~24 launches, per step size: where ROUTE_KERNEL_MAX_PAIRS
# (4,096, estimated from the kernel's compiled loop) should be
step routing 40 "$PY" -m engine.kernels.moe "${ROUTING[@]}"
# the sampler's draw in two Triton launches against torch's ~20 passes, at batch 1, 64 and 256 over gpt-oss's
# vocabulary (the proxy estimates ~0.4 against ~4.7 ms at 256)
step sampler 30 "$PY" -m engine.sampler_costs "${SAMPLER[@]}"
# the decode attention's partition kernel and reduce per partition size, then at a 128-key tile, at batch 1, 64 and
# 256: a batch-256 step's attention read its K and V at ~1.8 TB/s on an H200 (before its loop lost a third of its
# code, and its K and V copies got a pipeline: TABLE_AHEAD, timed against the old read); 2,048 (sequence, KV head)
# programs may need no split at all
step attention_parts 60 "$PY" -m engine.kernels.attention_parts "${ATTENTION_PARTS[@]}"
# what an option costs on the ShareGPT-like mix, against bench_sharegpt's engine row: the experts held as
# bf16 (the faster of the two is what --moe-weights auto should pick), then batch-invariant numerics, then an fp8
# KV cache (half the bytes attention reads, twice the tokens: its stats line's num_blocks).
# Then the ShareGPT-like mix as vLLM's published figure was taken: 1,000 requests under `vllm serve`'s defaults on a
# GPU of 70 GiB or more (1,024 sequences, 8,192-token steps). Within 8 minutes these may be SKIPPED: the summary ends with
# the command that runs what was skipped, for a second call.
step moe_dense 110 "$PY" -m engine.bench "${BENCH[@]}" --workloads sharegpt "${SHAREGPT[@]}" --systems engine_dense
step deterministic 110 "$PY" -m engine.bench "${BENCH[@]}" --workloads sharegpt "${SHAREGPT[@]}" \
    --systems engine_deterministic
step fp8_kv 110 "$PY" -m engine.bench "${BENCH[@]}" --workloads sharegpt "${SHAREGPT[@]}" --systems engine_fp8_kv
step vllm_settings 110 "$PY" -m engine.bench "${BENCH[@]}" --workloads sharegpt --systems engine "${VLLM_SETTINGS[@]}"
# the graph-share proxy decodes 512 requests with a tiny model on the CPU: about a minute on a quiet core
step proxies 120 "$PY" -m engine.bench --proxies

# the figures again, where a reader of the output's tail sees them: read before anything is appended (a
# grep reading the log that its own output is appended to could feed on itself)
FIGURES=$(grep -E '^=== |^(sharegpt|random) |^batch-1 decode|^routing T=|^sampler B=|^attention B=|^moe T=.*(fastest: | \(default\): | dense: |\+words: |\+words\(scale bytes\): )|^profile B=[0-9]+ ctx~[0-9]+(: | part )|^  (weights|KV cache|fits|the engine clamps)' \
    "$LOG")
{
    echo "=== figures"
    printf '%s\n' "$FIGURES"
    echo "=== summary: $(($(date +%s) - START)) s of a ${BUDGET_S} s budget (dry run=$DRY, device=$DEVICE)"
    printf '%s\n' "${SUMMARY[@]}"
    # the steps the budget cut, as the command that runs them (a second call, if device time is left)
    skipped=$(printf '%s\n' "${SUMMARY[@]}" | awk '$1 == "SKIPPED" {print $2}' | paste -sd, -)
    [ -n "$skipped" ] && echo "to run the skipped steps: GPU_CHECK_STEPS=$skipped bash scripts/gpu_check.sh" \
        "[another OUT_DIR: this log is rewritten]"
} | tee -a "$LOG"
exit $FAILED
