"""One run in one process: reader, admission, session, tool policy, results, and the runner that
drives the engine and tools over them."""
