"""What a continuation must re-render for a finished turn: the invariant of re-rendered conversations.

A response's own output items, rendered again (a `previous_response_id` chain, a `conversation`'s next
line, a `truncation: "auto"` turn of a tool loop), must be the tokens the model wrote and read: the last
turn's prompt followed by its completion, changed only by harmony's own rules for a past turn
(`as_continued`).
"""

from __future__ import annotations

from batch.harmony.token_parser import MESSAGE_TOKEN, RETURN_TOKEN
from batch.harmony.vocab import harmony_encoding

START_TOKEN = 200006  # <|start|>
END_TOKEN = 200007  # <|end|>


def _messages(tokens: list[int]) -> list[list[int]]:
    """The token sequence cut before each `<|start|>`: one piece a message."""
    pieces: list[list[int]] = []
    for token in tokens:
        if token == START_TOKEN or not pieces:
            pieces.append([])
        pieces[-1].append(token)
    return pieces


def _header(message: list[int]) -> tuple[str, str | None]:
    """A message's author and channel, read from its header."""
    header = harmony_encoding().decode_utf8(message[1:message.index(MESSAGE_TOKEN)])
    author = header.split("<|", 1)[0].split(" ", 1)[0]
    channel = header.split("<|channel|>", 1)[1].split("<|", 1)[0].split(" ", 1)[0] if "<|channel|>" in header else None
    return author, channel


def as_continued(tokens: list[int]) -> list[int]:
    """`tokens` (a turn's prompt + completion, ending in an assistant message) as any later prompt must begin.

    Exactly two changes, both harmony's own rules for a conversation's past, nothing else:
    1. a final answer's closing `<|return|>` is written `<|end|>` (the harmony guide: `<|return|>` is a
       decode-time stop token; in the history it becomes `<|end|>`);
    2. when the conversation's last assistant message is on the `final` channel (the response ended with its
       answer), every message on the `analysis` channel that comes before the conversation's first `final`
       message is dropped (openai-harmony's `auto_drop_analysis`: reasoning, and the python and browser calls,
       which the model makes on `analysis`). A response that ended in a function call keeps all of them.
    """
    messages = _messages(tokens)
    if messages[-1][-1] == RETURN_TOKEN:
        messages[-1] = [*messages[-1][:-1], END_TOKEN]
    headers = [_header(message) if message[0] == START_TOKEN else ("", None) for message in messages]
    assistant = [channel for author, channel in headers if author == "assistant"]
    if assistant and assistant[-1] == "final":
        first_final = next(index for index, (_, channel) in enumerate(headers) if channel == "final")
        messages = [message for index, message in enumerate(messages)
                    if not (index < first_final and headers[index][1] == "analysis")]
    return [token for message in messages for token in message]


def next_user_turn(text: str) -> list[int]:
    """A user message and the assistant's header, as the prompt of a continuation ends."""
    return harmony_encoding().encode(f"<|start|>user<|message|>{text}<|end|><|start|>assistant",
                                     allowed_special="all")
