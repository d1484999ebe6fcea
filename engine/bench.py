"""Throughput benchmark: the same token workload on our engine and on transformers.

Everything here knows tokens, not Responses, so it runs on a machine that has
only torch and transformers (`python -m engine.bench`). Workloads
(`engine.workloads`) are synthetic and seeded; output lengths are forced (stop
tokens ignored) so a random-weight model gives the real shape of a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from engine.workloads import WORKLOADS, BenchResult, Workload, make_workloads, run_backend

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


MEDIUM_CONFIG = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                     head_dim=48, intermediate_size=384, num_local_experts=8, num_experts_per_tok=2)


def run_system(system: str, model_dir: str | Path, workload: Workload, *, batch_size: int,
               engine_options: dict[str, Any]) -> tuple[BenchResult, dict]:
    """One system on one workload, freshly loaded (no cache carried between runs).

    engine_options go to the engine; their `device` (default "cpu") places the transformers systems too.
    """
    from engine.device import resolve_device
    from engine.factory import load_backend

    if system == "engine":
        backend = cast("LLMEngine", load_backend("engine", model_dir, **engine_options))
        result = run_backend("engine", backend, workload)
        return result, backend.stats()
    device = resolve_device(engine_options.get("device", "cpu"))
    if system == "reference":
        return run_backend("reference", load_backend("transformers", model_dir, device=device), workload), {}
    from engine.bench_hf import load_hf_model, run_generate, run_generate_batch

    if system == "hf_generate":
        return run_generate(load_hf_model(model_dir, device=device), workload, batch_size), {}
    if system == "hf_generate_batch":
        return run_generate_batch(load_hf_model(model_dir, "paged|eager", device=device), workload), {}
    raise ValueError(f"unknown system {system!r}; known: engine, reference, hf_generate, hf_generate_batch")


def format_table(results: list[BenchResult], baseline: str = "engine") -> str:
    """Results with each system's ratio to the baseline system on the same workload."""
    base = {r.workload: r for r in results if r.system == baseline}
    header = (f"{'workload':<14} {'system':<18} {'out tok/s':>10} {'total tok/s':>12} {'ttft s':>8} "
              f"{'prefill tok':>11} {'out x':>6} {'total x':>7} {'rss MB':>7}")
    lines = [header, "-" * len(header)]
    for r in results:
        b = base.get(r.workload)
        out_x = f"{r.output_tok_s / b.output_tok_s:.2f}" if b else "-"
        tot_x = f"{r.total_tok_s / b.total_tok_s:.2f}" if b else "-"
        lines.append(f"{r.workload:<14} {r.system:<18} {r.output_tok_s:>10.1f} {r.total_tok_s:>12.1f} "
                     f"{r.ttft_s:>8.3f} {r.prefill_tokens:>11} {out_x:>6} {tot_x:>7} {r.peak_rss_mb:>7.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.bench [MODEL_DIR | --preset 20b]`: the benchmark with torch and transformers only
    (no DuckDB: results are printed), e.g. on a GPU machine with nothing else installed."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--preset", choices=["20b"], help="gpt-oss-20b's shape, random, built on the GPU")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--systems", default="engine,hf_generate")
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--moe-weights", default="auto", help="MXFP4 experts: auto, mxfp4 (packed) or dense")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if (args.model_dir is None) == (args.preset is None):
        parser.error("give MODEL_DIR or --preset 20b")
    if args.preset:
        from engine.device import resolve_device

        try:
            on_gpu = resolve_device(args.device).startswith("cuda")
        except ValueError as exc:
            parser.error(str(exc))
        if not on_gpu:
            parser.error("--preset 20b is built on the GPU: pass --device cuda")
    engine_options = {"device": args.device, "kernels": args.kernels, "max_num_seqs": args.max_num_seqs,
                      "gpu_memory_utilization": args.gpu_memory_utilization, "moe_weights": args.moe_weights}
    results: list[BenchResult] = []
    batch1: dict = {}
    for workload in make_workloads(args.workloads.split(","), args.num_requests, args.seed):
        for system in args.systems.split(","):
            if args.preset:
                from engine.bench_gpu import run_preset_system

                result, stats = run_preset_system(system, workload, batch_size=args.batch_size,
                                                  engine_options=engine_options)
            else:
                result, stats = run_system(system, args.model_dir, workload, batch_size=args.batch_size,
                                           engine_options=engine_options)
            results.append(result)
            batch1 = batch1 or {k: v for k, v in stats.items() if k.startswith(("batch1", "roofline", "hbm"))}
            print(f"{workload.name} {system}: {result.output_tok_s:.1f} out tok/s {stats or ''}", flush=True)
    print(format_table(results))
    if batch1:
        from engine.bench_gpu import batch1_report

        print(batch1_report(batch1))


if __name__ == "__main__":
    main()
