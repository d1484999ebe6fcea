"""Completion tokens -> parser steps: TokenParser against harmony's own parser."""

import random
import time

import pytest

from openai_harmony import Role, StreamableParser, StreamState

from batch.harmony.token_parser import Boundary, HarmonyError, ParsedMessage, TokenParser
from batch.harmony.vocab import harmony_encoding

def test_token_parser_reports_opens_deltas_closes_and_channels():
    enc = harmony_encoding()
    tokens = enc.encode("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant"
                        "<|channel|>commentary to=python <|constrain|>json<|message|>1+1<|call|>",
                        allowed_special="all")
    parser = TokenParser()
    opened, closed, deltas = [], [], []
    for token_id in tokens:
        step = parser.feed(token_id)
        if step is Boundary.OPENED:
            opened.append((parser.channel, parser.recipient, parser.content_type))
        elif step is Boundary.CLOSED:
            closed.append(parser.last_message)
        elif step is not None:
            deltas.append(step)
    assert opened == [("analysis", None, None), ("commentary", "python", "<|constrain|>json")]
    assert "".join(deltas) == "Think.1+1"
    assert [m.text for m in closed] == ["Think.", "1+1"]
    assert closed[-1] == ParsedMessage("commentary", "python", "<|constrain|>json", "1+1", 200012)


def test_a_messages_header_as_written_is_its_tokens_after_the_assistant_and_before_message():
    enc = harmony_encoding()
    completion = ("<|channel|>commentary to=echo.add <|constrain|>json<|message|>{}<|call|>"
                  "<|start|>assistant to=python<|channel|>analysis code<|message|>1<|call|>")
    parser = TokenParser()
    written = [parser.written_header_ids() for token_id in enc.encode(completion, allowed_special="all")
               if parser.feed(token_id) is Boundary.OPENED]
    # the turn's first message follows the prompt's <|start|>assistant; a later one writes its own
    assert [enc.decode_utf8(ids) for ids in written] == ["<|channel|>commentary to=echo.add <|constrain|>json",
                                                         " to=python<|channel|>analysis code"]


def _steps_from_parser_state(tokens):
    """The oracle: what harmony's own parser state says each token did (slow: JSON per read)."""
    parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT)
    steps = []
    for token_id in tokens:
        was_content = parser.state == StreamState.CONTENT
        num_messages = len(parser.messages)
        parser.process(token_id)
        in_content = parser.state == StreamState.CONTENT
        if in_content and not was_content:
            steps.append(("opened", parser.current_channel, parser.current_recipient, parser.current_content_type))
        elif len(parser.messages) > num_messages:
            message = parser.messages[-1]
            steps.append(("closed", message.channel, message.recipient, message.content_type,
                          "".join(c.text for c in message.content)))
        elif in_content:
            steps.append(("delta", parser.last_content_delta or ""))
        else:
            steps.append(None)
    return steps


def _steps_from_token_parser(tokens):
    parser = TokenParser()
    steps = []
    for token_id in tokens:
        step = parser.feed(token_id)
        if step is Boundary.OPENED:
            steps.append(("opened", parser.channel, parser.recipient, parser.content_type))
        elif step is Boundary.CLOSED:
            message = parser.last_message
            steps.append(("closed", message.channel, message.recipient, message.content_type, message.text))
        elif step is not None:
            steps.append(("delta", step))
        else:
            steps.append(None)
    return steps


@pytest.mark.parametrize("text", [
    "<|channel|>final<|message|>123*2<|channel|>final<|message|>492<|return|>",
    "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": <|start|>1}<|call|>",
])
def test_a_control_token_inside_a_message_is_an_error_not_text(text):
    tokens = harmony_encoding().encode(text, allowed_special="all")
    parser = TokenParser()
    with pytest.raises(HarmonyError, match="control token <\\|(channel|start)\\|> inside a message"):
        for token_id in tokens:
            parser.feed(token_id)


@pytest.mark.parametrize("text", [
    "<|channel|>analysis<|message|>Let me think about 123*456 — café 😀.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 56088.<|return|>",
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
    "<|channel|>analysis to=python code<|message|>print(1)<|call|>",
    "<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|><|return|>",
])
def test_token_parser_agrees_with_harmonys_parser_state(text):
    tokens = harmony_encoding().encode(text, allowed_special="all")
    assert _steps_from_token_parser(tokens) == _steps_from_parser_state(tokens)


def test_token_parser_raises_on_malformed_harmony():
    tokens = harmony_encoding().encode("<|channel|>final<|message|>x<|end|>garbage", allowed_special="all")
    parser = TokenParser()
    with pytest.raises(HarmonyError):
        for token_id in tokens:
            parser.feed(token_id)


