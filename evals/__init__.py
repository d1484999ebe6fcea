"""batchrun: evals."""
