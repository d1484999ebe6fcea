"""A training-speed forward pass over a transformers `GptOssForCausalLM`'s own parameters.

The same math as transformers' eager gpt-oss (tests/trainer compare the two), written
for small models on CPU: attention through `scaled_dot_product_attention` with the
per-head sink as one extra key whose logit is exactly the sink and whose value is zero
(full layers: the causal flash kernel; sliding layers: blocks of `window` queries
against the keys that can reach them), and the mixture of
experts computed densely (every expert on every token, weighted by the top-k router
weights; with a handful of tiny experts that beats gathering tokens per expert).
Right padding needs no mask: causal attention never lets a real token see a pad.

Rows that share a prefix (training tasks come in groups rendered with the same system and
developer messages) can have it computed once: `hidden_states(model, ids, prefix)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GptOssForCausalLM


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = torch.chunk(x, 2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def _full_attention(q, k, v, sinks: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention with sinks through the flash kernel: one extra position 0 whose key
    gives every query the logit `sink` (an extra query coordinate fixed at 1) and whose value
    is 0; each query, moved one position on, still sees exactly its causal keys."""
    # q, k, v: [batch, heads, time, head_dim]
    batch, heads, _, _ = q.shape
    q = F.pad(F.pad(q, (0, 1), value=1.0), (0, 0, 1, 0))
    sink_key = F.pad((sinks / scale)[:, None, None].expand(heads, 1, 1), (k.shape[-1], 0))
    k = torch.cat([sink_key.expand(batch, -1, -1, -1), F.pad(k, (0, 1))], dim=2)
    v = F.pad(v, (0, 1, 1, 0))  # the flash kernel wants values as wide as keys
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)[:, :, 1:, :-1]


