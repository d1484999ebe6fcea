"""Submit's options, typed once from click's values: every option of the command lands in a field."""

from __future__ import annotations

import dataclasses

from batch.cli.commands import submit
from batch.cli.distribute import DistributionOptions
from batch.cli.eval_commands import eval_command
from batch.cli.submit import SubmitOptions
from batch.cli.util import options_from


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_submit_option_is_a_field_of_the_typed_options():
    params = {param.name for param in submit.params} - {"input_path", "db"}
    assert params == _fields(SubmitOptions) | _fields(DistributionOptions)
    assert not _fields(SubmitOptions) & _fields(DistributionOptions)


def test_eval_takes_the_same_options_and_its_own():
    params = {param.name for param in eval_command.params}
    assert params - (_fields(SubmitOptions) | _fields(DistributionOptions)) == {"suite_name", "db", "fail_under"}


def test_the_typed_options_read_only_their_own_values(tmp_path):
    (tmp_path / "in.jsonl").write_text("{}\n")
    values = submit.make_context("submit", [str(tmp_path / "in.jsonl"), "--seed", "7", "--shard", "1/2"]).params
    given = options_from(SubmitOptions, values)
    assert (given.seed, given.max_turns, given.retry_failed, given.quiet) == (7, 32, None, False)
    assert options_from(DistributionOptions, values) == DistributionOptions("1/2", None, 1, 0.0, 1.0)
