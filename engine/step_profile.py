"""Where a decode step's time goes: the kernels of a few steady steps, profiled (issue 24).

The proxies (engine.proxies) estimate each part of a step from a CPU; a GPU run should say what each part takes.
`profile_decode` fills a running engine with `batch` sequences of `context` prompt tokens (submit's default
sampling, temperature 1), steps until every one is decoding, then records a few steps under torch.profiler: each
kernel's device time (those a CUDA graph replays included), summed by part of the step (PARTS: the MoE's GEMMs,
attention, cuBLAS's GEMMs, the sampler, ...), and the share of the steps' wall time the device was busy: the rest
is the host and the gaps between launches. On a CPU the same harness times aten ops (a check of the harness,
not a measurement). `python -m engine.step_profile --preset 20b` prints it for a random 20b-shaped model.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.api import SamplingParams

# Part of a step -> a pattern of the kernel (or, on a CPU, aten op) names that make it; the first match wins.
PARTS = (
    ("moe gemm", r"moe_gemm|swiglu_reduce"),
    ("moe routing", r"_route_kernel|aten::topk|aten::sort"),
    ("moe combine", r"_moe_combine"),
    ("attention", r"_decode_partition|_decode_reduce|_reduce_partitions|_prefill_kernel|paged_attention"),
    ("norm, rope, kv write", r"_rms_norm|_rope_write|aten::rsqrt"),
    ("sampler draw", r"_draw_slices|_pick_slices|_top_p_threshold"),
    ("gemm (cuBLAS)", r"gemm|gemv|nvjet|cutlass|xmma|aten::(addmm|mm|linear|matmul)"),
    ("copies", r"[Mm]emcpy|[Mm]emset|aten::copy_|aten::index"),
)
OTHER = "other"


@dataclass
class StepProfile:
    """`steps` profiled decode steps of `batch` sequences at ~`context` tokens."""

    batch: int
    context: int  # the sequences' mean length at the profiled steps
    steps: int
    wall_us: float  # the profiled steps' wall time, the device synchronised at both ends
    busy_us: float  # the time some kernel ran (the union of their intervals)
    plain_wall_us: float  # as many steps just before, not profiled
    by_kernel: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (calls, device us)
    device: str = "cuda"

    def by_part(self) -> dict[str, float]:
        """Device us of each part of the step (PARTS, then OTHER), summed over the profiled steps."""
        parts: dict[str, float] = defaultdict(float)
        for name, (_, us) in self.by_kernel.items():
            parts[part_of(name)] += us
        return dict(parts)

    def lines(self, top: int = 12) -> list[str]:
        """A summary line, a line a part, then the `top` kernels by device time: per step."""
        head = f"profile B={self.batch} ctx~{self.context}"
        if not self.by_kernel:
            return [f"{head}: no kernel was recorded ({self.device}; torch.profiler saw none: inside CUDA graphs, "
                    f"--no-cuda-graphs shows them run eagerly)"]
        what = "kernels" if self.device.startswith("cuda") else "aten ops (CPU: a check of the harness)"
        plain, profiled, busy = (us / self.steps / 1000 for us in (self.plain_wall_us, self.wall_us, self.busy_us))
        lines = [f"{head}: {plain:.3f} ms a step; profiled {profiled:.3f} ms, {what} busy {busy:.3f} ms of it "
                 f"({100 * self.busy_us / max(self.wall_us, 1e-9):.0f}%), over {self.steps} steps"]
        total = sum(us for _, us in self.by_kernel.values()) or 1.0
        for part, us in sorted(self.by_part().items(), key=lambda item: -item[1]):
            lines.append(f"{head} part {part}: {us / self.steps:.1f} us a step ({100 * us / total:.0f}%)")
        ranked = sorted(self.by_kernel.items(), key=lambda item: -item[1][1])[:top]
        for name, (calls, us) in ranked:
            lines.append(f"{head} kernel {_short(name)}: {calls / self.steps:.0f} a step, {us / self.steps:.1f} us "
                         f"a step ({100 * us / total:.0f}%)")
        return lines


def part_of(name: str) -> str:
    """The part of a step (PARTS) a kernel or op name belongs to, else OTHER."""
    return next((part for part, pattern in PARTS if re.search(pattern, name)), OTHER)


def _short(name: str, width: int = 90) -> str:
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def prepare_profiler() -> None:
    """On CUDA, start torch.profiler's CUDA tracing once before any CUDA graph is captured: graphs captured before
    its first use profile badly (torch.profiler._utils._init_for_cuda_graphs says so), so before the engine."""
    if not torch.cuda.is_available():
        return
    init = getattr(getattr(torch.profiler, "_utils", None), "_init_for_cuda_graphs", None)
    if init is not None:
        init()
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            pass


def profile_decode(engine: Any, batch: int, context: int, steps: int = 5, warm_steps: int = 3) -> StepProfile:
    """Profile `steps` decode steps of `batch` sequences of `context` prompt tokens in `engine` (an LLMEngine with
    nothing running, built after `prepare_profiler`), after every one decodes and `warm_steps` more; the sequences
    are aborted after. Raises RuntimeError if fewer than `batch` were decoding when the steps were timed."""
    if batch > engine.config.max_num_seqs:
        raise ValueError(f"{batch} sequences: more than the engine's max_num_seqs ({engine.config.max_num_seqs})")
    ids = [f"profile-{batch}-{index}" for index in range(batch)]
    # none may finish before the last one's prefill ends (at 2,048 tokens a step, 256 prompts of 1,024 take 128
    # steps): they are aborted after the profile
    sampling = SamplingParams(max_tokens=1_000_000, temperature=1.0, ignore_eos=True)
    for index, request_id in enumerate(ids):
        # distinct prompts: no prefix-cache hit shortens a prefill
        engine.add_request(request_id, [1000 + (index * 7919 + t) % 50000 for t in range(context)], sampling)
    started: set[str] = set()
    while len(started) < batch and engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                raise RuntimeError(f"{out.request_id} ended ({out.finish_reason}) before all {batch} decoded")
            if out.new_token_ids:
                started.add(out.request_id)
    for _ in range(warm_steps):
        engine.step()
    decoding = [seq for seq in engine.scheduler.running if seq.request_id in set(ids)]
    if len(decoding) < batch:
        raise RuntimeError(f"{len(decoding)} of {batch} sequences were decoding when the profile began "
                           f"(the KV cache or max_num_seqs too small?)")
    mean_context = round(sum(seq.num_tokens for seq in decoding) / batch) + steps
    device = str(engine.config.device)
    on_cuda = device.startswith("cuda")
    plain_wall_us = _timed_steps(engine, steps, device)
    # on a GPU the device's activity alone: recording every host op would slow the host the profile is to judge
    activity = torch.profiler.ProfilerActivity.CUDA if on_cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as profiler:
        wall_us = _timed_steps(engine, steps, device)
    for request_id in ids:
        engine.abort(request_id)
    while engine.has_unfinished_requests():
        engine.step()
    by_kernel, intervals = _kernels(profiler.events(), on_cuda)
    return StepProfile(batch, mean_context, steps, wall_us, _union_us(intervals), plain_wall_us, by_kernel, device)


def _timed_steps(engine: Any, steps: int, device: str) -> float:
    """Microseconds `steps` engine steps take, the device synchronised at both ends."""
    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda _: None)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    synchronize(device)
    return (time.perf_counter() - start) * 1e6


def _kernels(events: Any, on_cuda: bool) -> tuple[dict[str, tuple[int, float]], list[tuple[float, float]]]:
    """(name -> (calls, us), [(start, end) us]) of the device's kernels, or on a CPU of the aten ops' own time."""
    from torch.autograd import DeviceType

    by_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    intervals = []
    for event in events:
        if on_cuda:
            if event.device_type != DeviceType.CUDA:
                continue
            us = event.time_range.elapsed_us()
            intervals.append((event.time_range.start, event.time_range.end))
        else:
            if not event.name.startswith("aten::") or event.self_cpu_time_total <= 0:
                continue
            us = event.self_cpu_time_total
            intervals.append((event.time_range.start, event.time_range.start + us))
        entry = by_kernel[event.name]
        entry[0] += 1
        entry[1] += us
    return {name: (int(calls), us) for name, (calls, us) in by_kernel.items()}, intervals


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.step_profile --preset 20b`: decode steps of a random preset-shaped model, profiled."""
    import argparse

    from engine.bench_gpu import PRESETS, build_preset_engine
    from engine.device import batch_size_on

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="20b")
    parser.add_argument("--dry-run", action="store_true", help="the preset's code at a tiny shape (any device)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--batches", default="256,1", help="decoding sequences, comma-separated")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens a sequence")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-cuda-graphs", action="store_true", help="every step eager (kernels profiled one by one)")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    options = {"device": args.device, "kernels": args.kernels, "cuda_graphs": not args.no_cuda_graphs,
               "max_num_seqs": max(max(batches), batch_size_on(args.device))}
    prepare_profiler()
    engine = build_preset_engine(args.preset, options, args.dry_run)
    print(f"profile: {args.preset} shape{' (dry run: tiny)' if args.dry_run else ''} on {engine.config.device}, "
          f"kernels {engine.config.kernels}, cuda graphs {engine.describe().get('cuda_graphs')}", flush=True)
    for batch in batches:
        for line in profile_decode(engine, batch, args.context, args.steps).lines():
            print(line, flush=True)


if __name__ == "__main__":
    main()
