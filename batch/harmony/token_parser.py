"""Completion tokens -> parser steps: harmony's token ids, and `TokenParser`, O(1) per token.

The engine stops a turn at `STOP_TOKEN_IDS`; `TokenParser` tells the output parser
where each message's content starts and ends and what text each token adds.
"""

from __future__ import annotations

import codecs
import enum
import functools
from dataclasses import dataclass
from typing import Any

from openai_harmony import HarmonyError, Role, StreamableParser

from batch.harmony.vocab import harmony_encoding

RETURN_TOKEN = 200002
CALL_TOKEN = 200012
STOP_TOKEN_IDS = (RETURN_TOKEN, CALL_TOKEN)
FIRST_SPECIAL_TOKEN = 199998  # o200k_harmony's special tokens are the ids from here on
START_TOKEN = 200006
MESSAGE_TOKEN = 200008
END_TOKEN = 200007
# Tokens that end a message's content; any other token inside content is text.
CONTENT_END_TOKENS = frozenset((END_TOKEN, CALL_TOKEN, RETURN_TOKEN))


@functools.cache
def assistant_start_ids() -> tuple[int, ...]:
    """`<|start|>assistant`: how an assistant message begins (a turn's first one, at the end of its prompt)."""
    return tuple(harmony_encoding().encode("<|start|>assistant", allowed_special="all"))


class Boundary(enum.Enum):
    """A token that starts or ends a message's content."""

    OPENED = "opened"
    CLOSED = "closed"


@dataclass(frozen=True)
class ParsedMessage:
    """A complete harmony message of the completion: its header and its text."""

    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str
    end_token: int


class _ContentDecoder:
    """A message's content tokens -> text, incrementally (a character split over tokens waits).

    Harmony's parser would do the same at ~1 us a token; the text of most tokens is
    cached, and only a token that leaves a character incomplete goes through the
    UTF-8 decoder. Bytes still pending when the message ends are dropped (as harmony's
    deltas drop them). Invalid bytes become U+FFFD where the decoder meets them; on such
    output harmony's deltas could place them a token later, or lose the text after them.
    """

    __slots__ = ("_decoder", "pending")

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = False  # bytes of an incomplete character wait in the decoder

    def decode(self, token_id: int) -> str:
        try:
            text = _TOKEN_TEXTS[token_id]
        except KeyError:
            text = _TOKEN_TEXTS[token_id] = _whole_text(token_id)
        if text is not None and not self.pending:
            return text
        delta = self._decoder.decode(_token_bytes(token_id))
        self.pending = bool(self._decoder.getstate()[0])
        return delta


_TOKEN_TEXTS: dict[int, str | None] = {}  # token id -> its text; None when it is not whole UTF-8


def _token_bytes(token_id: int) -> bytes:
    return bytes(harmony_encoding()._inner.decode_bytes([token_id]))


def token_text_and_bytes(token_id: int) -> tuple[str, list[int]]:
    """A token's text (U+FFFD for the bytes of a character it leaves incomplete) and its bytes, as logprob
    entries list them (cached: 20 top tokens a position ask for it 21 times). Read, never edit, the list."""
    try:
        return _TOKEN_ENTRIES[token_id]
    except KeyError:
        data = _token_bytes(token_id)
        entry = _TOKEN_ENTRIES[token_id] = (data.decode("utf-8", "replace"), list(data))
        return entry


_TOKEN_ENTRIES: dict[int, tuple[str, list[int]]] = {}


def _whole_text(token_id: int) -> str | None:
    try:
        return _token_bytes(token_id).decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class _HeaderFields:
    channel: str | None
    recipient: str | None
    content_type: str | None


