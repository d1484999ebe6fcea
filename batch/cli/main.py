"""`batchrun` command line: the root group, where every command is registered.

The run commands live in batch/cli/commands.py, the eval and CI commands in batch/cli/eval_commands.py;
both build on batch/cli/submit.py, and neither imports this module.

Exit codes: 0 the command did its work (a run that finished, even with invalid
lines, when one line was valid), 1 it could not (no model, locked database, unknown
run, no valid line), 2 usage errors.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

import click

from batch.cli.commands import bench, export, make_random_model, runs, show, sql, submit
from batch.cli.distribute import merge
from batch.cli.eval_commands import (check_command, compare_command, eval_command, grade_command, report_command,
                                     snapshot_command)


@click.group()
@click.version_option(package_name="batchrun")
def main() -> None:
    """Offline batch runner for OpenAI Responses API requests on gpt-oss models."""


for _command in (submit, merge, runs, show, export, sql, make_random_model, bench,
                 eval_command, grade_command, snapshot_command, check_command, compare_command,
                 report_command):
    main.add_command(_command)


def entry() -> NoReturn:
    """The `batchrun` console script (and `python -m batch.cli`): `main`, then a prompt exit.

    Once a command has returned, its files are closed and its output written: the interpreter's
    teardown (freeing a loaded model, torch's and DuckDB's native state) would only keep the
    prompt away for seconds. The atexit handlers (Ray's shutdown among them) still run."""
    try:
        main()  # standalone: always ends in SystemExit
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):
        click.echo(code, err=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
