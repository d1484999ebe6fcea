"""A copying circuit planted in a fresh model before training: an initialisation, not weights.

Every task needs the model to copy: numbers into a python call, names into function
arguments, a tool's output into the answer. Transformers copy with an "induction" circuit:
a head that moves each token's predecessor into its residual stream, and a later head that
looks for an earlier occurrence of the current token and copies the token that followed it.
Gradient descent finds that circuit only after a long plateau, longer than our 30-minute
CPU budget (measured: a copy drill stayed at chance for 700 steps; held-out python tasks
were never right). So the trainer starts from a model that already has it, and trains
everything from there:

- token embeddings live in the first `E` residual dimensions, the rest start at zero; the
  tokens of one word (" Paris", "Paris", "paris": a copied word's first token often loses
  or gains its space) start close, so a copy lands on the right word in either form;
- layer 0, head 0 attends to the previous token (a purely positional query and key made of
  biases on the fastest rotary pairs, which peak at a distance of one) and writes that
  token's embedding into residual dimensions [E, 2E);
- layer 1, heads 0 and 1 match the current token against each position's previous token
  (on the rotary pairs that barely turn over a few thousand positions, so the match does not
  depend on distance) and add the matched position's token embedding to the residual, which
  the tied lm_head reads out as that token;
- "quiet" tokens (JSON's quotes) must not match themselves, or a function call's second
  string value copies whatever followed the first `"` (measured: every `convert_currency`
  call and every two-key JSON answer took a value from the wrong place). Each head's key
  flips the sign of one "quiet" coordinate, which ordinary tokens leave at zero and quiet
  tokens fill with most of their norm: a quiet token's match with itself is negative;
- the other heads and every expert's output start at zero, so nothing drowns the circuit.
"""

from __future__ import annotations

import torch
from transformers import GptOssForCausalLM

WORD_NOISE = 0.5  # how far apart " Paris", "Paris" and "paris" start (cosine 0.8)
SLOW_ROTATION = 6e-4  # radians per position: under 0.3 rad over 500 positions


def plant_copy_circuit(model: GptOssForCausalLM, *, seed: int, words: list[str] | None = None,
                       quiet: list[bool] | None = None, sigma: float = 0.02, sharpness: float = 12.0,
                       match_gain: float = 2.0, copy_gain: float = 2.0) -> None:
    """Initialise `model` in place (see the module docstring), E = hidden_size / 2; `words`:
    each embedding row's word (rows with the same word start close); `quiet`: rows that take
    no part in the induction match. Needs head_dim >= E and one key/value head per query head."""
    inner, config = model.model, model.config
    dims, head, half = config.hidden_size // 2, config.head_dim, config.head_dim // 2
    if config.num_key_value_heads != config.num_attention_heads or head < dims:
        raise ValueError("the copy circuit needs one key/value head per query head and head_dim >= hidden_size / 2")
    generator = torch.Generator().manual_seed(seed)
    frequencies = inner.rotary_emb.inv_freq
    slow = [i for i in range(half) if frequencies[i] < SLOW_ROTATION][-(dims // 4):]  # the match reads <= E/2 dims
    match = torch.tensor(slow + [i + half for i in slow])  # a head's query/key dims that barely rotate
    every = torch.arange(dims)
    with torch.no_grad():
        embedding = inner.embed_tokens.weight
        embedding.zero_()
        own = torch.randn(embedding.shape[0], dims, generator=generator)
        if words is not None:  # rows of one word share most of their vector
            index = {word: i for i, word in enumerate(dict.fromkeys(words))}
            base = torch.randn(len(index), dims, generator=generator)
            own = (base[torch.tensor([index[w] for w in words])] + WORD_NOISE * own) / (1 + WORD_NOISE ** 2) ** 0.5
        flipped = torch.arange(2) * len(match) % dims  # each induction head's quiet coordinate
        if quiet is not None:
            rows = torch.tensor(quiet, dtype=torch.bool)
            own[:, flipped] = torch.where(rows[:, None], 2 * len(match) ** 0.5, 0.0)
            own[rows] *= dims ** 0.5 / own[rows].norm(dim=1, keepdim=True)  # the usual norm
        embedding[:, :dims] = own * sigma
        for layer in inner.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.self_attn.o_proj.bias.zero_()
            layer.mlp.experts.down_proj.zero_()
            layer.mlp.experts.down_proj_bias.zero_()

        previous = inner.layers[0].self_attn
        for projection in (previous.q_proj, previous.k_proj, previous.v_proj):
            projection.weight[:head] = 0
            projection.bias[:head] = 0
        for i in range(4):  # q . k = sum_i cos(w_i (distance - 1)): largest at distance 1
            previous.q_proj.bias[i] = sharpness
            previous.k_proj.bias[i] = sharpness * torch.cos(frequencies[i])
            previous.k_proj.bias[i + half] = sharpness * torch.sin(frequencies[i])
        previous.v_proj.weight[every, every] = 1.0
        previous.o_proj.weight[dims + every, every] = sigma / 2 ** 0.5  # same scale as the embedding

        induction = inner.layers[1].self_attn
        for h in range(2):
            head_rows = slice(h * head, (h + 1) * head)
            for projection in (induction.q_proj, induction.k_proj, induction.v_proj):
                projection.weight[head_rows] = 0
                projection.bias[head_rows] = 0
            source = torch.arange(h * len(match), (h + 1) * len(match)) % dims
            induction.q_proj.weight[h * head + match, source] = match_gain
            induction.k_proj.weight[h * head + match, dims + source] = match_gain
            induction.k_proj.weight[h * head + match[0], dims + flipped[h]] = -match_gain
            induction.v_proj.weight[h * head + every, every] = 1.0
            induction.o_proj.weight[every, h * head + every] = copy_gain * sigma
