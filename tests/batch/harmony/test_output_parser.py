"""Completion tokens -> items and events (OutputParser), here with the tokens' logprobs."""

from batch.harmony.output_parser import OutputParser, logprob_entry
from batch.harmony.vocab import harmony_encoding
from batch.responses.events import ItemKind
from engine.api import TokenLogprob
from tools.registry import ToolRegistry


def test_only_the_final_messages_text_tokens_get_logprob_entries_each_with_its_bytes():
    enc = harmony_encoding()
    tokens = enc.encode("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>"
                        "Caf\u00e9 \U0001F9EC!<|return|>", allowed_special="all")
    final_text = enc.encode("Caf\u00e9 \U0001F9EC!", allowed_special="all")
    logprobs = [TokenLogprob(-float(index), ((token_id, -0.5),)) for index, token_id in enumerate(tokens)]
    parser = OutputParser("resp_1", ToolRegistry.from_tools([]))
    parser.begin_turn(0)
    parser.events.start({"id": "resp_1", "object": "response", "status": "in_progress", "output": []})
    assert parser.feed(tokens[:7], logprobs[:7]) is None and parser.feed(tokens[7:], logprobs[7:]) is None
    reasoning, message = parser.events.output
    assert reasoning["type"] == ItemKind.REASONING.value and "logprobs" not in reasoning["content"][0]
    entries = message["content"][0]["logprobs"]
    start = len(tokens) - 1 - len(final_text)  # the message's text tokens: after its header, before <|return|>
    assert entries == [logprob_entry(token_id, logprob)
                       for token_id, logprob in zip(tokens[start:-1], logprobs[start:-1])]
    assert bytes(b for e in entries for b in e["bytes"]).decode() == message["content"][0]["text"] \
        == "Caf\u00e9 \U0001F9EC!"
    assert entries[0]["top_logprobs"] == [{"token": enc.decode([tokens[start]]),
                                           "bytes": list(enc.decode([tokens[start]]).encode()), "logprob": -0.5}]
    deltas = [e for e in parser.events.events if e["type"] == "response.output_text.delta"]
    assert [entry for delta in deltas for entry in delta["logprobs"]] == entries
    # " \xf0\x9f", "\xa7", "\xac": the space's delta has its token's entry; the emoji's the two tokens' after it
    assert [(d["delta"], len(d["logprobs"])) for d in deltas][-3:] == [(" ", 1), ("\U0001F9EC", 2), ("!", 1)]


def test_without_logprobs_the_parts_list_none():
    enc = harmony_encoding()
    tokens = enc.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all")
    parser = OutputParser("resp_1", ToolRegistry.from_tools([]))
    parser.begin_turn(0)
    parser.events.start({"id": "resp_1", "object": "response", "status": "in_progress", "output": []})
    assert parser.feed(tokens) is None
    assert parser.events.output[0]["content"][0]["logprobs"] == []


def test_each_calls_header_as_written_is_kept_by_its_items_id_and_no_other_messages():
    enc = harmony_encoding()
    tokens = enc.encode("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>commentary "
                        "to=functions.f <|constrain|>json<|message|>{}<|end|><|start|>assistant to=nowhere.tool"
                        "<|message|>{}<|call|>", allowed_special="all")
    parser = OutputParser("resp_1", ToolRegistry.from_tools([{"type": "function", "name": "f"}]))
    parser.begin_turn(0)
    parser.events.start({"id": "resp_1", "object": "response", "status": "in_progress", "output": []})
    assert parser.feed(tokens) is None
    reasoning, function_call, attempt = parser.events.output
    assert (function_call["type"], attempt["type"]) == ("function_call", "reasoning")
    assert parser.call_headers == {function_call["id"]: "<|channel|>commentary to=functions.f <|constrain|>json",
                                   attempt["id"]: " to=nowhere.tool"}  # a call no tool serves too
