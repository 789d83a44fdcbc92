"""Property tests: decoding and validation never raise, and always answer with a text or a 4xx."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.decoding import decode_payload, payload_of
from handlers.rejection import Rejection
from handlers.validation import decode_and_validate

LIMIT = 4096

content_types = st.one_of(
    st.none(),
    st.sampled_from(["application/json", "text/plain", "application/json; charset=utf-8", "", "APPLICATION/JSON"]),
    st.text(max_size=40),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
json_documents = st.one_of(
    json_values,
    st.fixed_dictionaries({"text": json_values}),
    st.fixed_dictionaries({"text": st.text()}, optional={"extra": json_values}),
)
payload_values = st.one_of(
    st.binary(max_size=LIMIT + 64),
    st.text(max_size=LIMIT + 64),
    json_values,
    json_documents.map(lambda d: json.dumps(d).encode("utf-8", "surrogatepass")),
)


def assert_well_formed(outcome: object) -> None:
    if isinstance(outcome, Rejection):
        assert 400 <= outcome.status < 500
        assert outcome.type and outcome.message
        json.dumps(outcome.body())  # the body must serialise
    else:
        assert isinstance(outcome, str)
        assert outcome.strip(), "an accepted text is never empty or whitespace-only"
        outcome.encode("utf-8")  # and the tokenizer can take it


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(value=payload_values, content_type=content_types)
def test_decode_and_validate_never_raises(value, content_type):
    assert_well_formed(decode_and_validate(value, content_type, LIMIT))


@FUZZ
@given(raw=st.binary(max_size=2 * LIMIT), content_type=content_types)
def test_arbitrary_bytes(raw, content_type):
    outcome = decode_and_validate(raw, content_type, LIMIT)
    assert_well_formed(outcome)
    if len(raw) > LIMIT:
        assert isinstance(outcome, Rejection) and outcome.status == 413


@FUZZ
@given(text=st.text(max_size=LIMIT // 4))
def test_any_unicode_text_round_trips_as_plain_text(text):
    outcome = decode_and_validate(text.encode("utf-8"), "text/plain", LIMIT)
    if text.strip():
        assert outcome == text
    else:
        assert isinstance(outcome, Rejection) and outcome.type == "EmptyText"


@FUZZ
@given(document=json_documents)
def test_arbitrary_json_documents(document):
    body = json.dumps(document).encode("utf-8", "surrogatepass")
    outcome = decode_payload(body, "application/json", 10 * LIMIT)
    assert_well_formed(decode_and_validate(body, "application/json", 10 * LIMIT))
    if isinstance(document, dict) and isinstance(document.get("text"), str) and not isinstance(outcome, Rejection):
        assert outcome == document["text"]


@FUZZ
@given(item=st.one_of(st.none(), json_values, st.dictionaries(st.text(max_size=6), payload_values, max_size=3)))
def test_payload_of_any_item(item):
    name, value = payload_of(item)
    assert name in (None, "body", "data")
    assert_well_formed(decode_and_validate(value, "text/plain", LIMIT))
