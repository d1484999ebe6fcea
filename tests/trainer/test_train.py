"""Training smoke test: the loop learns, the fast forward is transformers' math, the saved
checkpoint is a full-vocabulary gpt-oss checkpoint both loaders read."""

import hashlib
import json
from dataclasses import replace

import pytest
import torch
from transformers import GptOssConfig, GptOssForCausalLM

from engine.checkpoint import VOCAB_SIZE
from engine.compact import COMPACT_NAME, load_compact
from trainer.fast_forward import hidden_states
from trainer.train import (TrainConfig, build_model, exact_loss, first_token_aliases, live_vocabulary,
                           sequences_for, train)

SMOKE = TrainConfig(steps=12, copy_steps=3, num_tasks=40, num_held_out=20, batch_tokens=1500, lr=1e-2,
                    warmup=2, eval_every=6,
                    shape=tuple(dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     num_key_value_heads=2, head_dim=16, intermediate_size=32,
                                     num_local_experts=2, num_experts_per_tok=1).items()))


def test_fast_forward_matches_transformers_eager():
    model = build_model(SMOKE, 300)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    ids = torch.randint(0, 300, (2, 200))  # longer than the sliding window (128)
    expected = model.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(hidden_states(model, ids), expected, atol=1e-4, rtol=1e-4)


def test_shared_prefix_gives_the_states_of_whole_rows():
    model = build_model(SMOKE, 300)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    prefix = torch.randint(0, 300, (170,))  # longer than the sliding window (128)
    rows = torch.randint(0, 300, (3, 60))
    whole = hidden_states(model, torch.cat([prefix.expand(3, -1), rows], dim=1))[:, 170:]
    torch.testing.assert_close(hidden_states(model, rows, prefix), whole, atol=1e-4, rtol=1e-4)


def test_exact_loss_counts_the_dead_vocabulary():
    model = build_model(SMOKE, 10)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    ids, targets = torch.zeros(1, 4, dtype=torch.long), torch.tensor([[-100, 3, 3, -100]])
    loss, _ = exact_loss(model, torch.zeros(0, dtype=torch.long), ids, targets, num_dead=VOCAB_SIZE - 10)
    assert abs(loss.item() - torch.log(torch.tensor(float(VOCAB_SIZE))).item()) < 1e-4  # uniform over 201,088


def test_training_smoke_loss_decreases_and_checkpoint_loads(tmp_path):
    result = train(SMOKE, tmp_path / "model", progress=False)
    log = result["log"]
    assert log[-1]["heldout_loss"] < log[0]["heldout_loss"] < 12.3
    families = {"python", "function_call", "function_output", "browser", "no_tool", "structured", "all"}
    assert set(log[-1]["heldout_exact"]) <= families and set(log[-1].get("phrasing_exact", {})) <= families
    assert 0 <= log[-1]["heldout_exact"]["all"] <= 1
    # The trainer writes a compact checkpoint (engine/compact.py): transformers gets it expanded.
    state = load_compact(tmp_path / "model" / COMPACT_NAME)
    model = GptOssForCausalLM.from_pretrained(None, config=GptOssConfig.from_pretrained(tmp_path / "model"),
                                              state_dict=state, dtype=torch.float32)
    assert model.config.vocab_size == VOCAB_SIZE
    torch.testing.assert_close(model.lm_head.weight, model.model.embed_tokens.weight)  # tied in training
    live = (model.lm_head.weight != 0).any(dim=1)
    assert live.sum().item() == result["num_live_ids"]
    assert not model.model.embed_tokens.weight[~live].any()
    card = json.loads((tmp_path / "model" / "training.json").read_text())
    assert card["num_live_ids"] == result["num_live_ids"] and card["log"] == log


def test_first_tokens_without_a_space_start_beside_the_spaced_word():
    from batch.harmony.vocab import harmony_encoding

    aliases = first_token_aliases(harmony_encoding())
    assert aliases["lis"] == "lisbon"  # "Lisbon" -> "Lis"+"bon", " Lisbon" one token
    assert "in" not in aliases  # "INR" starts with "IN": " in" must not join it
    assert "cloud" not in aliases  # a word of its own, not the start of "cloudy"


@pytest.mark.slow  # ~19 s: two short trainings; the smoke test trains once in the default run
def test_training_is_deterministic_by_seed():
    first, second = (train(SMOKE, None, progress=False)["model"].state_dict() for _ in range(2))
    assert all(torch.equal(first[name], second[name]) for name in first)
    other = train(replace(SMOKE, seed=1), None, progress=False)["model"].state_dict()
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


@pytest.mark.slow  # ~26-37 s: two trainings; the default run keeps the smoke training (the suite nears 10 min)
def test_a_fine_tune_starts_from_the_checkpoint_it_names(tmp_path):
    """--init-from: every weight the checkpoint has (the ids it knew, by id), fresh rows for new ids."""
    train(replace(SMOKE, num_tasks=12, steps=4, eval_every=100), tmp_path / "first", progress=False)
    fine = replace(SMOKE, init_from=str(tmp_path / "first"), steps=1, lr=0.0)  # one step that moves nothing
    model = train(fine, None, progress=False)["model"]
    live_ids = live_vocabulary(sequences_for(fine.seed, fine.num_tasks, "train", fine.mix, fine.group)[0])
    saved = load_compact(tmp_path / "first" / COMPACT_NAME)
    rows = saved["model.embed_tokens.weight"][torch.tensor(live_ids)]
    known = rows.any(dim=1)
    assert 0 < int((~known).sum()) < len(live_ids)  # more tasks: some ids are new to the checkpoint
    ours = model.state_dict()
    assert torch.equal(ours["model.embed_tokens.weight"][known], rows[known].float())
    assert ours["model.embed_tokens.weight"][~known].any(dim=1).all()  # a fresh row each, not zeros
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.experts.down_proj", "model.norm.weight"):
        assert torch.equal(ours[name], saved[name].float()), name
    train(fine, tmp_path / "fine", progress=False)
    record = json.loads((tmp_path / "fine" / "training.json").read_text())
    assert record["init_from_sha256"] == hashlib.sha256((tmp_path / "first" / COMPACT_NAME).read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="no model.compact.safetensors"):
        train(replace(fine, init_from=str(tmp_path)), None, progress=False)
