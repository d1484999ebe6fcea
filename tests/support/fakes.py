"""A scripted decoding backend: each turn's completion is harmony text a test chooses.

`ScriptedBackend(script)` implements `engine.api.Backend`. For every request it
calls `script(prompt_text, turn)` (the decoded prompt; the turn from the engine
request id `<response_id>/<turn>`) and streams that text's tokens a few per step.
A request finishes "stop" on one of its stop tokens, "length" at `max_tokens`, at
`max_model_len` or when its script runs out; an aborted request reports "abort" at
the next step, as the protocol says. Every call is recorded for assertions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from batch.harmony.vocab import harmony_encoding
from engine.api import RequestOutput, SamplingParams


@dataclass
class AddedRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams


@dataclass
class _Running:
    added: AddedRequest
    script_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    is_aborted: bool = False


class ScriptedBackend:
    """A Backend whose completions come from `script(prompt_text, turn) -> harmony text`.

    A request's TokenConstraint is told every scripted token, as the engine tells it
    the sampled ones, but nothing is masked: a script that breaks the grammar shows
    how a session handles a broken constraint. `tells_constraints=False` plays a
    backend without constraint support, to reach what a grammar would prevent.
    """

    model_name = "scripted"

    def __init__(self, script: Callable[[str, int], str], *, max_model_len: int = 8192,
                 tokens_per_step: int = 3, on_step: Callable[[ScriptedBackend], None] | None = None,
                 tells_constraints: bool = True):
        self.script = script
        self.tells_constraints = tells_constraints  # False: a backend that ignores TokenConstraints
        self.max_model_len = max_model_len
        self.tokens_per_step = tokens_per_step
        self.on_step = on_step  # called at the start of every step (may raise to simulate a crash)
        self.added: list[AddedRequest] = []
        self.aborted: list[str] = []
        self.num_steps = 0
        self.max_num_running = 0
        self.running: dict[str, _Running] = {}

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams) -> None:
        if request_id in self.running:
            raise ValueError(f"request id {request_id!r} is in use")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt_token_ids)} tokens leaves no room in "
                             f"max_model_len {self.max_model_len}")
        added = AddedRequest(request_id, list(prompt_token_ids), sampling)
        self.added.append(added)
        encoding = harmony_encoding()
        text = self.script(encoding.decode_utf8(prompt_token_ids), turn_of(request_id))
        self.running[request_id] = _Running(added, encoding.encode(text, allowed_special="all"))
        self.max_num_running = max(self.max_num_running, len(self.running))

    def step(self) -> list[RequestOutput]:
        self.num_steps += 1
        if self.on_step is not None:
            self.on_step(self)
        outputs = [self._advance(request) for request in list(self.running.values())]
        for out in outputs:
            if out.finish_reason is not None:
                del self.running[out.request_id]
        return outputs

    def _advance(self, request: _Running) -> RequestOutput:
        if request.is_aborted:
            return self._output(request, [], "abort")
        new_ids, finish = [], None
        for _ in range(self.tokens_per_step):
            token_id = request.script_ids[len(request.output_ids)]
            request.output_ids.append(token_id)
            if self.tells_constraints and request.added.sampling.constraint is not None:  # no masking here
                request.added.sampling.constraint.accept(token_id)
            new_ids.append(token_id)
            finish = self._finish_reason(request, token_id)
            if finish is not None:
                break
        return self._output(request, new_ids, finish)

    def _finish_reason(self, request: _Running, token_id: int) -> str | None:
        sampling = request.added.sampling
        if token_id in sampling.stop_token_ids and not sampling.ignore_eos:
            return "stop"
        num_tokens = len(request.added.prompt_token_ids) + len(request.output_ids)
        if (len(request.output_ids) >= sampling.max_tokens or num_tokens >= self.max_model_len
                or len(request.output_ids) == len(request.script_ids)):
            return "length"
        return None

    def _output(self, request: _Running, new_ids: list[int], finish: str | None) -> RequestOutput:
        return RequestOutput(request_id=request.added.request_id, new_token_ids=new_ids,
                             finish_reason=finish,
                             num_prompt_tokens=len(request.added.prompt_token_ids),
                             num_cached_tokens=0, prefill_s=0.001, decode_s=0.002)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        if request_id in self.running:
            self.running[request_id].is_aborted = True

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def describe(self) -> dict:
        return {"backend": "scripted", "max_model_len": self.max_model_len}

    def completion_ids(self, request_id: str) -> list[int]:
        """The tokens the script gives `request_id` (all of them, however many were sent)."""
        added = next(a for a in self.added if a.request_id == request_id)
        text = self.script(harmony_encoding().decode_utf8(added.prompt_token_ids), turn_of(request_id))
        return harmony_encoding().encode(text, allowed_special="all")


def turn_of(request_id: str) -> int:
    return int(request_id.rsplit("/", 1)[1])


def use_scripted_backend(monkeypatch, script: Callable[[str, int], str], **kwargs) -> list[ScriptedBackend]:
    """`batchrun submit` decodes with a ScriptedBackend(script, **kwargs) (any --model directory will do);
    returns the backends it loads, in order."""
    import engine.factory
    import engine.model_dir

    backends: list[ScriptedBackend] = []

    def load(*_args, **_kwargs) -> ScriptedBackend:
        backends.append(ScriptedBackend(script, **kwargs))
        return backends[-1]

    for module in (engine.factory, engine.model_dir):
        monkeypatch.setattr(module, "check_model_dir", lambda _: {"hidden_size": 4096})
    monkeypatch.setattr(engine.factory, "load_backend", load)
    return backends
