"""The MCP render benchmark: its listing looks like a FastMCP server's, and it renders what admission would."""

import re

from batch.bench.render import LABEL, make_listing, make_render_workload, run_render_bench
from batch.harmony.render import PromptOptions, render_prompt
from batch.harmony.vocab import harmony_encoding
from tools.registry import ToolRegistry


def test_the_listing_has_pydantic_made_schemas_of_about_a_kilobyte():
    listing = make_listing(30)
    assert len(listing) == len({tool.name for tool in listing}) == 30
    schema = listing[0].input_schema
    assert schema["title"] == "tool0Arguments" and len(schema["required"]) == 2
    optional = [field for name, field in schema["properties"].items() if name not in schema["required"]]
    assert optional and all({"type": "null"} in field["anyOf"] and field["default"] is None for field in optional)
    workload = make_render_workload(4, num_tools=30)
    assert 600 < workload.schema_bytes / 30 < 2000


def test_the_bench_renders_each_request_with_the_servers_tools():
    workload = make_render_workload(6, num_tools=3)
    result = run_render_bench(workload)
    assert (result.num_requests, result.num_tools) == (6, 3)
    assert result.render_s > 0 and result.registry_s > 0 and "3 MCP tools" in result.line()
    request, items = workload.requests[1]  # one that carries a function tool beside the server
    registry = ToolRegistry.from_tools(request.tool_dicts(), request.tool_choice_json())
    registry.add_listing(LABEL, workload.listing)
    text = harmony_encoding().decode(render_prompt(request, items, registry, PromptOptions("2026-01-01")))
    assert f"namespace {LABEL} {{" in text and "type tool_2 = " in text and "type lookup = " in text
    assert "Question 1:" in text


def test_distinct_heads_give_every_request_instructions_of_its_own():
    workload = make_render_workload(5, num_tools=2, distinct_heads=True)
    assert len({request.instructions for request, _ in workload.requests}) == 5
    assert all(request.instructions for request, _ in workload.requests)
    assert len({request.instructions for request, _ in make_render_workload(5, num_tools=2).requests}) == 2


def test_batchrun_bench_host_reports_and_stores_the_mcp_render_cases(tmp_path):
    from click.testing import CliRunner

    from batch.cli.main import main
    from tests.support.db import rows

    db = tmp_path / "bench.duckdb"
    result = CliRunner().invoke(main, ["bench", "--systems", "host", "--host-requests", "8", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert re.search(r"mcp_render: [\d.]+ ms per request for render_prompt .*8 requests x 30 MCP tools", result.output)
    assert re.search(r"mcp_render_distinct: [\d.]+ ms per request .*10 requests x 30 MCP tools", result.output)
    assert rows(db, "SELECT workload, system, num_requests, stats->>'num_tools' FROM bench ORDER BY workload") == [
        ("host_mix", "host", 8, None), ("mcp_render", "host", 8, "30"), ("mcp_render_distinct", "host", 10, "30")]
    [(cpu_us_per_token,)] = rows(db, "SELECT stats->>'cpu_us_per_token' FROM bench WHERE workload = 'host_mix'")
    assert float(cpu_us_per_token) > 0  # the process's CPU time per output token, beside the wall time
