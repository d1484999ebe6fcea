"""The constrained-decoding benchmark: both runs decode the same amount; the constrained one follows its grammar."""

from batch.harmony.constraint import GrammarConstraint
from batch.bench.constrained import GRAMMAR, run_constraint_bench
from batch.harmony.vocab import harmony_encoding


def test_free_and_constrained_runs_decode_the_same_amount(tiny_model_dir):
    result = run_constraint_bench(tiny_model_dir, concurrent=3, prompt_len=8, output_len=6, repeats=1,
                                  engine_options={"kv_cache_gb": 0.05})
    assert result.output_tokens == 3 * 6
    assert result.free_step_ms > result.free_forward_ms > 0
    assert result.constrained_step_ms > result.constrained_forward_ms > 0
    assert "overhead" in result.line()


def test_a_constrained_request_writes_the_final_json_answer(tiny_model_dir):
    from engine.api import SamplingParams
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(tiny_model_dir, kv_cache_gb=0.05))
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                                                      constraint=GrammarConstraint(GRAMMAR)))
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for out in engine.step() for t in out.new_token_ids]
    assert harmony_encoding().decode(tokens).startswith('<|channel|>final<|message|>{"rows"')


def test_batchrun_bench_constrained_prints_the_overhead_and_keeps_a_row(tmp_path, tiny_model_dir):
    import duckdb
    from click.testing import CliRunner

    from batch.cli.main import main

    db = tmp_path / "bench.duckdb"
    result = CliRunner().invoke(main, ["bench", "--systems", "constrained", "--model", str(tiny_model_dir),
                                       "--num-requests", "2", "--kv-cache-gb", "0.05", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "constrained decoding, 2 concurrent requests" in result.output
    with duckdb.connect(str(db), read_only=True) as con:
        [(system, tokens, overhead)] = con.sql(
            "SELECT system, output_tokens, CAST(stats->>'overhead' AS DOUBLE) FROM bench").fetchall()
    assert (system, tokens) == ("constrained", 2 * 64) and overhead == overhead  # a number, not NaN
