"""The harmony vocabulary comes from the bpe-openai wheel, verified, never downloaded."""

import os

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
