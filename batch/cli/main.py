"""`batchrun` command line: the root group, where every command is registered.

The run commands live in batch/cli/commands.py, the eval and CI commands in batch/cli/eval_commands.py;
both build on batch/cli/submit.py, and neither imports this module.

Exit codes: 0 the command did its work (a run that finished, even with invalid
lines, when one line was valid), 1 it could not (no model, locked database, unknown
run, no valid line), 2 usage errors.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import NoReturn

import click

# Each command's module loads when the command runs: `sql` or `runs` must not pay for the run path's imports
# (the engine, the tool clients, the `mcp` package: over a second), which `submit` and `eval` need.
COMMANDS = {
    "submit": "batch.cli.run_commands:submit", "merge": "batch.cli.distribute:merge",
    "runs": "batch.cli.commands:runs", "show": "batch.cli.commands:show", "export": "batch.cli.commands:export",
    "sql": "batch.cli.commands:sql", "make-random-model": "batch.cli.commands:make_random_model",
    "bench": "batch.cli.run_commands:bench", "eval": "batch.cli.run_commands:eval_command",
    "grade": "batch.cli.eval_commands:grade_command", "snapshot": "batch.cli.eval_commands:snapshot_command",
    "check": "batch.cli.eval_commands:check_command", "compare": "batch.cli.eval_commands:compare_command",
    "report": "batch.cli.eval_commands:report_command",
}


class LazyGroup(click.Group):
    """A group whose commands are `module:attribute` paths, imported when one is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        path = COMMANDS.get(cmd_name)
        if path is None:
            return None
        module, attribute = path.split(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command) and command.name == cmd_name, path
        return command


@click.group(cls=LazyGroup)
@click.version_option(package_name="batchrun")
def main() -> None:
    """Offline batch runner for OpenAI Responses API requests on gpt-oss models."""


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
