"""The commands that read a database or write a file: runs, show, export, sql, make-random-model.

Each is a thin function over the store. They import nothing of the run path (the engine, the tool
clients, the `mcp` package: over a second of imports), so a query answers at once; `submit` and
`bench` are in batch/cli/run_commands.py. batch/cli/main.py registers both, loading each on use.
"""

from __future__ import annotations

from pathlib import Path

import click

from batch.cli import display
from batch.cli.batch_output import batch_output_line
from batch.cli.show_text import request_text, response_text
from batch.cli.sql_output import FORMATS, render_results, terminal_width
from batch.cli.util import (DEFAULT_DB, check_output, fail as _fail, open_store as _open_store, resolve_run,
                            writing)
from batch.responses.standard_json import dumps_nulling_non_finite
from batch.store.errors import StoreError
from batch.store.statements import QueryResult, StatementError
from batch.store.responses import Responses


_read_db = click.option("--db", default=DEFAULT_DB, show_default=True,
                        help="DuckDB file to read (while a run writes it, its live snapshot).")


@click.command()
@_read_db
def runs(db: str) -> None:
    """List the runs in the database, newest first."""
    with _open_store(db, read_only=True) as store:
        click.echo(display.runs_table(store.runs.list()))


@click.command()
@click.argument("response_or_custom_id")
@_read_db
@click.option("--run", "run_id", help="Run to look in when giving a custom_id (default: newest).")
@click.option("--epoch", type=click.IntRange(min=0),
              help="Which sample of a line to show in a run made with --epochs K: 0 to K-1, as "
                   "requests.epoch counts [default: 0, the first].")
def show(response_or_custom_id: str, db: str, run_id: str | None, epoch: int | None) -> None:
    """One response (by response id or custom_id): its input, items, tool outputs, usage and event
    types; a line without a response (invalid): its status, error and body."""
    key = response_or_custom_id
    with _open_store(db, read_only=True) as store:
        found = store.responses.get(key)
        if found is not None and epoch is not None and (actual := store.responses.epoch_of(key)) != epoch:
            _fail(f"response {key} is epoch {actual} of custom_id {found.custom_id!r} in run {found.run_id}, "
                  f"not epoch {epoch}")
        runs_ = [resolve_run(store, run_id)] if run_id else [listed.run.run_id for listed in store.runs.list()]
        if found is None and epoch is not None:
            runs_ = [_run_with_epoch(store.responses, runs_, key, epoch, db)]
        if found is None:
            found = next((f for r in runs_ if (f := store.responses.find(r, key, epoch))), None)
        if found is None:  # a line without a response (invalid): its request row says why
            request = next((q for r in runs_ if (q := store.responses.find_request(r, key, epoch))), None)
            if request is None:
                _fail(f"no response or request with id or custom_id {key!r} in {db}")
            label = _epoch_label(store.responses, request.run_id, request.custom_id, request.epoch)
            click.echo(request_text(request, label))
            return
        response_id = found.response["id"]
        label = _epoch_label(store.responses, found.run_id, found.custom_id, store.responses.epoch_of(response_id))
        click.echo(response_text(found, store.responses.events(response_id), store.responses.tool_calls(response_id),
                                 label))


def _run_with_epoch(responses: Responses, runs_: list[str], custom_id: str, epoch: int, db: str) -> str:
    """The first of ``runs_`` that holds sample ``epoch`` of ``custom_id``; exit 1 naming the epochs
    the first run holding the custom_id has when none does."""
    held = [(r, epochs) for r in runs_ if (epochs := responses.epochs(r, custom_id))]
    if not held:
        _fail(f"no response or request with id or custom_id {custom_id!r} in {db}")
    run = next((r for r, epochs in held if epoch in epochs), None)
    if run is None:
        first, epochs = held[0]
        _fail(f"run {first} has no epoch {epoch} of custom_id {custom_id!r}: its epochs are "
              f"{_epochs_text(epochs)} (--epoch counts from 0)")
    return run


