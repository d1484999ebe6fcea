"""The one writer of stored JSON text: standard JSON, or an error saying where a NaN/Infinity is."""

import json

import pytest

from batch.responses.standard_json import NonFiniteError, finite_or_none, json_text


def test_json_text_is_what_compact_json_dumps_writes():
    value = {"a": [1, 2.5, None, True], "text": "héllo \u2028 \"q\"", "nested": {"x": -0.0, "big": 10 ** 30}}
    assert json_text(value) == json.dumps(value, separators=(",", ":"))
    assert json_text("plain") == '"plain"'


@pytest.mark.parametrize("number, shown", [(float("nan"), "NaN"), (float("inf"), "Infinity"),
                                           (float("-inf"), "-Infinity")])
def test_json_text_refuses_a_non_finite_number_naming_where_it_is(number, shown):
    value = {"output": [{"content": [{"logprobs": [{"logprob": -0.5}, {"logprob": number}]}]}]}
    with pytest.raises(NonFiniteError) as caught:
        json_text(value)
    assert str(caught.value) == f"output[0].content[0].logprobs[1].logprob: {shown} is not a JSON number"
    assert str(caught.value.within("responses.response")).startswith("responses.response.output[0].")
    with pytest.raises(NonFiniteError, match=r"^value: NaN is not"):
        json_text(float("nan"))


def test_json_text_still_refuses_a_circular_value():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        json_text(loop)


def test_finite_or_none_makes_an_undefined_number_null():
    assert [finite_or_none(x) for x in (1.5, None, float("nan"), float("-inf"))] == [1.5, None, None, None]
