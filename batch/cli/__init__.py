"""The `batchrun` command line: the root group (main.py) and thin commands over the other packages.

The only package of batch/ that exits the process or imports evals/.
"""
