"""A server's sampling request decoded by the decode loop (batch/run/sampling.py): the answer text,
its stop reason, and the seam between the tools thread's request and the engine's sequence."""

from pathlib import Path

import pytest

from batch.harmony.vocab import harmony_encoding
from batch.harmony.render import PromptOptions
from batch.run.decode_loop import DecodeLoop
from batch.run.options import RunOptions
from batch.run.sampling import SampledTurn, answer_text
from batch.run.session import SessionOptions
from engine.api import RequestOutput
from tests.support.fakes import ScriptedBackend
from tools.sampling_inbox import SamplingInbox, SamplingRequest
from tools.servers import ServerCatalog

SHIPPED_MODEL = Path(__file__).resolve().parents[3] / "data" / "models" / "batchrun-tiny"


def tokens(text: str) -> list[int]:
    return harmony_encoding().encode(text, allowed_special="all")


def test_the_answer_is_the_final_message_and_else_the_text_it_wrote():
    assert answer_text(tokens("<|channel|>analysis<|message|>hm<|end|>"
                              "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>")) == "Paris."
    assert answer_text(tokens("<|channel|>analysis<|message|>thinking")) == "thinking"  # cut by maxTokens
    assert answer_text(tokens("no harmony at all<|return|>")) == "no harmony at all"


def test_without_a_final_message_the_answer_is_the_last_message_written():
    # a channel written twice must not keep its first place: the last message is the one cut off
    assert answer_text(tokens("<|channel|>analysis<|message|>first<|end|>"
                              "<|start|>assistant<|channel|>commentary<|message|>note<|end|>"
                              "<|start|>assistant<|channel|>analysis<|message|>last")) == "last"


def finished_turn(request: SamplingRequest, text: str, finish: str) -> SampledTurn:
    turn = SampledTurn(request, "r/sampling/0", PromptOptions())
    turn.on_output(RequestOutput(request_id="r/sampling/0", new_token_ids=tokens(text), finish_reason=finish,
                                 num_prompt_tokens=len(turn.prompt_token_ids), num_cached_tokens=0,
                                 prefill_s=0.0, decode_s=0.0))
    return turn


def test_stop_reasons_and_stop_sequences():
    request = SamplingRequest("s", None, (("user", "hi"),), max_tokens=9, stop_sequences=("STOP",))
    answer = finished_turn(request, "<|channel|>final<|message|>one STOP two<|return|>", "stop").answer("m")
    assert (answer.text, answer.stop_reason, answer.model) == ("one ", "stopSequence", "m")
    assert finished_turn(request, "<|channel|>final<|message|>one", "length").answer("m").stop_reason == "maxTokens"
    assert finished_turn(request, "<|channel|>final<|message|>one<|return|>", "stop").answer("m").stop_reason == \
        "endTurn"


def test_the_inbox_rings_while_requests_wait():
    inbox = SamplingInbox()
    assert not inbox.doorbell.done()
    request = SamplingRequest("s", None, (("user", "hi"),), max_tokens=3)
    inbox.put(request)
    assert inbox.doorbell.done() and inbox.take() == [request]
    assert not inbox.doorbell.done() and inbox.take() == []


def loop_with(backend) -> DecodeLoop:
    options = RunOptions(input_path=Path("unused.jsonl"), session=SessionOptions(model="the-model", seed=5))
    return DecodeLoop(backend, options, ServerCatalog())


def test_a_request_nobody_waits_for_any_more_stops_decoding():
    backend = ScriptedBackend(lambda prompt, turn: "<|channel|>final<|message|>" + "word " * 50 + "<|return|>",
                              tokens_per_step=1)
    loop = loop_with(backend)
    try:
        request = SamplingRequest("s", None, (("user", "hi"),), max_tokens=100)
        loop.inbox.put(request)
        loop.step(block=False)
        assert list(loop.sampled) == ["/sampling/0"] and backend.running
        request.answer.cancel()  # the tool call that asked timed out
        while loop.is_busy:
            loop.step(block=False)
        assert backend.aborted == ["/sampling/0"] and request.answer.cancelled()
    finally:
        loop.close()


@pytest.mark.slow
@pytest.mark.skipif(not (SHIPPED_MODEL / "config.json").exists(), reason="the shipped model is not in this checkout")
def test_the_real_engine_decodes_a_sampling_request_within_its_max_tokens():
    from engine.factory import load_backend

    loop = loop_with(load_backend("engine", SHIPPED_MODEL))
    try:
        request = SamplingRequest("s", None, (("user", "Say hi."),), max_tokens=6, system_prompt="Be brief.",
                                  temperature=0.0)
        loop.inbox.put(request)
        while not request.answer.done():
            loop.step(block=False)
        answer = request.answer.result()
        assert answer.error is None and answer.model == "the-model"
        assert 1 <= loop.decoded_tokens <= 6  # the only sequence the engine ran
        assert answer.stop_reason == ("maxTokens" if loop.decoded_tokens == 6 else "endTurn")
        assert not loop.is_busy
    finally:
        loop.close()


@pytest.mark.parametrize("temperature", [float("inf"), float("nan"), -0.5])
def test_a_temperature_that_is_not_a_finite_number_is_answered_with_an_error(temperature):
    # NaN passed as greedy (max(0.0, nan) is 0.0) and infinity sampled every token uniformly; a
    # negative one is taken as greedy, as the MCP spec leaves its meaning to the client
    backend = ScriptedBackend(lambda prompt, turn: "<|channel|>final<|message|>ok<|return|>")
    loop = loop_with(backend)
    try:
        request = SamplingRequest("s", None, (("user", "hi"),), max_tokens=9, temperature=temperature)
        loop.inbox.put(request)
        loop.step(block=False)
        while loop.is_busy:
            loop.step(block=False)
        answer = request.answer.result(timeout=5)
        if temperature < 0:
            assert (answer.error, answer.text) == (None, "ok")
        else:
            assert answer.error is not None and "temperature" in answer.error
    finally:
        loop.close()