def _seconds_per_token(tokens, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        parser = TokenParser()
        started = time.perf_counter()
        for token_id in tokens:
            parser.feed(token_id)
        best = min(best, time.perf_counter() - started)
    return best / len(tokens)


def test_token_parser_cost_per_token_does_not_grow_with_the_message():
    """A 20,000-token message costs about what a short one does per token (a ratio, not a time)."""
    enc = harmony_encoding()
    word_ids = enc.encode(" word")

    def message(num_tokens):
        return (enc.encode("<|channel|>analysis<|message|>", allowed_special="all") + word_ids * num_tokens
                + enc.encode("<|end|>", allowed_special="all"))

    start = enc.encode("<|start|>assistant", allowed_special="all")
    short = _seconds_per_token(message(200) + (start + message(200)) * 9)  # ten short messages
    long = _seconds_per_token(message(20_000))
    assert long < 3 * short, f"{long * 1e6:.2f} us/token for 20,000 tokens vs {short * 1e6:.2f} for 200"


def _byte_tokens(data: bytes) -> list[int]:
    """One token per byte (o200k has a token for every single byte)."""
    from batch.harmony.constraint import o200k

    ranks, _ = o200k()
    return [ranks[bytes([byte])] for byte in data]


def test_a_character_split_over_tokens_is_one_delta_and_text_after_bad_bytes_is_kept():
    enc = harmony_encoding()
    head = enc.encode("<|channel|>final<|message|>", allowed_special="all")
    emoji = "😀".encode()
    tokens = head + _byte_tokens(emoji) + _byte_tokens(b"\x80") + enc.encode(" isotope") + [200002]
    steps = _steps_from_token_parser(tokens)
    deltas = [step[1] for step in steps if step and step[0] == "delta"]
    assert deltas[:len(emoji)] == [""] * (len(emoji) - 1) + ["😀"]
    assert "".join(deltas) == "😀\ufffd isotope"
    assert steps[-1] == ("closed", "final", None, None, "😀\ufffd isotope")


def _outline(feed, tokens):
    """(the boundaries and header fields each token gave, and the error that stopped the parse)."""
    steps = []
    try:
        for token_id in tokens:
            steps.append(feed(token_id))
    except HarmonyError as exc:
        return steps, str(exc)
    return steps, None


def _harmony_outline(tokens):
    """The oracle: every token through one harmony parser, its state read after each (slow)."""
    parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT)

    def feed(token_id):
        was_content = parser.state == StreamState.CONTENT
        parser.process(token_id)
        if parser.state == StreamState.CONTENT and not was_content:
            return ("opened", parser.current_channel, parser.current_recipient, parser.current_content_type)
        return "closed" if was_content and parser.state != StreamState.CONTENT else None
    return _outline(feed, tokens)


def _token_parser_outline(tokens):
    parser = TokenParser()

    def feed(token_id):
        step = parser.feed(token_id)
        if step is Boundary.OPENED:
            return ("opened", parser.channel, parser.recipient, parser.content_type)
        return "closed" if step is Boundary.CLOSED else None
    return _outline(feed, tokens)


def test_headers_remembered_from_harmony_fail_and_open_exactly_as_harmony_does():
    enc = harmony_encoding()
    rng = random.Random(7)
    heads = ["<|channel|>analysis<|message|>", "<|channel|>final<|message|>",
             " to=python<|channel|>analysis code<|message|>",
             "<|channel|>commentary to=functions.x <|constrain|>json<|message|>", "<|message|>", "oops<|message|>"]
    between = ["<|start|>assistant", "<|start|>user", "<|start|>assistant to=functions.z", "x"]
    sequences = []
    for _ in range(150):
        # A turn's first header follows the prompt's <|start|>assistant: the same tokens can mean another thing there.
        tokens = enc.encode(rng.choice(between), allowed_special="all") if rng.random() < 0.2 else []
        for _ in range(rng.randint(1, 3)):
            head = enc.encode(rng.choice(heads), allowed_special="all")
            if rng.random() < 0.3:  # a stray token in the header (in content, ours is an error harmony allows)
                head.insert(rng.randrange(len(head)), rng.choice([t for t in range(199990, 200018) if t != 200008]))
            tokens += head + enc.encode(" plain words") + [rng.choice([200007, 200007, 200002])]
            if tokens[-1] != 200007:
                break
            tokens += enc.encode(rng.choice(between), allowed_special="all")
        sequences.append(tokens)
    expected = [_harmony_outline(tokens) for tokens in sequences]
    assert sum(error is not None for _, error in expected) > 20  # malformed headers are exercised
    for _ in range(2):  # first parses, then what was remembered
        assert [_token_parser_outline(tokens) for tokens in sequences] == expected


def test_a_header_that_never_ends_costs_the_same_per_token_and_is_not_remembered_whole():
    """A model that never writes <|message|>: linear time, and only the first prefixes remembered."""
    from batch.harmony import token_parser

    word = harmony_encoding().encode(" word")

    def header_tokens(num_tokens):
        return [*harmony_encoding().encode("<|channel|>", allowed_special="all"), *word * num_tokens]

    before = len(token_parser._HEADERS)
    short = _seconds_per_token(header_tokens(400))
    long = _seconds_per_token(header_tokens(4_000))
    assert long < 3 * short, f"{long * 1e6:.2f} us/token for a 4,000-token header vs {short * 1e6:.2f} for 400"
    assert len(token_parser._HEADERS) - before <= 200  # not one entry per prefix of 4,000


def test_a_small_header_memory_cleared_mid_header_changes_nothing(monkeypatch):
    from batch.harmony import token_parser

    monkeypatch.setattr(token_parser, "_HEADERS", token_parser._HeaderOutcomes(3))
    tokens = harmony_encoding().encode("<|channel|>commentary to=functions.get_weather <|constrain|>json"
                                       "<|message|>{}<|call|>", allowed_special="all")
    for _ in range(2):
        assert _token_parser_outline(tokens) == _harmony_outline(tokens)


def test_a_header_seen_before_needs_no_harmony_parser(monkeypatch):
    from batch.harmony import token_parser

    made = []

    def counting(*args, **kwargs):
        made.append(1)
        return StreamableParser(*args, **kwargs)

    monkeypatch.setattr(token_parser, "_HEADERS", token_parser._HeaderOutcomes(1 << 16))
    monkeypatch.setattr(token_parser, "StreamableParser", counting)
    tokens = harmony_encoding().encode("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary"
                                       " to=functions.get_weather <|constrain|>json<|message|>{}<|call|>",
                                       allowed_special="all")
    _token_parser_outline(tokens)
    assert len(made) == 2  # one per header, each read to its end
    assert _token_parser_outline(tokens) == _harmony_outline(tokens) and len(made) == 2
