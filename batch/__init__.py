"""batchrun: batch."""
