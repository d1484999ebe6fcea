"""Training batchrun's embedded tiny gpt-oss model (see trainer/train.py)."""
