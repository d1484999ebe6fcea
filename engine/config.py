"""Model config (read from an HF gpt-oss config.json) and the engine's own knobs.

`ModelConfig` is a frozen, plain copy of the fields the engine needs, so the
rest of the engine never touches a transformers config object. transformers'
`GptOssConfig` does the parsing: it normalises the old `rope_scaling`/`rope_theta`
format of the published checkpoints into `rope_parameters` and fills defaults.
What makes a directory a gpt-oss checkpoint is engine.model_dir's (no torch there).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import GptOssConfig

from engine.api import CPU_MAX_NUM_SEQS, DEFAULT_MAX_NUM_BATCHED_TOKENS, ModelLoadError
from engine.attention import FP8
from engine.device import resolve_device, resolve_kernels
from engine.device_sampler import sampler_temporary_bytes
from engine.model_dir import read_config_json

DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
          "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}
SLIDING, FULL = "sliding_attention", "full_attention"
# The KV cache's element type (EngineConfig.kv_cache_dtype): "auto" holds K and V in the model's dtype; "fp8" in
# float8 e4m3, a byte an element: twice a bf16 cache's tokens in the same memory and half the bytes attention
# reads, each value rounded to 3 mantissa bits and saturated at +-448 (no scale: vLLM's `--kv-cache-dtype fp8`
# without calibrated scales).
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {"auto": None, "fp8": FP8}


@dataclass(frozen=True)
class ModelConfig:
    """The shape and numerics of one gpt-oss model (any size: the 2-layer test model .. 120b)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_local_experts: int
    num_experts_per_tok: int
    sliding_window: int | None
    layer_types: tuple[str, ...]
    rope_theta: float
    rope_parameters: dict = field(hash=False)  # rope_type, factor, beta_fast, beta_slow, original_max_..., truncate
    rms_norm_eps: float = 1e-5
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    max_position_embeddings: int = 131072
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    torch_dtype: torch.dtype = torch.bfloat16  # the checkpoint's dtype ("auto" resolves to it)
    quant_method: str | None = None  # "mxfp4" for the published checkpoints

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        unknown = set(self.layer_types) - {SLIDING, FULL}
        if unknown:
            raise ValueError(f"unknown layer types {sorted(unknown)}; expected {SLIDING!r} or {FULL!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        """Read `model_dir/config.json`; ModelLoadError if it is missing or not a gpt-oss config."""
        model_dir = Path(model_dir)
        read_config_json(model_dir)
        try:
            hf = GptOssConfig.from_pretrained(model_dir)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ModelLoadError(f"--model {model_dir}: config.json is not a valid gpt-oss config: {exc}") from exc
        return cls.from_hf(hf)

    @classmethod
    def from_hf(cls, hf: GptOssConfig) -> ModelConfig:
        """Copy the fields of a transformers `GptOssConfig`."""
        rope = dict(hf.rope_parameters or {})
        eos = hf.eos_token_id
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        quant = getattr(hf, "quantization_config", None) or {}
        return cls(
            vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, num_hidden_layers=hf.num_hidden_layers,
            num_attention_heads=hf.num_attention_heads, num_key_value_heads=hf.num_key_value_heads,
            head_dim=hf.head_dim, intermediate_size=hf.intermediate_size,
            num_local_experts=hf.num_local_experts, num_experts_per_tok=hf.num_experts_per_tok,
            sliding_window=hf.sliding_window, layer_types=tuple(hf.layer_types or ()),
            rope_theta=float(rope.get("rope_theta", 150000.0)), rope_parameters=rope,
            rms_norm_eps=hf.rms_norm_eps,
            # transformers 5.17 (the GPU image's) keeps these as constants of its modeling code; 5.24 has them
            swiglu_alpha=getattr(hf, "swiglu_alpha", cls.swiglu_alpha),
            swiglu_limit=getattr(hf, "swiglu_limit", cls.swiglu_limit),
            max_position_embeddings=hf.max_position_embeddings, eos_token_ids=eos_ids,
            pad_token_id=hf.pad_token_id, bos_token_id=hf.bos_token_id,
            torch_dtype=_checkpoint_dtype(hf.dtype), quant_method=quant.get("quant_method"),
        )

    def is_sliding(self, layer: int) -> bool:
        """True if `layer` attends to the last `sliding_window` positions only."""
        return self.layer_types[layer] == SLIDING and self.sliding_window is not None

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None for a full-attention layer."""
        return self.sliding_window if self.is_sliding(layer) else None

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings and lm_head included)."""
        h, d, e, i = self.hidden_size, self.head_dim, self.num_local_experts, self.intermediate_size
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        attn = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h + self.num_attention_heads
        moe = e * h + e + e * (h * 2 * i + 2 * i + i * h + h)
        return 2 * self.vocab_size * h + self.num_hidden_layers * (attn + moe + 2 * h) + h


KERNELS = ("torch", "triton")
MOE_WEIGHTS = ("auto", "mxfp4", "dense")


@dataclass
class EngineConfig:
    """Engine knobs; the scheduler side reads these too."""

    model_dir: Path
    dtype: torch.dtype | str = "auto"  # "auto": the checkpoint's dtype
    device: str = "cpu"  # "cpu", "cuda[:N]" or "auto" (CUDA when present), resolved on construction
    block_size: int = 16
    kv_cache_gb: float = 2.0  # the KV cache on CPU
    gpu_memory_utilization: float = 0.9  # on CUDA: the KV cache takes what this fraction leaves (engine.device)
    cuda_graphs: bool = True  # on CUDA with the Triton kernels: steps replay captured graphs (engine.cuda_graphs)
    # The host schedules step N+1 while the device runs step N (engine.llm_engine). None: on CUDA only.
    async_scheduling: bool | None = None
    max_num_seqs: int = CPU_MAX_NUM_SEQS  # `load_backend` without one: default_max_num_seqs(device)
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    seed: int = 0
    enable_prefix_caching: bool = True
    # "torch": plain torch ops (any device). "triton": the Triton kernels of engine/kernels
    # (attention, MoE); on CPU tensors they run in Triton's interpreter (TRITON_INTERPRET=1).
    # "auto": triton on CUDA when it is importable, else torch.
    kernels: str = "torch"
    # An MXFP4 checkpoint's experts: "mxfp4" keeps them packed (4.25 bits a weight; decoded inside the Triton
    # MoE kernel, or per hit expert and step on the torch path); "dense" dequantises them on load into the
    # model's dtype (gpt-oss-20b: ~41 GB in bf16); "auto" keeps them packed: the only way a 20b fits a
    # 24 GB machine, and no GPU has measured which is faster there.
    moe_weights: str = "auto"
    # Batch-invariant numerics (engine.batch_invariant): a request's logits are the same bits whatever else
    # shares its steps, however its prompt is chunked, with or without prefix-cache hits or preemption.
    # Off by default: on the CPU torch path it costs throughput (README: the measured cost).
    deterministic: bool = False
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES
    # The sliding layers' blocks given back once they leave the window (engine.kv_layout), for models with as
    # many sliding as full layers (gpt-oss): about twice the tokens in the same memory. False: every layer
    # keeps every token (the uniform layout).
    hybrid_kv_cache: bool = True

    def __post_init__(self) -> None:
        self.model_dir = Path(self.model_dir)
        self.device = resolve_device(self.device)
        self.kernels = resolve_kernels(self.kernels, self.device)
        if self.kernels not in KERNELS:
            raise ValueError(f"unknown kernels {self.kernels!r}; use one of {', '.join(KERNELS)}")
        if self.moe_weights not in MOE_WEIGHTS:
            raise ValueError(f"unknown moe_weights {self.moe_weights!r}; use one of {', '.join(MOE_WEIGHTS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; use one of {', '.join(KV_CACHE_DTYPES)}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_gb <= 0:
            raise ValueError(f"kv_cache_gb must be > 0, got {self.kv_cache_gb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")

    @property
    def step_tokens(self) -> int:
        """The scheduler's token budget per step (also the largest piecewise graph)."""
        return step_token_budget(self.max_num_batched_tokens, self.max_num_seqs)

    @property
    def captures_graphs(self) -> bool:
        """Whether live CUDA graphs are captured: CUDA and the Triton path (the torch MoE reads expert
        counts back to the host)."""
        return self.cuda_graphs and self.device.startswith("cuda") and self.kernels == "triton"

    def resolve_dtype(self, model_config: ModelConfig) -> torch.dtype:
        """The dtype the model runs in: `dtype`, or the checkpoint's for "auto"."""
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        if self.dtype == "auto":
            return model_config.torch_dtype
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; use 'auto' or one of {sorted(DTYPES)}")
        return DTYPES[self.dtype]

    def cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The KV cache's element type for a model running in `model_dtype` (kv_cache_dtype)."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype] or model_dtype





