"""Submit's options, typed once from click's values: every option of the command lands in a field."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest

from batch.cli.run_commands import submit
from batch.cli.distribute import DistributionOptions
from batch.cli.run_commands import eval_command
from batch.cli.submit import SubmitOptions, Terminated, signals_stop_the_run
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


@pytest.fixture
def stop_signals_restored():
    """SIGINT and SIGTERM as a terminal's process has them, and as they were after the test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background test run ignores it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("first, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_after_the_first_stop_signal_a_second_cannot_cut_the_saving_short(stop_signals_restored, first, raised):
    saved = False
    with pytest.raises(raised):
        with signals_stop_the_run():
            try:
                os.kill(os.getpid(), first)
                time.sleep(10)  # the handler raises in here, at once
            finally:
                # The run saves here: a second Ctrl-C or SIGTERM must not interrupt it.
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
                saved = True
    assert saved
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_run_not_stopped_gives_the_handlers_back(stop_signals_restored):
    with signals_stop_the_run():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigint_ignored_before_the_run_stays_ignored(stop_signals_restored):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # started in the background with `&`
    with signals_stop_the_run():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
