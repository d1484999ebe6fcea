"""The README's "Layout" block against the tree: every module named where it lives, every name real.

A module counts as listed when its file name appears in the block's entry for its folder
(`batch/cli/` for batch/cli/submit.py), or when a subfolder of that entry is named there as a
group (`engine_only/` in scripts/'s entry).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOPS = ("batch/", "engine/", "tools/", "evals/", "trainer/", "scripts/")
SOURCES = (".py", ".sh", ".js")
NAMED_FILE = re.compile(r"(?<![\w.])([\w/]+\.(?:py|sh|js))\b")


def layout_block() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].splitlines()


def entries(lines: list[str]) -> dict[str, str]:
    """Folder ("batch/cli/") -> the text of its entry; a top folder's own entry holds its files'
    lines and the lines under it that name no subfolder."""
    texts: dict[str, list[str]] = {}
    key = None
    top = None
    for line in lines:
        top_entry = re.match(r"(\S+/)\s", line + " ")
        sub_entry = re.match(r" {2}(\w+/)\s", line + " ")
        if top_entry:
            top = key = top_entry.group(1)
        elif sub_entry and top is not None:
            key = top + sub_entry.group(1)
        elif re.match(r" {2}\S", line) and top is not None:  # a file of the top folder
            key = top
        if key is not None:
            texts.setdefault(key, []).append(line)
    return {folder: "\n".join(body) for folder, body in texts.items()}


def entry_of(folder: str, texts: dict[str, str]) -> str:
    """The deepest entry that holds `folder` ("scripts/engine_only/" -> "scripts/")."""
    return max((key for key in texts if folder.startswith(key)), key=len)


def modules() -> list[Path]:
    return sorted(path for top in TOPS for path in (REPO / top).rglob("*")
                  if path.suffix in SOURCES and path.name not in ("__init__.py", "__main__.py")
                  and "__pycache__" not in path.parts)


def test_the_block_has_an_entry_for_every_top_folder():
    texts = entries(layout_block())
    assert set(TOPS) <= set(texts), set(TOPS) - set(texts)
    assert {"batch/cli/", "batch/run/", "batch/store/", "engine/kernels/"} <= set(texts)


def test_every_module_is_named_in_its_folders_entry():
    texts = entries(layout_block())
    unlisted = []
    for path in modules():
        folder = path.parent.relative_to(REPO).as_posix() + "/"
        key = entry_of(folder, texts)
        text = texts[key]
        group = folder[len(key):].split("/", 1)[0]
        named = re.search(rf"(?<![\w.]){re.escape(path.name)}\b", text)
        grouped = group and re.search(rf"(?<![\w.]){re.escape(group)}/", text)
        if not (named or grouped):
            unlisted.append(f"{path.relative_to(REPO)} (in the entry {key})")
    assert not unlisted, "README Layout does not name:\n" + "\n".join(unlisted)


def test_every_file_the_block_names_exists():
    texts = entries(layout_block())
    missing = []
    for key, text in texts.items():
        if not key.startswith(TOPS):
            continue
        top = REPO / key.split("/", 1)[0]
        for name in NAMED_FILE.findall(text):
            candidates = [REPO / key / name, top / name, REPO / name]
            if not any(c.is_file() for c in candidates) and not any((REPO / key).rglob(name)):
                missing.append(f"{name} (in the entry {key})")
    assert not missing, "README Layout names files that do not exist:\n" + "\n".join(missing)


def test_the_checks_see_a_missing_and_a_stale_name():
    lines = ["engine/         the decoder", "  api.py        the contract", "  gone.py       stale",
             "  kernels/      Triton: moe.py"]
    texts = entries(lines)
    assert texts["engine/"].count("api.py") == 1 and "moe.py" in texts["engine/kernels/"]
    assert entry_of("engine/kernels/", texts) == "engine/kernels/"
    assert "gone.py" in NAMED_FILE.findall(texts["engine/"])
    assert not (REPO / "engine/gone.py").exists()
