"""Throughput benchmark: the same token workload on our engine and on transformers.

Everything here knows tokens, not Responses, so it runs on a machine that has
only torch and transformers (`python -m engine.bench`). Workloads
(`engine.workloads`) are synthetic and seeded; output lengths are forced (stop
tokens ignored) so a random-weight model gives the real shape of a run.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from engine.api import DEFAULT_MAX_NUM_BATCHED_TOKENS
from engine.workloads import ENGINE_SYSTEMS, PERCENTILES, WORKLOADS, BenchResult, Workload, make_workloads, run_backend

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


DEFAULT_WORKLOADS = ("sharegpt", "shared_prefix", "multi_turn")
MEDIUM_CONFIG = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                     head_dim=48, intermediate_size=384, num_local_experts=8, num_experts_per_tok=2)


def run_system(system: str, model_dir: str | Path, workload: Workload, *, batch_size: int,
               engine_options: dict[str, Any]) -> tuple[BenchResult, dict]:
    """One system on one workload, freshly loaded (no cache carried between runs).

    engine_options go to the engine; their `device` (default "cpu") places the transformers systems too.
    """
    from engine.device import resolve_device
    from engine.factory import load_backend

    if system in ENGINE_SYSTEMS:
        backend = cast("LLMEngine", load_backend("engine", model_dir, **{**engine_options, **ENGINE_SYSTEMS[system]}))
        result = run_backend(system, backend, workload)
        return result, backend.stats()
    device = resolve_device(engine_options.get("device", "cpu"))
    if system == "reference":
        return run_backend("reference", load_backend("transformers", model_dir, device=device), workload), {}
    from engine.bench_hf import load_hf_model, run_generate, run_generate_batch

    if system == "hf_generate":
        return run_generate(load_hf_model(model_dir, device=device), workload, batch_size), {}
    if system == "hf_generate_batch":
        return run_generate_batch(load_hf_model(model_dir, "paged|eager", device=device), workload), {}
    raise ValueError(f"unknown system {system!r}; known: {', '.join(ENGINE_SYSTEMS)}, reference, hf_generate, "
                     "hf_generate_batch")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def format_table(results: list[BenchResult], baseline: str = "engine") -> str:
    """Results with each system's ratio to the baseline system on the same workload; TTFT and TPOT
    percentiles in milliseconds."""
    base = {r.workload: r for r in results if r.system == baseline}
    latency = [f"{name} p{p}" for name in ("ttft", "tpot") for p in PERCENTILES]
    header = (f"{'workload':<14} {'system':<18} {'reqs':>5} {'out tok/s':>10} {'total tok/s':>12} "
              + " ".join(f"{column:>9}" for column in latency)
              + f" {'prefill tok':>11} {'out x':>6} {'total x':>7} {'rss MB':>7}")
    lines = [header, "-" * len(header)]
    for r in results:
        b = base.get(r.workload)
        out_x = f"{r.output_tok_s / b.output_tok_s:.2f}" if b else "-"
        tot_x = f"{r.total_tok_s / b.total_tok_s:.2f}" if b else "-"
        times = [getattr(r, f"{name}_p{p}_s") for name in ("ttft", "tpot") for p in PERCENTILES]
        lines.append(f"{r.workload:<14} {r.system:<18} {r.num_requests:>5} {r.output_tok_s:>10.1f} "
                     f"{r.total_tok_s:>12.1f} " + " ".join(f"{_ms(t):>9}" for t in times)
                     + f" {r.prefill_tokens:>11} {out_x:>6} {tot_x:>7} {r.peak_rss_mb:>7.0f}")
    return "\n".join(lines)


def format_result(r: BenchResult) -> str:
    """One result on one line, printed as it lands (a run stopped later keeps it in the log)."""
    ttft, tpot = ("/".join(_ms(getattr(r, f"{name}_p{p}_s")) for p in PERCENTILES) for name in ("ttft", "tpot"))
    return (f"{r.workload} {r.system}: {r.num_requests} requests, {r.total_tok_s:.1f} total tok/s, "
            f"{r.output_tok_s:.1f} out tok/s, TTFT p50/p90/p99 {ttft} ms, TPOT p50/p90/p99 {tpot} ms")


def format_stats(stats: dict) -> str:
    """An engine's stats() as `key=value` pairs, floats to 3 significant digits."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--preset", choices=["20b", "120b"],
                        help="gpt-oss-20b's or -120b's shape, random, built on the GPU (120b: engine systems only)")
    parser.add_argument("--dry-run", action="store_true",
                        help="--preset's code path at a tiny shape on any device: checks the harness, "
                             "measures nothing")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--systems", default="engine,hf_generate")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--baseline-requests", type=int,
                        help="the transformers systems decode only the first N requests of each workload")
    parser.add_argument("--baseline-output-len", type=int,
                        help="the transformers systems' outputs stop at N tokens (a static batch runs to its "
                             "longest output): their tok/s is then of shorter contexts, which favours them")
    parser.add_argument("--random-input-len", type=int, default=1000)
    parser.add_argument("--random-output-len", type=int, default=1000)
    parser.add_argument("--sharegpt-output-len", type=int, help="fix every sharegpt output's length")
    parser.add_argument("--batch-size", type=int, default=16, help="static batch size of hf_generate")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--moe-weights", default="auto", help="MXFP4 experts: auto, mxfp4 (packed) or dense")
    parser.add_argument("--kv-cache-dtype", default="auto", help="the KV cache: auto (the model's dtype) or fp8")
    parser.add_argument("--uniform-kv-cache", action="store_true",
                        help="every layer keeps every token (default: the hybrid layout, engine.kv_layout)")
    parser.add_argument("--max-num-seqs", type=int, help="the engine's batch size (default: 64 on CPU, 256 on CUDA)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                        help="tokens one engine step computes at most (prefill chunks and decode rows)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--memory-gib", type=_memory_gib,
                        help="size the KV cache as on a GPU of this many GiB (h100: an H100 80GB's) when the GPU "
                             "has more: --gpu-memory-utilization of it, not of the device")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proxies", action="store_true",
                        help="also print the GPU path's CPU-measured proxies (engine.proxies); alone: only them")
    return parser


