"""`conversation`: the lines of a run that name one conversation decode one after another, in file order.

The Responses API prepends a conversation's items to each response that names it and adds
the response's input and output items to it once the response ends. Offline, a
conversation is the lines of one run that name the same id (each `--epochs` sample its
own): a line waits until the line before it in its conversation has its result, then
continues from that line's input and output items, as a `previous_response_id` naming
it would. So one file can hold a multi-turn eval (MT-Bench's second turns follow the
model's own first answers) without a second pass. A line after one that failed or was
invalid fails too: the conversation it would continue does not exist.

`Conversations` is the gate: which line of each conversation is out (reading, decoding),
which wait behind it, which are released to be read next, and the history each
conversation's next line continues. Waiting lines count against `--max-inflight`, so the
reader stays bounded; the first line of each waiting chain is out, so the run always moves.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from batch.responses.status import RequestStatus
from batch.run.input_line import InputLine
from batch.store.responses import ConversationTurn
from batch.store.rows import RequestResult

# Histories kept in memory, the most recently ended first; an older one is read back from the store.
MAX_KEPT_HISTORIES = 10_000
_CONTINUED = (RequestStatus.COMPLETED, RequestStatus.INCOMPLETE)  # the API keeps an incomplete response's items

Key = tuple[str, int]  # (conversation id, epoch)
# (conversation id, epoch, line number) -> the stored line before it in the conversation, or None
StoredTurns = Callable[[str, int, int], ConversationTurn | None]


@dataclass(frozen=True)
class History:
    """What a conversation's next line continues: the items so far, or why it cannot continue."""

    items: list[dict]
    broken: str | None = None
    call_headers: dict[str, str] = field(default_factory=dict)  # of the calls among the items, as written


def conversation_id(line: InputLine) -> str | None:
    """The conversation a line names, read from its body so that an invalid line breaks its conversation too."""
    if line.request is not None:
        return line.request.conversation_id
    value = line.body.get("conversation") if isinstance(line.body, dict) else None
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and value else None


def history_of(line_no: int, status: RequestStatus | None, response: dict | None,
               input_items: list[dict] | None, conversation: str,
               call_headers: dict[str, str] | None = None) -> History:
    """The history a line's result leaves its conversation: its input and output items, if it has them (and
    the headers of the calls among them as the model wrote them: batch/harmony/call_header.py)."""
    if status in _CONTINUED and response is not None:
        return History(list(input_items or []) + list(response.get("output") or []),
                       call_headers=dict(call_headers or {}))
    ended = status.value if status is not None else "without a result"
    return History([], f"conversation {conversation!r}: line {line_no} before it in the conversation ended "
                       f"{ended}, so there is nothing to continue")


class Conversations:
    """The run's conversations: the line out for each, the lines waiting behind it, the histories so far."""

    def __init__(self, stored_turn: StoredTurns, resumed: bool):
        self._stored_turn = stored_turn
        self._look_up = resumed  # a resumed run's conversations may have lines stored by an earlier attempt
        self._out: dict[Key, InputLine] = {}  # each busy conversation's line now out
        self._out_by_line: dict[tuple[int, int], Key] = {}  # (line_no, epoch) of a line out -> its key
        self._waiting: dict[Key, deque[InputLine]] = {}
        self._released: deque[InputLine] = deque()  # lines whose turn came, to be read before the next new line
        self._histories: OrderedDict[Key, History] = OrderedDict()
        # conversation -> the number (Run.num_finished) of the result of its last line that ended in this attempt
        self._last_ended: dict[Key, int] = {}

    @property
    def num_waiting(self) -> int:
        """Lines held back, waiting or released but not yet read."""
        return sum(len(lines) for lines in self._waiting.values()) + len(self._released)

    def take_released(self) -> InputLine | None:
        """A line whose turn came, or None."""
        return self._released.popleft() if self._released else None

    def admit(self, line: InputLine, key: Key) -> bool:
        """True when the line may go out now; else it waits behind its conversation's line out."""
        out = self._out.get(key)
        if out is line:  # released to it
            return True
        if out is not None:
            self._waiting.setdefault(key, deque()).append(line)
            return False
        self._out[key] = line
        self._out_by_line[(line.line_no, line.epoch)] = key
        return True

    def history(self, line: InputLine, key: Key, written_through: Callable[[int], None]) -> History:
        """What the line continues: the history its conversation's last line left, from memory or the store
        (`written_through(n)` returns once the attempt's first n results are written, for a history this
        attempt wrote and no longer keeps)."""
        kept = self._histories.get(key)
        if kept is not None:
            return kept
        if key in self._last_ended:
            written_through(self._last_ended[key])
        elif not self._look_up:
            return History([])  # a new run: nothing before this line
        turn = self._stored_turn(key[0], key[1], line.line_no)
        if turn is None:
            return History([])
        return history_of(turn.line_no, turn.status, turn.response, turn.input_items, key[0], turn.call_headers)

    def last_ended(self, key: Key) -> int:
        """The number of the result of the conversation's last line that ended in this attempt (0: none)."""
        return self._last_ended.get(key, 0)

    def ended(self, result: RequestResult, number: int) -> None:
        """A line's result, the attempt's `number`-th: its conversation's history moves on, and the next line
        waiting (if any) is released."""
        row = result.request
        key = self._out_by_line.pop((row.line_no, row.epoch), None)
        if key is None:
            return
        response = result.response
        self._last_ended[key] = number
        self._keep(key, history_of(row.line_no, row.status, None if response is None else response.response,
                                   None if response is None else response.input_items, key[0],
                                   None if response is None else response.call_headers))
        waiting = self._waiting.get(key)
        if not waiting:
            self._waiting.pop(key, None)
            del self._out[key]
            return
        following = waiting.popleft()
        self._out[key] = following
        self._out_by_line[(following.line_no, following.epoch)] = key
        self._released.append(following)

    def _keep(self, key: Key, history: History) -> None:
        self._histories[key] = history
        self._histories.move_to_end(key)
        while len(self._histories) > MAX_KEPT_HISTORIES:
            self._histories.popitem(last=False)
