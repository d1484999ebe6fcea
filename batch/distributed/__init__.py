"""Runs beyond one process: merging shard databases, the Ray driver and its worker actors."""