def baseline_load(workload: Workload, num_requests: int | None, output_len: int | None) -> Workload:
    """What the transformers systems decode of a workload: its first `num_requests` requests, each output
    at most `output_len` tokens (None: all of them, whole)."""
    conversations = workload.conversations[:num_requests] if num_requests else workload.conversations
    if output_len:
        conversations = [dataclasses.replace(c, output_lens=[min(n, output_len) for n in c.output_lens])
                         for c in conversations]
    return Workload(workload.name, conversations)


def _memory_gib(text: str) -> float:
    from engine.memory_plan import H100_80GB_BYTES

    if text == "h100":
        return H100_80GB_BYTES / 2**30
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a positive number of GiB, or h100")
    return value


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.bench [MODEL_DIR | --preset 20b|120b] [--proxies]`: the benchmark with torch and
    transformers only (no DuckDB: results are printed), e.g. on a GPU machine with nothing else installed."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.proxies:
        from engine.proxies import format_figures, measure_all

        figures = measure_all()
        print(format_figures(figures) if figures else "proxies: none registered in engine.proxies.MEASURES",
              flush=True)
        if args.model_dir is None and args.preset is None:
            return
    if (args.model_dir is None) == (args.preset is None):
        parser.error("give MODEL_DIR or --preset 20b|120b")
    if args.dry_run and not args.preset:
        parser.error("--dry-run goes with --preset")
    if args.preset and not args.dry_run:
        from engine.device import resolve_device

        try:
            on_gpu = resolve_device(args.device).startswith("cuda")
        except ValueError as exc:
            parser.error(str(exc))
        if not on_gpu:
            parser.error(f"--preset {args.preset} is built on the GPU: pass --device cuda")
    if args.preset:
        from engine.bench_gpu import preset_problem

        problem = preset_problem(args.preset, args.systems.split(","), args.moe_weights)
        if problem:
            parser.error(problem)
    _run(args)


def capped_utilization(utilization: float, memory_gib: float | None, device: str) -> float:
    """--gpu-memory-utilization as a share of the device, for a KV cache sized as on a GPU of `memory_gib`
    (unchanged without it, off CUDA, or on a device no bigger)."""
    import torch

    from engine.device import resolve_device

    if memory_gib is None:
        return utilization
    resolved = resolve_device(device)
    if not resolved.startswith("cuda"):
        return utilization
    total = torch.cuda.mem_get_info(torch.device(resolved))[1]
    return utilization * min(1.0, memory_gib * 2**30 / total)


def _run(args: argparse.Namespace) -> None:
    """Every system on every workload, one line each as it lands; then the table and the batch-1 line."""
    utilization = capped_utilization(args.gpu_memory_utilization, args.memory_gib, args.device)
    if utilization != args.gpu_memory_utilization:
        print(f"KV cache sized as on a GPU of {args.memory_gib:.1f} GiB: --gpu-memory-utilization "
              f"{args.gpu_memory_utilization} of it is {utilization:.3f} of this device", flush=True)
    from engine.device import batch_size_on

    engine_options = {"device": args.device, "kernels": args.kernels,
                      "max_num_seqs": args.max_num_seqs or batch_size_on(args.device),
                      "max_num_batched_tokens": args.max_num_batched_tokens,
                      "gpu_memory_utilization": utilization, "moe_weights": args.moe_weights,
                      "kv_cache_dtype": args.kv_cache_dtype, "hybrid_kv_cache": not args.uniform_kv_cache}
    results: list[BenchResult] = []
    runs: list[tuple[str, dict]] = []
    options = {"random": {"input_len": args.random_input_len, "output_len": args.random_output_len},
               "sharegpt": {"output_len": args.sharegpt_output_len}}
    workloads = make_workloads(args.workloads.split(","), args.num_requests, args.seed, options)
    failed = 0
    for workload in workloads:
        for system in args.systems.split(","):
            load = workload if system in ENGINE_SYSTEMS else baseline_load(workload, args.baseline_requests,
                                                                             args.baseline_output_len)
            try:
                result, stats = _run_one(args, system, load, engine_options)
            except Exception as exc:  # noqa: BLE001 - e.g. the baseline out of GPU memory: the rest still measure
                failed += 1
                print(f"{workload.name} {system}: FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                      flush=True)
                continue
            finally:
                _free_device_memory()  # here, not in `except`: there the exception's frames still hold tensors
            results.append(result)
            runs.append((result.system, stats))
            print(format_result(result), flush=True)
            if stats:
                print(f"{workload.name} {result.system} stats: {format_stats(stats)}", flush=True)
    print(format_table(results))
    from engine.bench_gpu import batch1_reports

    for line in batch1_reports(runs):
        print(line)
    if failed:
        raise SystemExit(1)


def _run_one(args: argparse.Namespace, system: str, load: Workload, engine_options: dict) -> tuple[BenchResult, dict]:
    if args.preset:
        from engine.bench_gpu import run_preset_system

        return run_preset_system(system, load, batch_size=args.batch_size, preset=args.preset,
                                 engine_options=engine_options, dry_run=args.dry_run)
    return run_system(system, args.model_dir, load, batch_size=args.batch_size, engine_options=engine_options)


def _free_device_memory() -> None:
    """What the last system held back to the device's free memory, before the next system builds."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
