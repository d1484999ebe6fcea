"""A prompt's head: the system (+ developer) messages, rendered once per distinct `HeadSpec`.

The requests of a run mostly share their head, and rendering it is most of a prompt's
rendering time. `HeadSpec` is everything the head shows, in a hashable form; the head is
built from the spec alone, so the spec is a complete key of the cache: a request whose
head would differ in any token has a different spec. It is cheap to build: listed MCP
schemas count by identity and function parameters by their JSON text (ToolSections), where
the key before it serialised every message, each tool's schema included, on each request
(with 30 listed tools, ~0.75 ms of a request's 1.2 ms under cProfile).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, replace

from openai_harmony import (
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
)

from batch.harmony.sections import COMMENTARY_LINE, commentary_line
from batch.harmony.token_parser import END_TOKEN, MESSAGE_TOKEN, START_TOKEN
from batch.harmony.tool_sections import ToolSections, with_developer_tools, with_system_tools
from batch.harmony.vocab import harmony_encoding, ordinary_tokens
from batch.responses.request import REASONING_EFFORTS

# Harmony's efforts are low, medium and high: an API effort it lacks renders as the nearest one.
_HARMONY_NEAREST = {"minimal": "low"}
_HASH_TOKEN = 2  # o200k's "#"
_EFFORT = {name: ReasoningEffort[_HARMONY_NEAREST.get(name, name).upper()] for name in REASONING_EFFORTS}


@dataclass(frozen=True)
class HeadSpec:
    """Everything a prompt's head shows; equal specs render equal tokens (the head cache's key)."""

    effort: str
    date: str | None
    knowledge_cutoff: str
    instructions: str | None  # the developer message's `# Instructions`
    tools: ToolSections
    commentary: tuple[str, ...] = ()  # namespaces the system message routes to commentary (empty: harmony's own line)
    response_format: str | None = None  # the `# Response Formats` section


def system_content(effort: str, date: str | None, knowledge_cutoff: str) -> SystemContent:
    """Harmony's system content: reasoning effort, knowledge cutoff, and the date when there is one."""
    content = SystemContent.new().with_reasoning_effort(_EFFORT[effort]).with_knowledge_cutoff(knowledge_cutoff)
    return content.with_conversation_start_date(date) if date else content


def head_messages(spec: HeadSpec) -> list[Message]:
    """The system (+ developer) messages as harmony builds them (before batchrun's additions)."""
    system = with_system_tools(spec.tools, system_content(spec.effort, spec.date, spec.knowledge_cutoff))
    head = [Message.from_role_and_content(Role.SYSTEM, system)]
    if spec.instructions or spec.tools.has_developer_tools:
        developer = DeveloperContent.new()
        if spec.instructions:
            developer = developer.with_instructions(spec.instructions)
        head.append(Message.from_role_and_content(Role.DEVELOPER, with_developer_tools(spec.tools, developer)))
    return head


def _messages(tokens: list[int]) -> list[tuple[list[int], int]]:
    """A rendered conversation's messages: (each one's tokens, where its content starts in them)."""
    messages: list[tuple[list[int], int]] = []
    start = content = 0
    for position, token in enumerate(tokens):
        if token == START_TOKEN:
            start = position
        elif token == MESSAGE_TOKEN:
            content = position + 1 - start
        elif token == END_TOKEN:
            messages.append((tokens[start:position + 1], content))
    return messages


