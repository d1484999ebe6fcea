"""Import every engine module and fail if any of them pulled in the runner or a package the GPU image lacks.

The engine knows tokens, not Responses (DESIGN.md): nothing under engine/ may import batch/, tools/,
evals/ or trainer/, nor duckdb, mcp, openai-harmony, openai or llguidance. Run by scripts/gpu_check.sh.
"""

import importlib
import importlib.metadata
import pkgutil
import sys

import engine

FORBIDDEN = ("batch", "tools", "evals", "trainer", "duckdb", "mcp", "openai_harmony", "openai", "llguidance")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def main() -> None:
    names = sorted(m.name for m in pkgutil.walk_packages(engine.__path__, "engine."))
    for name in names:
        importlib.import_module(name)
    pulled = sorted(m for m, module in sys.modules.items() if module is not None and m.split(".")[0] in FORBIDDEN)
    if pulled:
        raise SystemExit(f"the engine path imported {', '.join(pulled)}")
    versions = {name: _version(name) for name in ("torch", "transformers", "triton", "safetensors")}
    print(f"imported {len(names)} engine modules; none of {', '.join(FORBIDDEN)}")
    print("python", sys.version.split()[0], " ".join(f"{k} {v}" for k, v in versions.items()))


if __name__ == "__main__":
    main()
