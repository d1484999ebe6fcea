"""Offline harmony vocabulary: o200k_base from the bpe-openai wheel, never a download."""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding

O200K_FILE = "o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class VocabularyError(RuntimeError):
    """The harmony vocabulary file is missing or not the expected one."""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "batchrun" / "tiktoken"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ensure_vocabulary(cache_dir: Path | None = None) -> Path:
    """Unpack o200k_base.tiktoken from bpe-openai into a cache dir, verify it, return the dir.

    Sets TIKTOKEN_ENCODINGS_BASE so openai-harmony reads the file instead of downloading.
    """
    cache_dir = cache_dir or _cache_dir()
    target = cache_dir / O200K_FILE
    if not target.exists() or _sha256(target) != O200K_SHA256:
        try:
            packed = resources.files("bpe_openai") / "data" / f"{O200K_FILE}.gz"
            data = gzip.decompress(packed.read_bytes())
        except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
            raise VocabularyError(
                f"cannot read {O200K_FILE}.gz from the bpe-openai package ({exc}); "
                "install it with `pip install bpe-openai`"
            ) from exc
        digest = hashlib.sha256(data).hexdigest()
        if digest != O200K_SHA256:
            raise VocabularyError(
                f"{O200K_FILE} from bpe-openai has sha256 {digest}, expected {O200K_SHA256}; "
                "refusing to use an unknown vocabulary"
            )
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(target)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(cache_dir)
    return cache_dir


@functools.cache
def harmony_encoding() -> HarmonyEncoding:
    """The gpt-oss harmony encoding, loaded offline."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    ensure_vocabulary()
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


# From this many characters a text is encoded by bpe-openai's o200k tokenizer: harmony's BPE is quadratic
# in a pre-token's length (100,000 letters in one word take ~6 s, 300,000 ~70 s) and its regex overflows
# its stack past ~1 MB (a panic). bpe-openai's is linear and gives the same tokens (tests/batch/harmony/
# test_vocab.py); below the threshold harmony's is the faster to call, and its ~1-2 s load is spared.
LINEAR_ENCODE_FROM = 16_384


@functools.cache
def _linear_tokenizer() -> Any:
    """bpe-openai's o200k encoder (its bindings' own API), or None where this bpe-openai has none."""
    try:
        from bpe_openai import _bindings

        return _bindings.tokenizer_for_encoding("o200k_base")
    except (ImportError, AttributeError):
        return None


def ordinary_tokens(text: str) -> list[int]:
    """The text's tokens, special-token spellings included as plain text (as harmony renders content)."""
    if len(text) >= LINEAR_ENCODE_FROM and (linear := _linear_tokenizer()) is not None:
        return linear.encode(text)
    return harmony_encoding()._inner.encode(text, [])  # the wrapper's special-token check costs ~60 us