def step_token_budget(max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Tokens one step may hold: at least one a sequence, so a full decode batch always fits."""
    return max(max_num_batched_tokens, max_num_seqs)


def held_model_config(model_config: ModelConfig, moe_weights: str) -> ModelConfig:
    """`model_config` as the model is built for EngineConfig.moe_weights: with MXFP4 experts held dense,
    as for a checkpoint with dense experts (the loader then dequantises them)."""
    if model_config.quant_method == "mxfp4" and moe_weights == "dense":
        return replace(model_config, quant_method=None)
    return model_config


def _checkpoint_dtype(dtype: object) -> torch.dtype:
    """The config's dtype as a torch.dtype; bf16 when absent (the published checkpoints omit it)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    return torch.bfloat16


def activation_bytes(config: ModelConfig, num_tokens: int) -> int:
    """A bound on a forward's transient memory over `num_tokens` tokens (no logits): a few hidden-sized fp32
    buffers a token, two copies of its queries, keys and values (projected, rotated), and the MoE's
    intermediate rows. tests/engine/test_graph_memory.py holds a piece and a decode step to it."""
    hidden = num_tokens * config.hidden_size * 4 * 8
    qkv_width = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    attention = num_tokens * qkv_width * 4 * 2
    moe = num_tokens * config.num_experts_per_tok * config.intermediate_size * 2 * 4 * 2
    return hidden + attention + moe


def sampling_reserve_bytes(config: ModelConfig, max_num_seqs: int) -> int:
    """For every sequence sampled, its fp32 logits and the sampler's temporaries
    (engine.device_sampler.sampler_temporary_bytes)."""
    return max_num_seqs * config.vocab_size * 4 + sampler_temporary_bytes(max_num_seqs, config.vocab_size)
