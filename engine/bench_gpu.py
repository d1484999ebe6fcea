"""The GPU benchmark at gpt-oss-20b's (or -120b's) shape: a random checkpoint built on the device, and its roofline.

`batchrun bench --device cuda --preset 20b` decodes the workloads on a
gpt-oss-20b-shaped model with random weights (MXFP4 experts, as the published
checkpoint ships them) built directly in GPU memory: no 13 GB file is written.
`--preset 120b` (here and in `batchrun bench`) does the same at gpt-oss-120b's shape (~61 GB
of weights), for the engine with packed experts only (PRESET_SYSTEMS): held as bf16, as
transformers and `--moe-weights dense` would, its experts take ~230 GB.
Our engine gets the packed experts (dequantised inside the Triton MoE kernel);
transformers `generate` gets the same weights with the experts dequantised to
bf16 (its eager path), on the same GPU, one system at a time.

The engine's run also measures batch-1 decode, against the memory-bandwidth
roofline: at batch 1 a step reads every attention weight, the router, the
active experts' MXFP4 blocks, the lm_head and the KV cache once, and does
little else, so bytes read per step / HBM bandwidth bounds its time from below.
"""

from __future__ import annotations

import dataclasses

import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from engine.api import SamplingParams
from engine.checkpoint import parameter_specs, tiny_config
from engine.config import EngineConfig, ModelConfig, held_model_config
from engine.model import GptOssModel
from engine.mxfp4 import MXFP4_BLOCK, dequantize, quantize
from engine.workloads import ENGINE_SYSTEMS, BenchResult, Workload, run_backend

PRESET_20B = dict(hidden_size=2880, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8,
                  head_dim=64, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4,
                  sliding_window=128, max_position_embeddings=131072)
PRESET_120B = {**PRESET_20B, "num_hidden_layers": 36, "num_local_experts": 128}
PRESETS = {"20b": PRESET_20B, "120b": PRESET_120B}
PRESET_DTYPE = torch.bfloat16  # the presets' models (the experts MXFP4 unless held dense)
# The systems each preset can hold on one GPU: 120b's experts fit packed only (~57 GB; ~214 GiB as bf16).
PRESET_SYSTEMS = {"20b": (*ENGINE_SYSTEMS, "hf_generate", "hf_generate_batch"),
                  "120b": tuple(s for s, options in ENGINE_SYSTEMS.items() if options.get("moe_weights") != "dense")}
MXFP4_BITS = 4 + 8 / MXFP4_BLOCK  # a 4-bit code per weight and an 8-bit scale per 32
# Peak HBM bandwidth by device name, for when torch does not report the memory clock and bus width.
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "A100": 2.0e12, "L40S": 0.864e12}
BATCH1_PROMPT, BATCH1_TOKENS = 1024, 256


def preset_config(**overrides: Any) -> GptOssConfig:
    """gpt-oss-20b's config (MXFP4 experts) with `overrides` applied."""
    config = tiny_config(**{**PRESET_20B, **overrides})
    config.quantization_config = {"quant_method": "mxfp4"}
    return config


def random_weights(config: GptOssConfig, device: torch.device | str, dtype: torch.dtype,
                   seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, tensor) of a random model drawn on `device`, one tensor at a time; experts as MXFP4
    `*_blocks`/`*_scales` pairs. The same seed on the same device gives the same weights."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(shape: tuple[int, ...], std: float, mean: float) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device, dtype=torch.float32).mul_(std).add_(mean)

    for name, (shape, std, mean) in parameter_specs(config).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # drawn and quantised expert by expert: a whole fp32 expert tensor is 8.5 GB at the 120b shape,
            # and quantize's transients are ~8x the weight it is given
            packed = [quantize(draw((1, *shape[1:]), std, mean)) for _ in range(shape[0])]
            yield name + "_blocks", torch.cat([blocks for blocks, _ in packed])
            yield name + "_scales", torch.cat([scales for _, scales in packed])
        else:
            yield name, draw(shape, std, mean).to(dtype)


def build_engine_model(config: GptOssConfig, device: torch.device | str, dtype: torch.dtype, kernels: str,
                       seed: int = 0, moe_weights: str = "auto") -> tuple[GptOssModel, ModelConfig]:
    """Our model on `device` with random_weights (experts kept packed with kernels="triton", unless
    moe_weights="dense")."""
    model_config = ModelConfig.from_hf(config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = GptOssModel(held_model_config(model_config, moe_weights), kernels=kernels)
    finally:
        torch.set_default_dtype(previous)
    model = model.to_empty(device=device).eval().requires_grad_(False)
    params = dict(model.named_parameters())
    _fill(params, random_weights(config, device, dtype, seed), dtype)
    model.pack_expert_words()
    return model, model_config


def build_hf_model(config: GptOssConfig, device: torch.device | str, dtype: torch.dtype, seed: int = 0,
                   attn_implementation: str = "eager") -> GptOssForCausalLM:
    """transformers' gpt-oss on `device` with the same random_weights (experts dequantised to `dtype`)."""
    config.dtype = dtype
    with torch.device("meta"):
        model = GptOssForCausalLM._from_config(config, dtype=dtype, attn_implementation=attn_implementation,
                                               experts_implementation="eager")
    model = model.to_empty(device=device).eval().requires_grad_(False)
    model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)  # buffers, not weights: rebuilt
    _fill(dict(model.named_parameters()), random_weights(config, device, dtype, seed), dtype)
    return model


