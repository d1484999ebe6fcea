"""The CLI root: every command is found by name, and the query commands load nothing of the run path."""

import subprocess
import sys

import click

from batch.cli.main import COMMANDS, main
from batch.store.store import Store


def test_every_named_command_loads_under_its_name():
    context = click.Context(main)
    assert main.list_commands(context) == sorted(COMMANDS)
    for name in COMMANDS:
        command = main.get_command(context, name)
        assert isinstance(command, click.Command) and command.name == name
    assert main.get_command(context, "nope") is None


def test_a_query_command_imports_no_engine_tools_or_mcp(tmp_path):
    # `batchrun sql` / `runs` / `show` / `export` / `grade` / `report` ... answer at once: the run path's imports
    # (torch, the tool clients and the mcp package, over a second) load only for submit, eval and bench.
    db = tmp_path / "empty.duckdb"
    Store(db).close()
    code = ("import sys\n"
            "from batch.cli.main import COMMANDS, main\n"
            "for name in set(COMMANDS) - {'submit', 'eval', 'bench', 'merge'}:\n"
            "    main.get_command(None, name)\n"
            f"main(['sql', '--db', {str(db)!r}, 'SELECT 42 AS answer'], standalone_mode=False)\n"
            "heavy = {'torch', 'mcp', 'openai_harmony', 'tools.client', 'batch.run.runner'}\n"
            "heavy = sorted(heavy & set(sys.modules))\n"
            "print('heavy:', heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "42" in done.stdout
    assert "heavy: []" in done.stdout, done.stdout


def test_a_run_without_tools_never_imports_mcp(tmp_path):
    # The mcp package is about a second of every start: only a run that talks to a tool server needs it.
    source, db = tmp_path / "in.jsonl", tmp_path / "out.duckdb"
    source.write_text('{"custom_id": "a", "input": "Hi"}\n')
    code = ("import sys\n"
            "from batch.cli.main import COMMANDS, main\n"
            "for name in COMMANDS:\n"
            "    main.get_command(None, name)\n"
            "print('loaded:', sorted({'mcp', 'tools.client'} & set(sys.modules)))\n"
            f"main(['submit', {str(source)!r}, '--db', {str(db)!r}, '--max-output-tokens', '2', '--quiet'],"
            " standalone_mode=False)\n"
            "print('after the run:', sorted({'mcp', 'tools.client'} & set(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout and "after the run: []" in done.stdout, done.stdout
    assert "1 request this time" in done.stdout, done.stdout


def test_a_bad_model_is_refused_before_torch_is_imported(tmp_path):
    # The README promises the refusal in under a second: importing torch and transformers for a check that reads
    # one JSON file took 3-10 s on a loaded machine.
    source, db = tmp_path / "in.jsonl", tmp_path / "out.duckdb"
    source.write_text('{"custom_id": "a", "input": "Hi"}\n')
    (tmp_path / "not-a-model").mkdir()
    code = ("import sys\n"
            "from batch.cli.main import main\n"
            "try:\n"
            f"    main(['submit', {str(source)!r}, '--db', {str(db)!r}, '--model', {str(tmp_path / 'not-a-model')!r}],"
            " standalone_mode=False)\n"
            "except SystemExit as exc:\n"
            "    print('exit:', exc.code)\n"
            "print('heavy:', sorted({'torch', 'transformers'} & set(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "exit: 1" in done.stdout and "heavy: []" in done.stdout, (done.stdout, done.stderr)
    assert "no config.json" in done.stdout + done.stderr
    assert not db.exists()
