"""Harmony, the model's format: prompt rendering, completion parsing, turn grammars and their
token constraint."""