class _HeaderOutcomes:
    """What harmony's parser made of each header prefix it has seen: accepted so far (None),
    the header's fields (at `<|message|>`), or its error message.

    Harmony checks a header on its own (after a message's end token it expects the next
    `<|start|>`, and a turn's first header follows the prompt's `<|start|>assistant`), and
    it costs ~25-100 us a header token; a run's models write the same few headers over and
    over, so each prefix is parsed once per process. Cleared when full (garbage headers
    of a random model must not grow it without bound).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._outcomes: dict[tuple[bool, tuple[int, ...]], _HeaderFields | str | None] = {}

    def get(self, key: tuple[bool, tuple[int, ...]]) -> _HeaderFields | str | None | bool:
        """The outcome, or False when this prefix was never parsed."""
        return self._outcomes.get(key, False)

    def __len__(self) -> int:
        return len(self._outcomes)

    def put(self, key: tuple[bool, tuple[int, ...]], outcome: _HeaderFields | str | None) -> None:
        if len(self._outcomes) >= self.size:
            self._outcomes.clear()
        self._outcomes[key] = outcome


_HEADERS = _HeaderOutcomes(1 << 16)
# Longer headers (a model that never writes <|message|>) are parsed by harmony as they come:
# remembering every prefix of one would cost time and memory quadratic in its length.
MAX_REMEMBERED_HEADER = 64


class TokenParser:
    """Incremental harmony parsing of one turn's completion tokens, O(1) per token.

    openai-harmony's `StreamableParser` validates the message structure, but its
    `state` and `messages` serialise everything parsed so far to JSON on each read,
    and each header token costs it tens of microseconds. This class reads neither per
    token: the token ids say when content starts (`<|message|>` in a header) and ends
    (`<|end|>`, `<|call|>`, `<|return|>` in content). Headers go through harmony's
    parser once per distinct header (`_HeaderOutcomes` remembers what it said, errors
    included, so a cached header fails at the same token with the same message); content
    tokens never reach it: `_ContentDecoder` turns them into text.
    """

    __slots__ = ("in_content", "channel", "recipient", "content_type", "_parts", "last_message",
                 "_content", "_header", "_first", "_live")

    def __init__(self) -> None:
        self.in_content = False
        self.channel: str | None = None  # of the open message (or the last one, once closed)
        self.recipient: str | None = None
        self.content_type: str | None = None
        self._parts: list[str] = []
        self.last_message: ParsedMessage | None = None
        self._content = _ContentDecoder()
        self._header: list[int] = []  # the current header's tokens so far
        self._first = True  # the turn's first header (it follows the prompt's <|start|>assistant)
        self._live: Any = None  # harmony's parser, on a header it has not seen before

    def feed(self, token_id: int) -> str | Boundary | None:
        """Parse one token; raises HarmonyError on malformed harmony.

        Returns the content text the token added ("" while a character is still
        incomplete), `Boundary.OPENED` when a message's content starts (the header
        fields are set), `Boundary.CLOSED` when it ends (`last_message` is set), or
        None for any other header token.
        """
        if self.in_content:
            if token_id in CONTENT_END_TOKENS:
                self.in_content = False
                self._header, self._first = [], False
                self.last_message = ParsedMessage(self.channel, self.recipient, self.content_type,
                                                  "".join(self._parts), token_id)
                return Boundary.CLOSED
            if token_id >= FIRST_SPECIAL_TOKEN:  # harmony would keep `<|channel|>` etc. as text
                raise HarmonyError(f"control token {harmony_encoding().decode([token_id])} inside a message")
            # Most tokens are whole characters: their cached text, without a call.
            delta = _TOKEN_TEXTS.get(token_id)
            if delta is None or self._content.pending:
                delta = self._content.decode(token_id)
            if delta:
                self._parts.append(delta)
            return delta
        self._header.append(token_id)
        key = (self._first, tuple(self._header)) if len(self._header) <= MAX_REMEMBERED_HEADER else None
        # Once harmony's parser is on a header, it reads the rest of it (and remembers what it says).
        outcome = _HEADERS.get(key) if key is not None and self._live is None else False
        if outcome is False:
            outcome = self._parse(token_id, key)
        if isinstance(outcome, str):
            raise HarmonyError(outcome)
        if isinstance(outcome, _HeaderFields):
            self.in_content, self._live = True, None
            self.channel, self.recipient, self.content_type = outcome.channel, outcome.recipient, outcome.content_type
            self._parts = []
            self._content = _ContentDecoder()
            return Boundary.OPENED
        return None

    def _parse(self, token_id: int, key: tuple[bool, tuple[int, ...]] | None) -> _HeaderFields | str | None:
        """Harmony's verdict on a header prefix not seen before (remembered for the next time, by `key`).

        Once a header needs harmony, its parser stays on it to the end of the header.
        """
        if self._live is None:
            parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT if self._first else None)
            # The Rust object behind the wrapper has the same methods, two Python frames nearer.
            self._live = getattr(parser, "_inner", parser)
            for earlier in self._header[:-1]:  # accepted before: they were remembered so
                self._live.process(earlier)
        outcome: _HeaderFields | str | None = None
        try:
            self._live.process(token_id)
        except HarmonyError as exc:
            outcome = str(exc)
        else:
            if token_id == MESSAGE_TOKEN:
                live = self._live
                outcome = _HeaderFields(live.current_channel, live.current_recipient, live.current_content_type)
        if key is not None:
            _HEADERS.put(key, outcome)
        return outcome

    @property
    def text(self) -> str:
        """The text of the open message so far."""
        return "".join(self._parts)

    def written_header_ids(self) -> list[int] | None:
        """The open message's header as the model wrote it (once it opened): its tokens after
        `<|start|>assistant` (for a turn's first message, the prompt's) and before `<|message|>`; None when it
        names another author."""
        header = self._header[:-1]
        if self._first:
            return header
        author = assistant_start_ids()
        return header[len(author):] if tuple(header[:len(author)]) == author else None
