"""Train batchrun's embedded tiny gpt-oss model from scratch, deterministically by seed.

    python -m trainer.train [--steps N] [--out data/models/batchrun-tiny] [--seed 0]

Training sequences are generated tasks rendered exactly as `batchrun submit` renders
them (trainer/render.py); the loss is on the model's own tokens only. The embedding
and lm_head share one matrix while training (a token read and the same token written
start aligned, which copying needs); the checkpoint stores the two equal matrices, as
gpt-oss does. Only the few thousand token ids the tasks use are "live": training keeps
their rows in a small matrix and the 201,088-way softmax is computed exactly, the dead
ids' logits being exactly 0 (their lm_head rows are zero): logsumexp over the live logits
and log(num_dead). Saving scatters the live rows into the full vocabulary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import GptOssForCausalLM

from batch.harmony.token_parser import RETURN_TOKEN
from engine.checkpoint import VOCAB_SIZE, _generation_config, tiny_config
from engine.compact import compact_file, load_compact, save_compact
from trainer.copy_circuit import plant_copy_circuit
from trainer.fast_forward import hidden_states
from trainer.names import POOLS
from trainer.render import Sequence, render_sequence
from trainer.tasks import generate

DEFAULT_OUT = Path("data/models/batchrun-tiny")
HARMONY_SPECIAL_IDS = range(199998, 200019)
MODEL_SHAPE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                   head_dim=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2)


# Task groups per cycle of the training set: more of the tasks whose copied words are
# hardest to find (function arguments; word lists, reversed or not, and a JSON object's
# second value; python's long numbers), fewer long browser tasks and JSON answers (learned early).
TRAINING_MIX = (("python", 3), ("function_call", 4), ("function_output", 2), ("browser", 1), ("no_tool", 3),
                ("no_tool/reverse", 1), ("no_tool/json", 1), ("no_tool/list", 1), ("no_tool/copy", 1),
                ("structured", 1))


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    copy_steps: int = 100  # first steps on random token strings to copy (the circuit learns its scale)
    steps: int = 6000  # in all, the copy steps included
    batch_tokens: int = 3000  # padded tokens per step (small batches learn faster per second here)
    lr: float = 3e-3
    warmup: int = 30
    beta2: float = 0.98
    weight_decay: float = 0.01
    num_tasks: int = 48000
    num_held_out: int = 200
    word_init: bool = True  # tokens of one word start with close embeddings
    group: int = 16  # training tasks per shared context (prompt prefix computed once per batch)
    eval_every: int = 1000
    mix: tuple = TRAINING_MIX
    shape: tuple = tuple(MODEL_SHAPE.items())
    # A checkpoint this trainer wrote to start from (its shape): a fine-tune, e.g. on changed prompts.
    # Ids it had start with its rows; ids new to the training set keep their fresh initialisation.
    init_from: str | None = None


def live_vocabulary(sequences: list[Sequence]) -> list[int]:
    """Token ids the model may ever read or write: those of the tasks, every number up to 3
    digits (o200k splits numbers into 1-3 digit tokens), harmony's special tokens."""
    from batch.harmony.vocab import ordinary_tokens  # the encoding's wrapper re-checks special tokens each call

    ids = {i for s in sequences for i in s.token_ids}
    for n in range(1000):
        ids.update(ordinary_tokens(str(n)))
        ids.update(ordinary_tokens(f"{n:03d}"))
    ids.update(HARMONY_SPECIAL_IDS)
    return sorted(ids)


def shared_prefix(sequences: list[Sequence]) -> int:
    """How many leading tokens all `sequences` share before the first one with a loss."""
    first, length = sequences[0].token_ids, min(s.is_target.index(True) for s in sequences) - 1
    for s in sequences[1:]:
        length = next((i for i in range(length) if s.token_ids[i] != first[i]), length)
    return max(length, 0)


