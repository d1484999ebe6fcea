"""A call's header as the model wrote it: its text from the tokens, and what harmony reads in it."""

import pytest

from batch.harmony.call_header import HeaderFields, header_ids, header_text, read_header
from batch.harmony.vocab import harmony_encoding


@pytest.mark.parametrize(("header", "fields"), [
    (" to=echo.add<|channel|>commentary <|constrain|>json",
     HeaderFields("echo.add", "commentary", "<|constrain|>json")),
    ("<|channel|>analysis to=browser.search code", HeaderFields("browser.search", "analysis", "code")),
    (" to=echo.add <|constrain|>json", HeaderFields("echo.add", None, "<|constrain|>json")),  # no channel
    ("<|channel|>commentary to=functions.f", HeaderFields("functions.f", "commentary", None)),  # no content type
])
def test_a_header_reads_as_harmony_reads_it_and_its_text_is_its_tokens(header, fields):
    assert read_header(header) == fields
    assert header_text(header_ids(header)) == header
    assert harmony_encoding().decode_utf8(header_ids(header)) == header


@pytest.mark.parametrize("header", [
    "<|channel|>final",  # names no recipient: a message, not a call
    "<|channel|>commentary to=echo.add<|message|>{}",  # more than a header
    "<|channel|>",  # harmony refuses it
])
def test_anything_but_one_call_header_reads_as_none(header):
    assert read_header(header) is None


def test_tokens_that_are_not_whole_utf8_have_no_text():
    assert header_text([177]) is None  # one byte of a character
