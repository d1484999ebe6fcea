"""batchrun's runner: everything that knows about Responses requests, one subpackage per concern.

The data flows down the tree: run (reader -> admission -> session) renders and parses with
harmony, builds responses and their events, and writes rows through store; distributed runs the
same loop beyond one process; cli is the one place that composes them (and evals) into commands.
"""
