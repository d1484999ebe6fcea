"""The harmony vocabulary comes from the bpe-openai wheel, verified, never downloaded."""

import os
from pathlib import Path

import pytest

from batch.harmony import vocab


def test_unpacks_verifies_and_points_harmony_at_the_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    assert vocab.ensure_vocabulary(tmp_path) == tmp_path
    assert (tmp_path / vocab.O200K_FILE).exists()
    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == str(tmp_path)


def test_corrupt_cached_file_is_replaced(tmp_path):
    (tmp_path / vocab.O200K_FILE).write_text("not a vocabulary")
    vocab.ensure_vocabulary(tmp_path)
    assert vocab._sha256(tmp_path / vocab.O200K_FILE) == vocab.O200K_SHA256


def test_wrong_checksum_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(vocab, "O200K_SHA256", "0" * 64)
    with pytest.raises(vocab.VocabularyError, match="refusing to use an unknown vocabulary"):
        vocab.ensure_vocabulary(tmp_path)


def test_missing_package_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(vocab, "O200K_FILE", "no_such_encoding.tiktoken")
    with pytest.raises(vocab.VocabularyError, match="bpe-openai"):
        vocab.ensure_vocabulary(tmp_path)


def _harmony_tokens(text):
    return vocab.harmony_encoding()._inner.encode(text, [])


def test_the_linear_encoder_gives_harmonys_tokens():
    # Texts from the threshold up go to bpe-openai's encoder: it must split and merge exactly as harmony does,
    # over the pre-tokenizer's edge cases (contractions, case runs, digits in threes, marks, spaces, newlines).
    import random

    rng = random.Random(7)
    alphabet = [*"abcXYZ019 \n\r\t.,'\"-_#<|>", "é", "ß", "日", "😀", "\u0301", "\u200b", "ʼ", "Ⅻ", "١", "\u00a0",
                "'s", "'S", "'ll", " '", "<|start|>", "<|end|>"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80))) for _ in range(3000)]
    readme = (Path(__file__).parents[3] / "README.md").read_text(encoding="utf-8")
    texts += [readme, readme[:vocab.LINEAR_ENCODE_FROM], "Zx" * vocab.LINEAR_ENCODE_FROM]
    mismatched = [text for text in texts if vocab._linear_tokenizer().encode(text) != _harmony_tokens(text)]
    assert not mismatched, f"{len(mismatched)} texts differ, first {mismatched[0]!r:.200}"
    assert len(readme) >= vocab.LINEAR_ENCODE_FROM
    assert vocab.ordinary_tokens(readme) == _harmony_tokens(readme)


def test_a_megabyte_word_encodes():
    # harmony's regex overflows its stack on it (a panic), and its BPE is quadratic in a word's length
    text = "a" * 1_200_000
    tokens = vocab.ordinary_tokens(text)
    assert vocab.harmony_encoding().decode_utf8(tokens) == text
    assert len(tokens) == 150_000  # "aaaaaaaa" is one token


def test_without_bpe_openais_encoder_long_texts_take_harmonys(monkeypatch):
    # its bindings are no public API: a bpe-openai without them must not fail long prompts
    monkeypatch.setattr(vocab, "_linear_tokenizer", lambda: None)
    text = "word " * 4000
    assert len(text) >= vocab.LINEAR_ENCODE_FROM and vocab.ordinary_tokens(text) == _harmony_tokens(text)