def _epoch_label(responses: Responses, run_id: str, custom_id: str, epoch: int | None) -> str | None:
    """`epoch=K of 0-2` when the run holds several samples of the custom_id, else None (nothing to tell)."""
    epochs = responses.epochs(run_id, custom_id)
    return f"epoch={epoch} of {_epochs_text(epochs)}" if epoch is not None and len(epochs) > 1 else None


def _epochs_text(epochs: list[int]) -> str:
    if epochs == list(range(epochs[0], epochs[-1] + 1)):
        return f"{epochs[0]}-{epochs[-1]}" if len(epochs) > 1 else str(epochs[0])
    return ", ".join(map(str, epochs))


@click.command()
@click.argument("run_id")
@_read_db
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="JSONL file to write in the OpenAI Batch output format.")
def export(run_id: str, db: str, output: Path) -> None:
    """Write a run's results as OpenAI Batch output JSONL."""
    check_output(output, "-o")
    with _open_store(db, read_only=True) as store:
        run_id = resolve_run(store, run_id)
        count = nulled = 0
        with writing(output, "-o"), open(output, "w", encoding="utf-8") as handle:
            for row in store.responses.iter_lines(run_id):
                # standard JSON, as batchrun stores it; a row stored before it refused NaN/Infinity: null
                text, was_nulled = dumps_nulling_non_finite(batch_output_line(run_id, row))
                nulled += was_nulled
                handle.write(text + "\n")
                count += 1
    click.echo(f"wrote {display.plural(count, 'line')} to {output}")
    if nulled:
        click.echo(f"note: {nulled} of them held NaN or Infinity, which are not JSON (stored by an older "
                   "batchrun): written as null", err=True)


class _QueryCommand(click.Command):
    """A command whose argument is SQL: a query that starts with a `--` comment is the argument.

    Click reads any word starting with `--` as an option, and the README's example queries
    start with one. An option is one word (`--db=F` at most): a `--` word holding whitespace
    that names no option is the query."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)  # after a bare `--`, click reads no option
        queries = [arg for arg in args[:end] if self._is_query(arg)]
        if len(queries) == 1 and end == len(args):
            args = [arg for arg in args if arg is not queries[0]] + ["--", queries[0]]
        return super().parse_args(ctx, args)

    def _is_query(self, arg: str) -> bool:
        if not arg.startswith("--") or not any(char.isspace() for char in arg):
            return False
        name = arg.split("=", 1)[0]
        return not any(name in param.opts for param in self.params if isinstance(param, click.Option))


@click.command(cls=_QueryCommand)
@click.argument("query")
@_read_db
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: one line per row, floats rounded, cut to --width; csv; json: one object per line "
                   "(several results: one line per result, the list of its rows).")
@click.option("--width", type=click.IntRange(min=0),
              help="Table width in characters, 0 for no limit [default: the terminal's; no limit in a pipe].")
def sql(query: str, db: str, fmt: str, width: int | None) -> None:
    """Run SQL on the run database and print each statement's result in turn (a table by default).

    Statements are separated by ';' (DuckDB splits them: a ';' in a string is no separator).
    Statements without a result (SET, DROP, ...) print nothing; a failed statement prints the
    results of those before it, then the error, which names it."""
    width = terminal_width() if width is None else (width or None)
    with _open_store(db, read_only=True) as store:
        try:
            results = store.query(query)
        except StatementError as exc:
            _echo_results(exc.results, fmt, width)
            _fail(str(exc).splitlines()[0])
        except StoreError as exc:
            _fail(str(exc).splitlines()[0])
        _echo_results(results, fmt, width)


def _echo_results(results: list[QueryResult], fmt: str, width: int | None) -> None:
    text = render_results(results, fmt, width) if results else ""
    if text:  # no result, or JSON of no rows: print nothing, not an empty line
        click.echo(text)


@click.command("make-random-model")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True,
              help="Weights are a function of the seed: the same seed writes the same checkpoint.")
def make_random_model(directory: Path, seed: int) -> None:
    """Write a tiny randomly initialised gpt-oss checkpoint (emits garbage; for tests and demos)."""
    from engine.checkpoint import make_random_checkpoint

    make_random_checkpoint(directory, seed=seed)
    click.echo(f"wrote a random tiny gpt-oss checkpoint to {directory}")
