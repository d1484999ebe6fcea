"""batchrun: engine."""