def _fill(params: dict[str, torch.nn.Parameter], weights: Iterator[tuple[str, torch.Tensor]],
          dtype: torch.dtype) -> None:
    """Copy each weight into the parameter of its name; MXFP4 pairs are dequantised for a dense parameter."""
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name in params:
            params[name].copy_(tensor)
        elif name.endswith("_blocks"):
            pending[name.removesuffix("_blocks")] = tensor
        elif name.endswith("_scales"):
            base = name.removesuffix("_scales")
            params[base].copy_(dequantize(pending.pop(base), tensor, dtype))
        else:
            raise KeyError(f"no parameter for {name}")


def decode_bytes_per_step(config: ModelConfig, context_len: int, dtype_bytes: int = 2,
                          mxfp4_experts: bool = True) -> int:
    """Bytes a batch-1 decode step reads from memory at `context_len` tokens of context (see the module doc);
    the experts' weights as MXFP4, or at `dtype_bytes` when held dense."""
    h, i, e, k = config.hidden_size, config.intermediate_size, config.num_local_experts, config.num_experts_per_tok
    expert_weights = h * 2 * i + i * h
    expert_biases = 2 * i + h
    dense = config.num_params - config.num_hidden_layers * e * (expert_weights + expert_biases) \
        - config.vocab_size * h  # every non-expert parameter but the embedding table (one row is read)
    weight_bytes = MXFP4_BITS / 8 if mxfp4_experts else dtype_bytes
    experts = config.num_hidden_layers * k * (expert_weights * weight_bytes + expert_biases * dtype_bytes)
    kv_per_token = 2 * config.num_key_value_heads * config.head_dim * dtype_bytes
    kv = sum(min(context_len, config.window(layer) or context_len) for layer in range(config.num_hidden_layers))
    return int((dense + h) * dtype_bytes + experts + kv * kv_per_token)


def hbm_bytes_per_s(device: torch.device | str) -> float | None:
    """Peak memory bandwidth of a CUDA device: from its memory clock and bus width, else by name, else None."""
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8  # double data rate
    return next((rate for name, rate in HBM_BYTES_PER_S.items() if name in props.name), None)


# A dry run's shape: the preset's structure (MXFP4 experts, alternating windows, the real vocabulary), tiny.
DRY_RUN_SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=4096)
DRY_RUN_BATCH1 = (64, 8)  # prompt tokens, decoded tokens


def preset_problem(preset: str, systems: list[str], moe_weights: str = "auto") -> str | None:
    """Why `systems` cannot run at `preset` on one GPU, or None (both CLIs ask before building anything)."""
    allowed = PRESET_SYSTEMS[preset]
    others = [s for s in systems if s not in allowed]
    if others:
        return (f"--preset {preset} runs {', '.join(allowed)}, not {', '.join(others)}: "
                f"its experts fit one GPU packed only")
    if moe_weights == "dense" and "engine_dense" not in allowed:
        return f"--preset {preset} with --moe-weights dense: its experts fit one GPU packed only"
    return None


def build_preset_engine(preset: str, engine_options: dict[str, Any], dry_run: bool = False,
                        system: str = "engine") -> Any:
    """An LLMEngine over a random model of `preset`'s shape (DRY_RUN_SHAPE if `dry_run`) built on its device, with
    engine system `system`'s options (ENGINE_SYSTEMS) over `engine_options`."""
    from engine.llm_engine import LLMEngine

    config, base = _preset_configs(preset, engine_options, dry_run)
    engine_config = dataclasses.replace(base, **ENGINE_SYSTEMS[system])
    return LLMEngine(engine_config, build_engine_model(config, engine_config.device, PRESET_DTYPE,
                                                       engine_config.kernels, moe_weights=engine_config.moe_weights))


def _preset_configs(preset: str, engine_options: dict[str, Any], dry_run: bool) -> tuple[Any, EngineConfig]:
    """`preset`'s model config (DRY_RUN_SHAPE's if `dry_run`) and the engine's over `engine_options`."""
    config = preset_config(**{**PRESETS[preset], **(DRY_RUN_SHAPE if dry_run else {})})
    return config, EngineConfig(Path(f"preset-{preset}"), dtype=PRESET_DTYPE, **engine_options)