def batches(sequences: list[Sequence], batch_tokens: int, rng: random.Random,
            groups: list[int] | None = None) -> list[list[int]]:
    """Index batches in a seeded random order. Without `groups`: sequences of similar length
    (less padding). With `groups` (training): the sequences of one group, whose shared prefix
    counts once, split so that prefix + padded rest fits `batch_tokens`."""
    if groups is None:
        groups = [0] * len(sequences)
    share_prefixes = len(set(groups)) > 1
    members: dict[int, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    result = []
    for indices in members.values():
        prefix = shared_prefix([sequences[i] for i in indices]) if share_prefixes else 0
        indices.sort(key=lambda i: (len(sequences[i].token_ids), rng.random()))
        current: list[int] = []
        for i in indices:
            longest = len(sequences[i].token_ids) - prefix
            if current and prefix + longest * (len(current) + 1) > batch_tokens:
                result.append(current)
                current = []
            current.append(i)
        result.append(current)
    rng.shuffle(result)
    return result


def collate(sequences: list[Sequence], to_live: dict[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The shared prefix's live ids [length]; the rest of each sequence right-padded [batch,
    time]; and next-token targets (-100 where no loss)."""
    start = shared_prefix(sequences)
    prefix = torch.tensor([to_live[t] for t in sequences[0].token_ids[:start]], dtype=torch.long)
    width = max(len(s.token_ids) for s in sequences) - start
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    targets = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, s in enumerate(sequences):
        live = torch.tensor([to_live[t] for t in s.token_ids[start:]])
        ids[row, :len(live)] = live
        mask = torch.tensor(s.is_target[start + 1:])
        targets[row, :len(live) - 1] = torch.where(mask, live[1:], torch.tensor(-100))
    return prefix, ids, targets


def exact_loss(model: GptOssForCausalLM, prefix: torch.Tensor, ids: torch.Tensor, targets: torch.Tensor,
               num_dead: int):
    """Cross-entropy of the full-vocabulary softmax at the target positions; and whether
    greedy decoding gets each sequence's target tokens all right ([batch] bools)."""
    hidden = hidden_states(model, ids, prefix)  # [batch, time, hidden]
    where = targets != -100
    logits = model.lm_head(hidden[where])  # [num_targets, num_live]
    dead = torch.full((logits.shape[0], 1), math.log(num_dead)) if num_dead else logits[:, :0]
    loss = F.cross_entropy(torch.cat([logits, dead], dim=1), targets[where])
    best = logits.max(-1)  # greedy picks it over the dead ids (logit 0) only when it is positive
    right = torch.ones_like(targets, dtype=torch.bool)
    right[where] = (best.indices == targets[where]) & (best.values > 0)
    return loss, right.all(dim=1)


def build_model(config: TrainConfig, num_live: int, live_ids: list[int] | None = None) -> GptOssForCausalLM:
    """A gpt-oss model over the live ids, its lm_head tied to the embedding, with a
    copying circuit planted (trainer/copy_circuit.py)."""
    torch.manual_seed(config.seed)
    model_config = tiny_config(vocab_size=num_live, pad_token_id=None, **dict(config.shape))
    model_config._attn_implementation = "eager"
    model = GptOssForCausalLM(model_config)
    model.lm_head.weight = model.model.embed_tokens.weight
    words = quiet = None
    if live_ids is not None:
        from batch.harmony.vocab import harmony_encoding

        encoding = harmony_encoding()
        texts = [encoding.decode([t]) for t in live_ids]
        quiet = ['"' in text for text in texts]
        if config.word_init:
            aliases = first_token_aliases(encoding)
            words = [aliases.get(text.strip().lower(), text.strip().lower()) or str(t)
                     for t, text in zip(live_ids, texts)]
    plant_copy_circuit(model, seed=config.seed, words=words, quiet=quiet)
    if config.init_from is not None:
        load_weights(model, live_ids or list(range(num_live)), Path(config.init_from))
    return model


def load_weights(model: GptOssForCausalLM, live_ids: list[int], checkpoint: Path) -> None:
    """Copy a checkpoint's weights into `model` (live rows of its vocabulary matrix): the ids it
    has rows for take them, the others keep theirs."""
    path = compact_file(checkpoint)
    if path is None:
        raise ValueError(f"--init-from {checkpoint}: no model.compact.safetensors (a checkpoint trainer.train wrote)")
    state = load_compact(path)
    state.pop("lm_head.weight", None)  # tied to the embedding while training
    embedding = state.pop("model.embed_tokens.weight").float()[torch.tensor(live_ids)]
    known = embedding.any(dim=1)
    ours = model.state_dict()
    if set(state) != set(ours) - {"model.embed_tokens.weight", "lm_head.weight"} or any(
            state[name].shape != ours[name].shape for name in state):
        raise ValueError(f"--init-from {checkpoint}: its tensors are not this model's shape")
    with torch.no_grad():
        for name, tensor in state.items():
            ours[name].copy_(tensor)
        model.model.embed_tokens.weight[known] = embedding[known]


def first_token_aliases(encoding) -> dict[str, str]:
    """For each word the tasks copy: its first token without a leading space (a JSON value, an
    answer's first word: "Lis" of "Lisbon") -> its word with one (" Lisbon"), so that both
    start close and a copy can land on either."""
    parts = {p.lower(): p for pool in POOLS for entry in pool for p in entry.split()}
    aliases: dict[str, str] = {}
    for part in parts.values():
        bare, spaced = (encoding.decode(encoding.encode(t)[:1]).strip().lower() for t in (part, " " + part))
        distinctive = all(len(t) >= 3 or t == part.lower() for t in (bare, spaced))  # not "in" of "INR"
        if bare != spaced and distinctive and bare not in parts:  # not "cloud" of "cloudy"
            aliases.setdefault(bare, spaced)
    return aliases


def random_copies(live_ids: list[int], batch_tokens: int, rng: random.Random) -> list[Sequence]:
    """A batch of harmony-framed copy drills over random live tokens: a user message of
    4-24 random tokens, then a final answer repeating it. Every live token gets copied,
    numbers included, which the tasks alone show too rarely."""
    from batch.harmony.vocab import harmony_encoding

    encoding = harmony_encoding()
    head = encoding.encode("<|start|>user<|message|>", allowed_special="all")
    middle = encoding.encode("<|end|><|start|>assistant<|channel|>final<|message|>", allowed_special="all")
    ordinary = [t for t in live_ids if t < min(HARMONY_SPECIAL_IDS)]
    result, used = [], 0
    while used < batch_tokens:
        text = [rng.choice(ordinary) for _ in range(rng.randint(4, 24))]
        prompt = head + text + middle
        result.append(Sequence(prompt + text + [RETURN_TOKEN], [False] * len(prompt) + [True] * (len(text) + 1)))
        used += len(result[-1].token_ids)
    return result


def save(model: GptOssForCausalLM, live_ids: list[int], out: Path, config: TrainConfig, log: list[dict],
         provenance: dict | None = None) -> None:
    """An HF checkpoint with the full 201,088-row vocabulary, dead rows zero, in bf16; `provenance`
    goes into its training.json beside the configuration."""
    provenance = provenance or {}
    out.mkdir(parents=True, exist_ok=True)
    full = tiny_config(**dict(config.shape))
    full.dtype = torch.bfloat16
    tensors = {}
    index = torch.tensor(live_ids)
    state = model.state_dict()
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied in training, two tensors on disk
    for name, tensor in state.items():
        tensor = tensor.detach()
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            rows = torch.zeros(VOCAB_SIZE, tensor.shape[1])
            rows[index] = tensor
            tensor = rows
        tensors[name] = tensor.to(torch.bfloat16).contiguous()
    full.save_pretrained(out)
    _generation_config(full).save_pretrained(out)
    # Compact: the vocabulary matrices by their live rows (a 100 MB file would be ~4 MB; engine/compact.py).
    (out / "model.safetensors").unlink(missing_ok=True)
    save_compact(tensors, out)
    shutil.copy(Path(__file__).with_name("model_card.md"), out / "README.md")
    record = {"config": {**config.__dict__, "shape": dict(config.shape)}, "num_live_ids": len(live_ids), **provenance}
    (out / "training.json").write_text(json.dumps({**record, "log": log}, indent=1) + "\n")


def evaluate(model, sequences, families, to_live, num_dead, batch_tokens) -> tuple[float, dict[str, float]]:
    """Loss, and per family the share of held-out sequences greedy decoding reproduces
    exactly (every model token right: reasoning, tool calls, answer)."""
    model.eval()
    losses: list[float] = []
    exact: dict[str, list] = {}
    with torch.no_grad():
        for batch in batches(sequences, batch_tokens, random.Random(0)):
            loss, right = exact_loss(model, *collate([sequences[i] for i in batch], to_live), num_dead)
            losses.append(loss.item())
            for i, ok in zip(batch, right.tolist()):
                exact.setdefault(families[i], []).append(ok)
    model.train()
    shares = {family: round(sum(oks) / len(oks), 3) for family, oks in sorted(exact.items())}
    shares["all"] = round(sum(sum(oks) for oks in exact.values()) / len(sequences), 3)
    return sum(losses) / len(losses), shares


def sequences_for(seed: int, n: int, prefix: str, mix=None, group: int = 1,
                  split: str = "train") -> tuple[list[Sequence], list[str], list[int]]:
    """Rendered tasks, their families and their groups."""
    tasks = generate(seed, n, prefix, dict(mix) if mix else None, group, split)
    return [render_sequence(t.body, t.steps) for t in tasks], [t.family for t in tasks], [t.group for t in tasks]


def train(config: TrainConfig, out: Path | None, *, progress: bool = True) -> dict:
    """Train from scratch (or from `config.init_from`); returns the log (and writes the checkpoint to `out`)."""
    started = time.monotonic()
    train_set, _, groups = sequences_for(config.seed, config.num_tasks, "train", config.mix, config.group)
    live_ids = live_vocabulary(train_set)
    to_live = {t: i for i, t in enumerate(live_ids)}
    # Fresh values in the training phrasings, and the held-out phrasings (the sequences whose
    # tokens are all live: a new word's id is dead, which the exact loss cannot index).
    evaluation = {}
    for key, seed, split in (("heldout", config.seed + 1_000_003, "train"),
                             ("phrasing", config.seed + 2_000_003, "held_out")):
        sequences, families, _ = sequences_for(seed, config.num_held_out, key, split=split)
        kept = [i for i, s in enumerate(sequences) if all(t in to_live for t in s.token_ids)]
        evaluation[key] = ([sequences[i] for i in kept], [families[i] for i in kept])
    num_dead = VOCAB_SIZE - len(live_ids)
    # which weights a fine-tune started from, named by content (its directory may be overwritten)
    base = compact_file(config.init_from) if config.init_from else None
    provenance = {"init_from_sha256": hashlib.sha256(base.read_bytes()).hexdigest()} if base else {}
    model = build_model(config, len(live_ids), live_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                  betas=(0.9, config.beta2))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1, (s + 1) / config.warmup) * max(
        0.02, 0.5 * (1 + math.cos(math.pi * min(1.0, s / config.steps)))))
    rng, log = random.Random(config.seed), []
    pending: list = []
    bar = tqdm(range(config.steps), disable=not progress, desc="train")
    for step in bar:
        if step < config.copy_steps:
            batch = random_copies(live_ids, config.batch_tokens, rng)
        else:
            if not pending:
                pending = batches(train_set, config.batch_tokens, rng, groups)
            batch = [train_set[i] for i in pending.pop()]
        loss, _ = exact_loss(model, *collate(batch, to_live), num_dead)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            entry = {"step": step + 1, "loss": round(loss.item(), 4)}
            for key, (sequences, families) in evaluation.items():
                if not sequences:
                    continue
                held_loss, exact = evaluate(model, sequences, families, to_live, num_dead, config.batch_tokens)
                entry |= {f"{key}_loss": round(held_loss, 4), f"{key}_exact": exact}
            log.append({**entry, "elapsed_s": round(time.monotonic() - started, 1)})
            tqdm.write(json.dumps(log[-1])) if progress else print(json.dumps(log[-1]), flush=True)
    if out is not None:
        save(model, live_ids, out, config, log, provenance)
    return {"log": log, "num_live_ids": len(live_ids), "model": model}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint directory to write")
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--num-tasks", type=int, default=TrainConfig.num_tasks)
    parser.add_argument("--batch-tokens", type=int, default=TrainConfig.batch_tokens)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    parser.add_argument("--copy-steps", type=int, default=TrainConfig.copy_steps,
                        help="first steps on random token strings to copy (0 when fine-tuning)")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="start from this checkpoint's weights (one trainer.train wrote) instead of from scratch")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (results are bit-identical "
                        "only for the same number)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = TrainConfig(seed=args.seed, steps=args.steps, num_tasks=args.num_tasks, batch_tokens=args.batch_tokens,
                         lr=args.lr, eval_every=args.eval_every, copy_steps=args.copy_steps,
                         init_from=str(args.init_from) if args.init_from else None)
    train(config, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
