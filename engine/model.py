"""gpt-oss over a flat batch of tokens from many sequences, reading and writing a paged KV cache.

Numerically the transformers `GptOssForCausalLM` (eager): alternating sliding/full
attention with a learned per-head sink, YaRN RoPE, top-k MoE with a clamped SwiGLU.
Parameter names are the HF checkpoint's, so loading is one loop (engine.loader).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from engine import batch_invariant as invariant
from engine import mxfp4_words
from engine.attention import AttentionMetadata, paged_attention, write_kv
from engine.config import ModelConfig
from engine.experts import GptOssExperts
from engine.kv_cache import bytes_per_block
from engine.kv_layout import KVLayout

KVCache = tuple[Tensor, Tensor]  # k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]


class Linear(nn.Linear):
    """nn.Linear that multiplies in fixed row tiles when `batch_invariant` (engine.batch_invariant)."""

    batch_invariant = False

    def forward(self, x: Tensor) -> Tensor:
        if self.batch_invariant:
            return invariant.linear(x, self.weight, self.bias)
        return super().forward(x)


class RMSNorm(nn.Module):
    """kernels="triton" runs it as one launch (engine.kernels.fused), and `add_forward` with the residual add."""

    def __init__(self, dim: int, eps: float, kernels: str = "torch") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps
        self.fused: ModuleType | None = _fused_kernels(kernels)

    def forward(self, x: Tensor) -> Tensor:
        if self.fused is not None:
            return self.fused.rms_norm(x, self.weight, self.eps)
        t = x.float()
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * t).to(x.dtype)

    def add_forward(self, x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
        """The residual stream x + delta, and its norm."""
        if self.fused is not None:
            return self.fused.add_rms_norm(x, delta, self.weight, self.eps)
        x = x + delta
        return x, self(x)


def _fused_kernels(kernels: str) -> ModuleType | None:
    if kernels != "triton":
        return None
    from engine.kernels import fused  # triton is an optional extra: imported only when asked for

    return fused


def rope_inv_freq(config: ModelConfig) -> tuple[Tensor, float]:
    """Inverse frequencies [head_dim / 2] (fp32, CPU) and the cos/sin scale: YaRN or plain RoPE."""
    p, dim, base = config.rope_parameters, config.head_dim, config.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / dim)
    if p.get("rope_type", "default") == "default":
        return 1.0 / pos_freqs, 1.0
    if p["rope_type"] != "yarn":
        raise ValueError(f"unsupported rope_type {p['rope_type']!r} (gpt-oss uses 'yarn')")
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or config.max_position_embeddings / original
    scaling = p.get("attention_factor")
    if scaling is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        scaling = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all) if mscale and mscale_all \
            else _yarn_mscale(factor)
    # NTK by parts: dimensions that rotate fast keep their frequency, slow ones are interpolated.
    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = correction_dim(p.get("beta_fast") or 32), correction_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low or 0.001)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(scaling)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class RotaryEmbedding(nn.Module):
    """cos/sin per position, computed per step from the inverse frequencies (no table, no buffer)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.inv_freq, self.scaling = rope_inv_freq(config)  # plain tensor: survives meta-device init

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions: [T] -> cos, sin: [T, head_dim / 2] fp32."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq
        return freqs.cos() * self.scaling, freqs.sin() * self.scaling


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [T, heads, head_dim]; cos, sin: [T, head_dim / 2]. Rotates the two halves of each head."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class GptOssAttention(nn.Module):
    """kernels="triton" runs the paged attention on the Triton kernels of engine.kernels.attention."""

    def __init__(self, config: ModelConfig, layer_idx: int, kernels: str = "torch") -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = Linear(h, self.num_heads * d)
        self.k_proj = Linear(h, self.num_kv_heads * d)
        self.v_proj = Linear(h, self.num_kv_heads * d)
        self.o_proj = Linear(self.num_heads * d, h)
        self.sinks = nn.Parameter(torch.empty(self.num_heads))
        self.sliding_window = config.window(layer_idx)
        self.scale = d**-0.5
        self.batch_invariant = False  # GptOssModel.set_batch_invariant
        self.paged_attention = paged_attention
        self.fused = _fused_kernels(kernels)
        self.qkv: tuple[Tensor, Tensor] | None = None  # tie_projections: q, k, v's weights and biases in one each
        if kernels == "triton":
            from engine.kernels.attention import triton_paged_attention  # triton is an optional extra

            self.paged_attention = triton_paged_attention

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> Tensor:
        """x: [T, hidden] -> [T, hidden]; writes this step's K/V into kv_cache first."""
        q = self.project(x, cos, sin, meta.for_layer(self.sliding_window).slot_mapping, kv_cache)
        return self.o_proj(self.attend(q, meta, kv_cache))

    def project(self, x: Tensor, cos: Tensor, sin: Tensor, slot_mapping: Tensor, kv_cache: KVCache) -> Tensor:
        """x: [T, hidden] -> rotated queries [T, heads, head_dim]; writes K/V at slot_mapping (the attention's
        inputs: the part a piecewise CUDA graph captures, as it reads no step shape but T)."""
        num_tokens = x.shape[0]
        if self.fused is not None and self._tied():
            q, k, v = self._project_tied(x)
        else:
            q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
            k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
            v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.fused is not None:
            return self.fused.rope_write_kv(q, k, v, cos, sin, kv_cache[0], kv_cache[1], slot_mapping)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        write_kv(kv_cache[0], kv_cache[1], k, v, slot_mapping)
        return q

    def tie_projections(self) -> None:
        """Hold q, k and v's weights in one tensor and their biases in another, the six parameters views of
        them (loading writes through), so the Triton path projects in one GEMM, not three launches."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight.data for p in projections])
        bias = torch.cat([p.bias.data for p in projections])
        start = 0
        for projection in projections:
            rows = projection.weight.shape[0]
            projection.weight.data, projection.bias.data = weight[start:start + rows], bias[start:start + rows]
            start += rows
        self.qkv = weight, bias

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]  # nn.Module's own signature
        """nn.Module._apply (to(), half(), to_empty()...) makes each parameter a tensor of its own: tie them again,
        so a moved model keeps one GEMM and holds no stale copy."""
        super()._apply(fn, recurse)
        if self.qkv is not None:
            self.tie_projections()
        return self

    def _tied(self) -> bool:
        # parameters replaced since (assigned anew, not through _apply) fall back to three projections; a
        # captured CUDA graph never runs this (its replays skip Python)
        if self.qkv is None:
            return False
        weight, bias = self.qkv
        start = 0
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            if projection.weight.data_ptr() != weight[start].data_ptr() \
                    or projection.bias.data_ptr() != bias[start:].data_ptr():
                return False
            start += projection.weight.shape[0]
        return True

    def _project_tied(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        assert self.qkv is not None  # for mypy: _tied() checked it
        weight, bias = self.qkv
        linear = invariant.linear if self.q_proj.batch_invariant else nn.functional.linear
        qkv = linear(x, weight, bias)
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_width, kv_width, kv_width], dim=1)
        shape = (x.shape[0], -1, self.head_dim)
        return q.view(shape), k.view(shape), v.view(shape)

    def attend(self, q: Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> Tensor:
        """q: [T, heads, head_dim] -> [T, heads * head_dim] over the paged cache (depends on the step's shape)."""
        o = self.paged_attention(q, kv_cache[0], kv_cache[1], meta.for_layer(self.sliding_window), sinks=self.sinks,
                                 sliding_window=self.sliding_window, scale=self.scale,
                                 batch_invariant=self.batch_invariant)  # [T, heads, head_dim]
        return o.reshape(q.shape[0], -1)


class GptOssRouter(Linear):
    """The experts' scores ([experts, hidden] weight and bias, as the checkpoint names them) and the top k."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config.hidden_size, config.num_local_experts)
        self.top_k = config.num_experts_per_tok

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: [T, hidden] -> expert ids [T, top_k], their weights [T, top_k] (softmax over the top k)."""
        top_logits, expert_ids = torch.topk(self(x), self.top_k, dim=-1)
        return expert_ids, torch.softmax(top_logits, dim=-1)


class GptOssMLP(nn.Module):
    def __init__(self, config: ModelConfig, kernels: str = "torch") -> None:
        super().__init__()
        self.router = GptOssRouter(config)
        self.experts = GptOssExperts(config, kernels)

    def forward(self, x: Tensor) -> Tensor:
        expert_ids, weights = self.router.route(x)
        return self.experts(x, expert_ids, weights)

    def add_forward(self, residual: Tensor, x: Tensor, norm: RMSNorm) -> tuple[Tensor, Tensor]:
        """The residual stream after the MoE, residual + forward(x), and `norm` of it (the next layer's input norm,
        or the model's final one)."""
        if self.experts.triton_moe is not None:  # the top-k in the routing kernel, the add and norm in the sum's
            return self.experts.from_logits_norm(x, self.router(x), self.router.top_k, residual, norm.weight, norm.eps)
        residual = residual + self(x)
        return residual, norm(residual)


class GptOssDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int, kernels: str = "torch") -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.self_attn = GptOssAttention(config, layer_idx, kernels)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.mlp = GptOssMLP(config, kernels)

    def forward(self, x: Tensor, h: Tensor, cos: Tensor, sin: Tensor, meta: AttentionMetadata, kv_cache: KVCache,
                next_norm: RMSNorm) -> tuple[Tensor, Tensor]:
        """Residual stream x and its input norm h [T, hidden] -> the layer's output and `next_norm` of it."""
        q = self.before_attention(h, cos, sin, meta.for_layer(self.self_attn.sliding_window).slot_mapping, kv_cache)
        return self.after_attention(x, self.self_attn.attend(q, meta, kv_cache), next_norm)

    def before_attention(self, h: Tensor, cos: Tensor, sin: Tensor, slot_mapping: Tensor,
                         kv_cache: KVCache) -> Tensor:
        """The residual stream's input norm h [T, hidden] (made by the layer before: see after_attention) -> the
        attention's queries [T, heads, head_dim]; writes K/V."""
        return self.self_attn.project(h, cos, sin, slot_mapping, kv_cache)

    def after_attention(self, x: Tensor, o: Tensor, next_norm: RMSNorm) -> tuple[Tensor, Tensor]:
        """Residual stream x and attention output o: [T, heads * head_dim] -> the layer's output [T, hidden] and
        `next_norm` of it: the next layer's input norm (or the model's final norm) runs in the launch that sums
        the experts, one launch a layer fewer."""
        x, h = self.post_attention_layernorm.add_forward(x, self.self_attn.o_proj(o))
        return self.mlp.add_forward(x, h, next_norm)


