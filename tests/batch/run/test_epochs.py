"""--epochs: each sample's seed, and the lines a resumed run still has to decode."""

import dataclasses

from batch.run.admission import sample_seed
from batch.run.input_line import InputLine
from engine.api import derive_seed


def line(epoch: int = 0, custom_id: str = "c1") -> InputLine:
    return InputLine(line_no=1, custom_id=custom_id, body={"input": "hi"}, request=None, epoch=epoch)


def test_epoch_zero_keeps_the_seed_of_a_run_without_epochs():
    assert sample_seed(7, line()) == derive_seed(7, "c1")


def test_every_epoch_gets_its_own_reproducible_seed():
    seeds = [sample_seed(7, line(epoch)) for epoch in range(5)]
    assert len(set(seeds)) == 5
    assert seeds == [sample_seed(7, line(epoch)) for epoch in range(5)]  # the same run seed, the same samples
    assert sample_seed(8, line(1)) != seeds[1]  # and another run seed, other samples
    assert sample_seed(7, line(1, "c2")) != seeds[1]


def test_a_sample_is_the_line_with_its_epoch():
    first = line()
    second = dataclasses.replace(first, epoch=1)
    assert (second.line_no, second.custom_id, second.body, second.epoch) == (1, "c1", {"input": "hi"}, 1)
    assert first.epoch == 0
