"""A call no tool serves (an unknown or disabled recipient), kept so that a re-render shows what the model read.

The Responses API has no item for such a call: the output shows the model's attempt as a reasoning item (its
text), and the loop answers it with an error. That item carries the call's header and the answer in its
`encrypted_content` (the API's opaque field for reasoning state a client passes back), so a continuation renders
the call and the error the model read, not a bare analysis message.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

_PREFIX = "batchrun:harmony-call:"


@dataclass(frozen=True)
class Attempt:
    """The call's header as the model wrote it, and the tool message that answered it."""

    recipient: str
    channel: str | None
    content_type: str | None
    answer: str

    def encode(self) -> str:
        """The item's `encrypted_content`."""
        return _PREFIX + json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)


def read_attempt(encrypted_content: object) -> Attempt | None:
    """The attempt a reasoning item's `encrypted_content` holds; None for anything else (e.g. the API's own)."""
    if not isinstance(encrypted_content, str) or not encrypted_content.startswith(_PREFIX):
        return None
    try:
        fields = json.loads(encrypted_content[len(_PREFIX):])
        return Attempt(str(fields["recipient"]), fields.get("channel"), fields.get("content_type"),
                       str(fields["answer"]))
    except (ValueError, KeyError, TypeError):
        return None