class GptOssDecoder(nn.Module):
    """Embedding, decoder layers, final norm (the checkpoint's `model.*`)."""

    def __init__(self, config: ModelConfig, kernels: str = "torch") -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GptOssDecoderLayer(config, i, kernels) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.rotary_emb = RotaryEmbedding(config)


class GptOssModel(nn.Module):
    """gpt-oss for causal LM: `forward` gives hidden states, `compute_logits` the logits.

    kernels: "torch" (plain torch ops) or "triton" (engine.kernels; EngineConfig.kernels).
    """

    def __init__(self, config: ModelConfig, kernels: str = "torch") -> None:
        super().__init__()
        self.config = config
        self.model = GptOssDecoder(config, kernels)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def to_empty(self, *, device: torch.device | str | int | None, recurse: bool = True) -> GptOssModel:
        """nn.Module.to_empty, then (on the Triton path) each attention's q, k, v held in one tensor to load into."""
        super().to_empty(device=device, recurse=recurse)
        for module in self.modules():
            if isinstance(module, GptOssAttention) and module.fused is not None:
                module.tie_projections()
        return self

    def pack_expert_words(self) -> int:
        """On the Triton path in bf16, on a device whose kernels decode words (sm_90 and newer, or the interpreter):
        every MoE projection the word layout can hold re-packed as engine.mxfp4_words (GptOssExperts.pack_words);
        how many were. Call after the weights are loaded."""
        experts = [m for m in self.modules() if isinstance(m, GptOssExperts) and m.triton_moe is not None]
        weight = self.lm_head.weight
        if not experts or weight.dtype != torch.bfloat16 or not mxfp4_words.decodable_on(weight.device):
            return 0
        return sum(module.pack_words() for module in experts)

    def set_batch_invariant(self, on: bool) -> None:
        """Compute every row the same way in any batch, chunk or decode step (EngineConfig.deterministic)."""
        for module in self.modules():
            if isinstance(module, (Linear, GptOssAttention, GptOssExperts)):
                module.batch_invariant = on

    def forward(self, input_ids: Tensor, meta: AttentionMetadata, kv_caches: list[KVCache]) -> Tensor:
        """input_ids: [T] (the step's new tokens, sequences contiguous) -> final-norm hidden [T, hidden]."""
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(f"{len(kv_caches)} KV caches for {len(self.model.layers)} layers")
        x, cos, sin = self.embed(input_ids, meta.positions)
        layers = self.decoder_layers
        h = layers[0].input_layernorm(x)
        for index, (layer, kv_cache) in enumerate(zip(layers, kv_caches)):
            x, h = layer(x, h, cos, sin, meta, kv_cache, self.norm_after(index))
        return h

    @property
    def decoder_layers(self) -> list[GptOssDecoderLayer]:
        return cast(list[GptOssDecoderLayer], list(self.model.layers))

    def norm_after(self, index: int) -> RMSNorm:
        """The norm of layer `index`'s output: the next layer's input norm, the final norm after the last."""
        layers = self.model.layers  # indexed, not copied: the forward asks once a layer
        return cast(RMSNorm, layers[index + 1].input_layernorm if index + 1 < len(layers) else self.model.norm)

    def embed(self, input_ids: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """input_ids, positions: [T] -> embeddings [T, hidden], RoPE cos and sin [T, head_dim / 2]."""
        return (self.model.embed_tokens(input_ids), *self.model.rotary_emb(positions))

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden: [N, hidden] -> logits [N, vocab] fp32."""
        return self.lm_head(hidden).float()


def kv_cache_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype,
                             layout: KVLayout | None = None) -> int:
    """Bytes one cache block takes (K and V) over the layers a block spans: all of them (uniform layout, the
    default), or one group's (hybrid: engine.kv_layout)."""
    num_layers = config.num_hidden_layers if layout is None else layout.num_caches
    return bytes_per_block(block_size, num_layers, config.num_key_value_heads, config.head_dim, dtype)


def allocate_kv_cache(config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device | str, layout: KVLayout | None = None) -> list[KVCache]:
    """A (k_cache, v_cache) pair for each layer, each [num_blocks, block_size, num_kv_heads, head_dim]: a pair of
    its own (uniform layout, the default), or shared by a sliding and a full layer (hybrid: engine.kv_layout).

    Zeroed: attention reads (and masks) slots no token has written yet, and 0 * NaN garbage would be NaN.
    """
    cache_index = range(config.num_hidden_layers) if layout is None else layout.cache_index
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    pairs = [(_zeroed(shape, dtype, device), _zeroed(shape, dtype, device)) for _ in range(max(cache_index) + 1)]
    return [pairs[index] for index in cache_index]


def _zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """Zeroed memory; on CPU from calloc (numpy's zeros), whose untouched pages stay unmapped.

    torch.zeros writes every byte, so a CPU run's 2 GB default cache was resident from the start,
    used or not (two test processes with a few engines each ran a 24 GB machine out of memory).
    """
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    num_bytes = math.prod(shape) * dtype.itemsize
    return torch.from_numpy(np.zeros(num_bytes, dtype=np.uint8)).view(dtype).view(shape)
