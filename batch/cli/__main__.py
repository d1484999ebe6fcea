"""`python -m batch.cli`: the same as the `batchrun` console script."""

from batch.cli.main import entry

entry()
