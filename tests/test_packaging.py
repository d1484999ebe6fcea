"""The built sdist and wheel carry the project's LICENSE and declare its licence (PEP 639)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know which files are the project's")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    # The shipped checkpoint is large and not part of the package; everything else is copied.
    return [f for f in out.splitlines() if not f.startswith("data/models/") and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """An sdist and a wheel built (no isolation, the installed setuptools) from a copy of the tree."""
    work = tmp_path_factory.mktemp("packaging")
    src, out = work / "src", work / "out"
    for name in _tracked_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    code = (f"from setuptools import build_meta as b; b.build_sdist({str(out)!r}); "
            f"b.build_wheel({str(out)!r})")
    subprocess.run([sys.executable, "-c", code], cwd=src, check=True, capture_output=True)
    return out


def test_the_repository_has_its_licence_file():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def test_the_sdist_carries_the_licence(built):
    (sdist,) = built.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        licence = tar.extractfile(next(n for n in names if n.endswith("/LICENSE")))
        assert licence is not None and b"Apache License" in licence.read()
        # The vendored spec is test data under another licence; it stays out of the package.
        assert not any("openresponses" in n for n in names)


def test_the_wheel_carries_the_licence_and_declares_it(built):
    (wheel,) = built.glob("*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        licence = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        assert b"Apache License" in whl.read(licence)
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
        assert not any("openresponses" in n for n in names)


def test_every_data_file_is_accounted_for_in_third_party():
    """Each tracked data or text file under data/, tests/data/, the eval suites and golden traces
    matches a path pattern in THIRD_PARTY.md's table (its first column)."""
    table = [line for line in (ROOT / "THIRD_PARTY.md").read_text().splitlines() if line.startswith("| `")]
    patterns = [p for line in table for p in re.findall(r"`([^`]+)`", line.split("|")[1])]
    assert patterns, "THIRD_PARTY.md has no table of paths"
    roots = ("data/", "tests/data/", "evals/suites/", "tests/evals/golden/")
    out = subprocess.run(["git", "ls-files", *roots], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = out.split()
    assert files
    unaccounted = [f for f in files
                   if not any(fnmatch.fnmatch(f, p) or (p.endswith("/") and f.startswith(p)) for p in patterns)]
    assert unaccounted == []