def _with_additions(tokens: list[int], namespaces: tuple[str, ...], response_format: str | None) -> list[int]:
    """The head's tokens with the guide's additions harmony has no builder for.

    Harmony renders a message's content as one text (tests/batch/harmony/test_sections.py checks
    it), so a text message holding harmony's rendered text plus the additions is token for token
    what harmony would render if it had them. Only the messages that change are rendered again:
    the developer message, tools and all, is most of the head's tokens and most of its cost.
    """
    encoding = harmony_encoding()
    (system, system_start), *rest = _messages(tokens)
    if namespaces:
        # harmony wrote the line for `functions` only (when there are function tools)
        text = encoding.decode(system[system_start:-1])
        text = text.split("\n" + COMMENTARY_LINE)[0] + "\n" + commentary_line(list(namespaces))
        system = encoding.render(Message.from_role_and_content(Role.SYSTEM, text))
    if response_format:  # the guide: at the end of the developer message
        developer = encoding.decode(rest[0][0][rest[0][1]:-1]) if rest else ""
        text = f"{developer}\n\n{response_format}" if developer else response_format
        rest = [(encoding.render(Message.from_role_and_content(Role.DEVELOPER, text)), 0)]
    return [*system, *(token for message, _ in rest for token in message)]


def render_head(spec: HeadSpec) -> list[int]:
    """The head's tokens, rendered afresh (what the cache holds)."""
    tokens = harmony_encoding().render_conversation(Conversation.from_messages(head_messages(spec)))
    if spec.commentary or spec.response_format:
        tokens = _with_additions(tokens, spec.commentary, spec.response_format)
    return tokens


@functools.cache
def _developer_start() -> tuple[int, ...]:
    return (START_TOKEN, *ordinary_tokens("developer"), MESSAGE_TOKEN)


def with_instructions(head: list[int], instructions: str) -> list[int] | None:
    """The head with `instructions`, from the same spec's head without them; None where its developer
    message's content does not start with a `#` heading. A head without a developer message gets one
    holding the section alone. Harmony's own rendering of a long text is quadratic in its longest word,
    and panics past ~1 MB; this one is linear (batch/harmony/vocab.py).

    Harmony joins the developer message's sections with a blank line, `# Instructions` first, and
    encodes the content as one ordinary text; batchrun's response format joins the same way. So
    the content is "# Instructions\n\n{instructions}\n\n" + the content without them, and o200k's
    pre-tokenizer ends a piece at the last newline of a run before a `#` whatever precedes the run:
    none of its patterns takes a newline and then a `#`. The tokens of the two texts are the
    tokens of the whole (tests/batch/harmony/test_head.py checks it against `render_head` over
    edge-case texts). With 30 MCP tools this is ~0.1 ms where rendering afresh is ~5 ms.
    """
    try:
        content = head.index(MESSAGE_TOKEN, head.index(START_TOKEN, 1)) + 1
    except ValueError:  # the system message alone: the developer message holds the section alone
        return [*head, *_developer_start(), *ordinary_tokens(f"# Instructions\n\n{instructions}"), END_TOKEN]
    if content == len(head) or head[content] != _HASH_TOKEN:
        return None
    return [*head[:content], *ordinary_tokens(f"# Instructions\n\n{instructions}\n\n"), *head[content:]]


class HeadCache:
    """Rendered heads by their spec: requests of a run mostly share them.

    Harmony renders a conversation message by message. Only the system message
    depends on the rest (its tool-routing line appears when a developer message
    declares functions), and both sit in the head; the analysis messages a
    conversation drops are assistant ones, all in the tail. So head + tail equals
    the whole conversation's rendering (tests/batch/harmony/test_harmony.py checks it).
    The cached tokens are shared: read them, never edit them.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._tokens: OrderedDict[HeadSpec, list[int]] = OrderedDict()

    def tokens(self, spec: HeadSpec) -> list[int]:
        tokens = self._tokens.get(spec)
        if tokens is None:
            tokens = self._render(spec)
            self._tokens[spec] = tokens
            if len(self._tokens) > self.size:
                self._tokens.popitem(last=False)
        else:
            self._tokens.move_to_end(spec)
        return tokens

    def _render(self, spec: HeadSpec) -> list[int]:
        """A head the cache lacks: a spec with instructions from its head without them (cached
        too: a run whose every request has its own instructions mostly shares the rest)."""
        if spec.instructions:
            tokens = with_instructions(self.tokens(replace(spec, instructions=None)), spec.instructions)
            if tokens is not None:
                return tokens
        return render_head(spec)


HEADS = HeadCache(256)
