"""A call's header as the model wrote it, which no output item keeps: kept by item id for a re-render.

Harmony renders a header one way: the recipient, the channel, the content type
(`<|start|>assistant to=browser.search<|channel|>analysis code<|message|>`). A model may put the recipient
after the channel, as the harmony guide's own examples do (`<|channel|>analysis to=browser.search code`),
leave out the channel or the content type, or call an MCP tool on `analysis`; a function_call, mcp_call or
code_interpreter_call item has no field for any of it. So the session keeps each call's header as written, by
the id of the item that shows the call (`CallHeaders`; a response's are stored in its row's `call_headers`),
and a re-render writes the call with that header, and its answer from the recipient and on the channel the
header names, as the tool loop answered it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from openai_harmony import HarmonyError

from batch.harmony.token_parser import MESSAGE_TOKEN, Boundary, TokenParser
from batch.harmony.vocab import harmony_encoding

# item id -> the header of the call it shows, as written: the text between `<|start|>assistant` and `<|message|>`
CallHeaders = Mapping[str, str]


def header_text(header_ids: list[int]) -> str | None:
    """A header's tokens as its text (None when they are not whole UTF-8: harmony would not have read them)."""
    try:
        return harmony_encoding().decode_utf8(header_ids)
    except HarmonyError:
        return None


def header_ids(header: str) -> list[int]:
    """A header's text as tokens: its control tokens (`<|channel|>`, `<|constrain|>`) as the model wrote them."""
    return harmony_encoding().encode(header, allowed_special="all")


@dataclass(frozen=True)
class HeaderFields:
    """What harmony reads in a call's header."""

    recipient: str
    channel: str | None
    content_type: str | None


def read_header(header: str) -> HeaderFields | None:
    """The fields of a call's header as harmony's parser reads them; None for anything that is not one header
    naming a recipient (e.g. a stored value edited by hand)."""
    parser = TokenParser()
    tokens = [*header_ids(header), MESSAGE_TOKEN]
    try:
        steps = [parser.feed(token_id) for token_id in tokens]
    except HarmonyError:
        return None
    if steps.count(Boundary.OPENED) != 1 or steps[-1] is not Boundary.OPENED or not parser.recipient:
        return None
    return HeaderFields(parser.recipient, parser.channel, parser.content_type)