def run_preset_system(system: str, workload: Workload, *, batch_size: int, engine_options: dict[str, Any],
                      dry_run: bool = False, preset: str = "20b") -> tuple[BenchResult, dict]:
    """One system on one workload at a preset's shape (PRESETS), its model built fresh on the GPU and freed
    after.

    dry_run: the same code at DRY_RUN_SHAPE on any device (a check of the harness, not a measurement)."""
    from engine.bench_hf import run_generate, run_generate_batch

    config, engine_config = _preset_configs(preset, engine_options, dry_run)
    device, dtype = engine_config.device, PRESET_DTYPE
    on_gpu = device.startswith("cuda")
    if not on_gpu and not dry_run:
        raise ValueError(f"--preset {preset} is built on the GPU: pass --device cuda")
    problem = preset_problem(preset, [system], engine_options.get("moe_weights", "auto"))
    if problem:
        raise ValueError(problem)
    _release_gpu_memory()  # anything of the previous system's model left in a reference cycle goes first
    try:
        if system in ENGINE_SYSTEMS:
            engine = build_preset_engine(preset, engine_options, dry_run, system)
            result = run_backend(system, engine, workload)
            held = engine.describe()  # what the options came to: experts packed or dense, the KV cache left
            stats = {**engine.stats(), "mxfp4_experts": held["mxfp4_experts"], "kv_cache_gb": held["kv_cache_gb"],
                     "num_blocks": held["num_blocks"], "kv_cache_dtype": held["kv_cache_dtype"],
                     "kv_layout": held["kv_layout"]}
            # the workload's stats, before the batch-1 run adds its steps
            prompt_len, num_tokens = DRY_RUN_BATCH1 if dry_run else (BATCH1_PROMPT, BATCH1_TOKENS)
            batch1 = batch1_decode(engine, hbm_bytes_per_s(device) if on_gpu else None, prompt_len, num_tokens)
            return result, {**stats, **batch1}
        if system in ("hf_generate", "hf_generate_batch"):
            if system == "hf_generate":
                return run_generate(build_hf_model(config, device, dtype), workload, batch_size), {}
            model = build_hf_model(config, device, dtype, attn_implementation="paged|eager")
            return run_generate_batch(model, workload, kv_cache_gb=8.0 if on_gpu else 0.05), {}
        raise AssertionError(f"{system!r} passed preset_problem but has no branch here")
    finally:
        _release_gpu_memory()


def _release_gpu_memory() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def batch1_decode(engine: Any, bandwidth: float | None, prompt_len: int = BATCH1_PROMPT,
                  num_tokens: int = BATCH1_TOKENS) -> dict:
    """Seconds per decoded token of one request alone (prefill excluded), and with the device's `bandwidth`
    (bytes/s) the roofline's for its context."""
    prompt = [1000 + t % 50000 for t in range(prompt_len)]
    engine.add_request("batch1", prompt, SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True))
    engine.step()  # the prefill, and the first token
    start = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    per_token = (time.perf_counter() - start) / max(steps, 1)
    context = prompt_len + num_tokens // 2
    stats: dict[str, Any] = {"batch1_s_per_token": per_token, "batch1_context": context}
    if bandwidth:
        step_bytes = decode_bytes_per_step(engine.model_config, context,
                                           mxfp4_experts=engine.describe()["mxfp4_experts"])
        stats.update(roofline_bytes_per_step=step_bytes, hbm_bytes_per_s=bandwidth,
                     roofline_s_per_token=step_bytes / bandwidth)
    return stats


def batch1_reports(runs: list[tuple[str, dict]]) -> list[str]:
    """A batch-1 line for each engine system of (system, stats) runs that measured one, from its first run."""
    firsts: dict[str, dict] = {}
    for system, stats in runs:
        if "batch1_s_per_token" in stats:
            firsts.setdefault(system, stats)
    return [batch1_report(stats, system) for system, stats in firsts.items()]


def batch1_report(stats: dict, system: str = "engine") -> str:
    """One line: batch-1 decode speed and how far it is from the roofline (`system` named unless the engine)."""
    label = "batch-1 decode" if system == "engine" else f"batch-1 decode ({system})"
    line = (f"{label}: {stats['batch1_s_per_token'] * 1e3:.2f} ms/token "
            f"({1 / stats['batch1_s_per_token']:.0f} tok/s) at ~{stats['batch1_context']} tokens of context")
    if "roofline_s_per_token" in stats:
        ratio = stats["batch1_s_per_token"] / stats["roofline_s_per_token"]
        line += (f"; roofline {stats['roofline_s_per_token'] * 1e3:.2f} ms/token "
                 f"({stats['roofline_bytes_per_step'] / 1e9:.2f} GB read per step at "
                 f"{stats['hbm_bytes_per_s'] / 1e12:.2f} TB/s): {ratio:.2f}x the roofline")
    return line
