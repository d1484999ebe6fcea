"""batchrun: tools."""
