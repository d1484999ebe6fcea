"""Benchmarks of the host path, of grammar-constrained decoding and of the writer."""
