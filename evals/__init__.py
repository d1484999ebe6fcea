"""batchrun evals: suites and graders (suite, registry, graders, trace_graders, grading),
event-trace snapshots and golden checks (snapshot, check), run comparison (compare),
and the offline HTML report (report_data, report, svg). Commands in batch.cli.eval_commands."""
