"""An MCP server's sampling request, decoded by the run's engine as a sequence of its own.

The decode loop takes each `SamplingRequest` (tools/sampling.py) from its inbox and makes
it a `SampledTurn`: the request rendered through harmony (batch/harmony/render.py), sent to
the engine beside the responses' turns, limited to the request's `maxTokens`. When it
finishes, the answer goes back to the server and the turn is recorded with the response
whose tool call the server was running: a `turns` row of kind `sampling`, counted in that
response's usage. The engine sees token ids, like any turn.
"""

from __future__ import annotations

from openai_harmony import HarmonyError, Message, Role

from batch.harmony.render import PromptOptions, render_sampling
from batch.harmony.token_parser import FIRST_SPECIAL_TOKEN, STOP_TOKEN_IDS
from batch.harmony.vocab import harmony_encoding
from batch.responses.metrics import TurnMetrics
from engine.api import FinishReason, RequestOutput, SamplingParams
from tools.sampling_inbox import SamplingAnswer, SamplingRequest

SAMPLING_SEED_STRIDE = 104_729  # a sampling turn's seed: its response's seed plus a multiple of this


class SampledTurn:
    """One sampling request while the engine decodes it."""

    def __init__(self, request: SamplingRequest, engine_request_id: str, prompt: PromptOptions):
        self.request, self.engine_request_id = request, engine_request_id
        self.prompt_token_ids = render_sampling(request.system_prompt, list(request.messages), prompt)
        self.metrics = TurnMetrics(turn=-1, prompt_tokens=len(self.prompt_token_ids), kind="sampling")
        self.completion: list[int] = []

    def sampling(self, temperature: float, top_p: float, seed: int) -> SamplingParams:
        """The request's own `temperature` if it gave one (else the response's), `maxTokens`, harmony's stops."""
        if self.request.temperature is not None:  # a negative one is greedy; NaN stays, for SamplingParams to refuse
            temperature = 0.0 if self.request.temperature < 0 else self.request.temperature
        return SamplingParams(max_tokens=max(1, self.request.max_tokens), temperature=temperature, top_p=top_p,
                              seed=seed, stop_token_ids=STOP_TOKEN_IDS)

    def on_output(self, out: RequestOutput) -> None:
        self.completion.extend(out.new_token_ids)
        self.metrics.count(out)

    def answer(self, model: str) -> SamplingAnswer:
        """The model's final answer; cut at the first of the request's stop sequences, if one is in it."""
        text = answer_text(self.completion)
        stop_reason = "maxTokens" if self.metrics.finish_reason == FinishReason.LENGTH else "endTurn"
        cuts = [text.index(stop) for stop in self.request.stop_sequences if stop and stop in text]
        if cuts:
            text, stop_reason = text[:min(cuts)], "stopSequence"
        return SamplingAnswer(text=text, stop_reason=stop_reason, model=model)


def answer_text(completion: list[int]) -> str:
    """The text of the completion's final-channel messages (else of its last message); a completion that
    is not harmony (a model that ignored the format) is its text less the special tokens."""
    try:
        messages = harmony_encoding().parse_messages_from_completion_tokens(completion, Role.ASSISTANT,
                                                                            strict=False)
    except HarmonyError:
        messages = []
    finals = [_text(message) for message in messages if message.channel == "final"]
    if finals:
        return "".join(finals)
    if messages:
        return _text(messages[-1])
    return harmony_encoding().decode_utf8([t for t in completion if t < FIRST_SPECIAL_TOKEN])


def _text(message: Message) -> str:
    return "".join(part.text for part in message.content if hasattr(part, "text"))
