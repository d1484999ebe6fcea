"""The planted copying circuit copies before any training: on a random token string shown
twice, the untrained model predicts the second showing from the first."""

import random

import pytest
import torch

from trainer.copy_circuit import plant_copy_circuit
from trainer.fast_forward import hidden_states
from trainer.train import TrainConfig, build_model, random_copies

NUM_LIVE = 3000


@pytest.fixture(scope="module")
def model():
    return build_model(TrainConfig(), NUM_LIVE)


def test_layer0_head0_attends_to_the_previous_token(model):
    ids = torch.randint(0, NUM_LIVE, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        attention = model(ids, output_attentions=True).attentions[0][0, 0]  # layer 0, head 0: [query, key]
    positions = torch.arange(1, 300)
    assert attention[positions, positions - 1].min() > 0.99


def test_untrained_model_continues_a_repeated_string(model):
    first = torch.randint(0, NUM_LIVE, (1, 60), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([first, torch.randint(0, NUM_LIVE, (1, 200)), first], dim=1)  # 200 tokens apart
    with torch.no_grad():
        predicted = model.lm_head(hidden_states(model, ids))[0].argmax(-1)
    second = torch.arange(ids.shape[1] - 60, ids.shape[1] - 1)  # the first token of the repeat is not predictable
    right = (predicted[second] == ids[0, second + 1]).float().mean().item()
    assert right > 0.85  # chance: 1 in 3,000
    random_order = (predicted[:60] == ids[0, 1:61]).float().mean().item()
    assert random_order < 0.05  # nothing to copy the first time


def test_quiet_tokens_do_not_trigger_a_copy():
    """After a second `"` the circuit must not copy what followed the first one (a function
    call's second string value would get the first's), while an ordinary token does copy."""
    model = build_model(TrainConfig(), NUM_LIVE)
    plant_copy_circuit(model, seed=0, quiet=[i < 100 for i in range(NUM_LIVE)])
    generator = torch.Generator().manual_seed(2)
    copied = {"quiet": 0, "ordinary": 0}
    for trial in range(20):
        filler = torch.randint(100, NUM_LIVE, (3, 30), generator=generator)
        for kind, token in (("quiet", trial), ("ordinary", 100 + trial)):
            follower = 200 + trial
            ids = torch.cat([filler[0], torch.tensor([token, follower]), filler[1], torch.tensor([token])])[None]
            with torch.no_grad():
                predicted = model.lm_head(hidden_states(model, ids))[0, -1].argmax().item()
            copied[kind] += predicted == follower
    assert copied["ordinary"] >= 18
    assert copied["quiet"] <= 2


def test_random_copies_fill_a_batch_and_target_only_the_answer():
    batch = random_copies(list(range(100)) + [200002], 500, random.Random(0))
    assert sum(len(s.token_ids) for s in batch) >= 500
    for sequence in batch:
        answer = [t for t, target in zip(sequence.token_ids, sequence.is_target) if target]
        assert answer[-1] == 200002
        text = answer[:-1]
        assert sequence.token_ids[3:3 + len(text)] == text  # after <|start|>user<|message|>