def _window_bias(window: int, sinks: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[heads, blocks, window, 2 * window + 1]: query j of block b sees keys (b-1)W+m, m in
    (j, W + j], that exist; the last column is the sink."""
    j = torch.arange(window, device=sinks.device)[:, None]
    m = torch.arange(2 * window, device=sinks.device)[None, :]
    allowed = ((m > j) & (m <= window + j))[None].expand(num_blocks, -1, -1).clone()
    allowed[0, :, :window] = False  # block 0 has no previous block
    bias = torch.zeros(allowed.shape, device=sinks.device).masked_fill(~allowed, float("-inf"))
    bias = bias[None].expand(sinks.shape[0], -1, -1, -1)
    return torch.cat([bias, sinks[:, None, None, None].expand(-1, num_blocks, window, 1)], dim=-1)


def _sliding_attention(q, k, v, sinks: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    """Sliding-window attention with sinks in blocks of `window` queries, each against the
    2 * window keys that can reach it (and a zero sink key): O(time * window)."""
    batch, heads, time, dim = q.shape
    num_blocks = -(-time // window)
    pad = num_blocks * window - time
    q = F.pad(q, (0, 0, 0, pad)).view(batch, heads, num_blocks, window, dim)
    k, v = (F.pad(x, (0, 0, window, pad + 1)) for x in (k, v))  # a previous block, the sink's zero key last

    def blocks(x):  # [batch, heads, blocks, 2 * window + 1, dim]
        windows = x[:, :, :-1].unfold(2, 2 * window, window).transpose(-1, -2)
        return torch.cat([windows, x[:, :, -1:, None].expand(-1, -1, num_blocks, 1, -1)], dim=3)

    out = F.scaled_dot_product_attention(q, blocks(k), blocks(v), attn_mask=_window_bias(window, sinks, num_blocks),
                                         scale=scale)
    return out.reshape(batch, heads, num_blocks * window, dim)[:, :, :time]


def _suffix_attention(q, k, v, sinks: torch.Tensor, scale: float, window: int | None, start: int) -> torch.Tensor:
    """Attention of queries at positions start.. over all keys before them (the shared prefix's
    keys, broadcast over the batch, then the suffix's own), with sinks: an explicit mask, a zero
    key and value whose logit is the sink."""
    batch, heads, time, dim = q.shape
    query = torch.arange(start, start + time, device=q.device)[:, None]
    key = torch.arange(k.shape[2], device=q.device)[None, :]
    allowed = (key <= query) if window is None else (key <= query) & (query - key < window)
    bias = torch.zeros(allowed.shape, device=q.device).masked_fill(~allowed, float("-inf"))
    bias = torch.cat([bias[None].expand(heads, -1, -1), sinks[:, None, None].expand(-1, time, 1)], dim=-1)
    k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None], scale=scale)


def _attention(attn, x: torch.Tensor, cos, sin, window: int | None, past=None):
    """Self-attention of `x` [batch, time, hidden]; with `past` (the shared prefix's keys and
    values, batch 1), `x` continues that prefix. Returns the output and this call's keys
    and values."""
    batch, time, _ = x.shape
    d = attn.head_dim
    q = attn.q_proj(x).view(batch, time, -1, d).transpose(1, 2)
    k = attn.k_proj(x).view(batch, time, -1, d).transpose(1, 2)
    v = attn.v_proj(x).view(batch, time, -1, d).transpose(1, 2)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if past is not None:
        start = past[0].shape[2]
        keys, values = (torch.cat([shared.expand(batch, -1, -1, -1), own], dim=2) for shared, own in zip(past, (k, v)))
        out = _suffix_attention(q, keys, values, attn.sinks, attn.scaling, window, start)
    elif window is None or window >= time:
        out = _full_attention(q, k, v, attn.sinks, attn.scaling)
    else:
        out = _sliding_attention(q, k, v, attn.sinks, attn.scaling, window)
    return attn.o_proj(out.transpose(1, 2).reshape(batch, time, -1)), (k, v)


def _experts(mlp, x: torch.Tensor) -> torch.Tensor:
    # x: [tokens, hidden]
    router, experts = mlp.router, mlp.experts
    logits = F.linear(x, router.weight, router.bias)  # [tokens, experts]
    top, indices = torch.topk(logits, router.top_k, dim=-1)
    weights = torch.zeros_like(logits).scatter(1, indices, torch.softmax(top, dim=-1))
    gate_up = torch.einsum("th,ehf->etf", x, experts.gate_up_proj) + experts.gate_up_proj_bias[:, None]
    gate, up = gate_up[..., ::2].clamp(max=experts.limit), gate_up[..., 1::2].clamp(-experts.limit, experts.limit)
    hidden = (up + 1) * (gate * torch.sigmoid(gate * experts.alpha))
    out = torch.einsum("etf,efh->eth", hidden, experts.down_proj) + experts.down_proj_bias[:, None]
    return torch.einsum("eth,te->th", out, weights)


def _layer(layer, x: torch.Tensor, cos, sin, past=None):
    attn = layer.self_attn
    out, kv = _attention(attn, _rms_norm(layer.input_layernorm, x), cos, sin, attn.sliding_window, past)
    x = x + out
    h = _rms_norm(layer.post_attention_layernorm, x)
    return x + _experts(layer.mlp, h.reshape(-1, h.shape[-1])).view_as(h), kv


def hidden_states(model: GptOssForCausalLM, ids: torch.Tensor, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """The final normed hidden states [batch, time, hidden] for right-padded `ids`. With
    `prefix` [length], every row of `ids` continues that one shared prefix: it is computed
    once, not once per row, and the states returned are those of `ids` only."""
    inner = model.model
    if prefix is not None and len(prefix) == 0:
        prefix = None
    start = 0 if prefix is None else len(prefix)
    positions = torch.arange(start + ids.shape[1], device=ids.device)[None]
    cos, sin = inner.rotary_emb(inner.embed_tokens.weight[:1], positions)
    cos, sin = cos[:, None], sin[:, None]
    x = inner.embed_tokens(ids)
    shared = None if prefix is None else inner.embed_tokens(prefix[None])
    for layer in inner.layers:
        past = None
        if shared is not None:
            shared, past = _layer(layer, shared, cos[:, :, :start], sin[:, :, :start])
        x, _ = _layer(layer, x, cos[:, :, start:], sin[:, :, start:], past)
    return _rms_norm(inner.norm, x)
