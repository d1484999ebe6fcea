"""The GPU machines' image, simulated: the packages it lacks cannot be imported.

scripts/gpu_check.sh puts this folder first on PYTHONPATH, so every Python it starts (pytest's too)
loads this at startup. A None entry in sys.modules is how Python spells "not installed" to both
`import` (ModuleNotFoundError) and `importlib.util.find_spec` (None, which transformers' availability
checks read), so the check proves the engine path never needs these, on this machine as on that one.
"""

import sys

ABSENT_ON_GPU_IMAGE = ("duckdb", "mcp", "openai_harmony", "openai", "llguidance")

for _name in ABSENT_ON_GPU_IMAGE:
    sys.modules.setdefault(_name, None)  # type: ignore[assignment]
