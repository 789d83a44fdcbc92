"""Property tests: decoding and validation never raise, answer with a text (or a pair) or a 4xx, and never lose a text.

Every way a text can arrive is fuzzed: raw bodies with any Content-Type and charset, JSON
documents, urlencoded and multipart forms and gRPC input maps as TorchServe's worker hands them over.
"""

from __future__ import annotations

import codecs
import contextlib
import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from handlers import rejection
from handlers.decoding import ROUTE_UNKNOWN, decode_request, payload_of, route_of
from handlers.instances import TextPair
from handlers.rejection import Rejection
from tests.request_shapes import MULTIPART, URLENCODED, form, grpc, raw_body
from tests.support import decode_and_validate, plain_outcome

LIMIT = 4096
BOM = "\ufeff"

content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "text/plain",
            "application/json; charset=utf-8",
            "",
            "APPLICATION/JSON",
            "text/plain; charset=utf-16",
            "text/plain; charset=latin-1",
            "text/plain; charset=klingon",
            "text/plain; charset=base64",
            'application/json; charset="UTF-8"',
        ]
    ),
    st.text(max_size=40),
    st.text(max_size=20).map(lambda charset: f"text/plain; charset={charset}"),
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
    st.fixed_dictionaries({"text": st.text(), "text_pair": st.one_of(st.text(), json_values)}),
)
payload_values = st.one_of(
    st.binary(max_size=LIMIT + 64),
    st.text(max_size=LIMIT + 64),
    json_values,
    json_documents.map(lambda d: json.dumps(d).encode("utf-8", "surrogatepass")),
)


def servable(text: str) -> bool:
    """What validation accepts: not blank, and encodable (no unpaired surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(text.strip())


def assert_well_formed(outcome: object) -> None:
    if isinstance(outcome, Rejection):
        assert 400 <= outcome.status < 500
        assert outcome.type and outcome.message
        json.dumps(outcome.body())  # the body must serialise
        return
    for text in (outcome.text, outcome.text_pair) if isinstance(outcome, TextPair) else (outcome,):
        assert isinstance(text, str)
        assert text.strip(), "an accepted text is never empty or whitespace-only"
        text.encode("utf-8")  # and the tokenizer can take it


def expected_outcome(text: str, pair: object, has_pair: bool) -> object:
    """What a servable `text` comes to beside a `text_pair` field (`has_pair`) holding `pair` (None: not a text):
    the text, the pair, or None where the pair must be refused."""
    if not has_pair:
        return text
    return TextPair(text, pair) if isinstance(pair, str) and servable(pair) else None


def validated(decoded: object) -> object:
    """What the handler makes of decode_request's outcome."""
    return plain_outcome(decoded)


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- raw bodies and JSON --------------------------------------------------------------------------


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
@given(text=st.text(max_size=LIMIT // 4), bom=st.booleans())
def test_any_unicode_text_round_trips_as_plain_text(text, bom):
    raw = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8", "surrogatepass")
    outcome = decode_and_validate(raw, "text/plain", LIMIT)
    expected = text if bom else text.removeprefix(BOM)  # one leading byte-order mark is never text
    if servable(expected):
        assert outcome == expected
    else:
        assert isinstance(outcome, Rejection) and outcome.type in ("EmptyText", "InvalidUTF8")


@FUZZ
@given(
    document=json_documents,
    ensure_ascii=st.booleans(),
    bom=st.booleans(),
    content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "Application/JSON"]),
)
def test_arbitrary_json_documents(document, ensure_ascii, bom, content_type):
    body = json.dumps(document, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
    body = (b"\xef\xbb\xbf" if bom else b"") + body
    limit = 10 * LIMIT
    outcome = decode_and_validate(body, content_type, limit)
    assert_well_formed(outcome)
    text = document.get("text") if isinstance(document, dict) else None
    if isinstance(text, str) and servable(text) and len(body) <= limit:
        # Every object with a servable string `text` is accepted, and decoded to exactly that text, or to the pair
        # with a servable string `text_pair`; any other `text_pair` is refused.
        expected = expected_outcome(text, document.get("text_pair"), "text_pair" in document)
        assert outcome == expected if expected is not None else isinstance(outcome, Rejection)
    else:
        assert isinstance(outcome, Rejection)


@FUZZ
@given(item=st.one_of(st.none(), json_values, st.dictionaries(st.text(max_size=6), payload_values, max_size=3)))
def test_payload_of_any_item(item):
    name, value = payload_of(item, None, ROUTE_UNKNOWN)
    assert name in (None, "body", "text", "data")
    assert_well_formed(decode_and_validate(value, "text/plain", LIMIT))


# ---- charsets -------------------------------------------------------------------------------------

CHARSETS = [
    "utf-8", "UTF-8", "utf8", "utf-16", "utf-16le", "UTF-16BE", "utf-32", "iso-8859-1", "latin1",
    "windows-1252", "cp1251", "koi8-r", "shift_jis", "euc-jp", "gb18030", "big5", "us-ascii", "utf-7",
]  # fmt: skip


@FUZZ
@given(text=st.text(max_size=LIMIT // 8), charset=st.sampled_from(CHARSETS), quoted=st.booleans())
def test_text_in_any_declared_charset_round_trips(text, charset, quoted):
    try:
        raw = text.encode(charset)
    except UnicodeEncodeError:
        assume(False)
    # Some codecs map two characters to one byte sequence (shift_jis: "¥" and "\\" are both 0x5c): only
    # text the codec itself gives back can come back from the service.
    assume(raw.decode(charset) == text and len(raw) <= LIMIT)
    content_type = f'text/plain; charset="{charset}"' if quoted else f"text/plain; charset={charset}"
    outcome = decode_and_validate(raw, content_type, LIMIT)
    expected = text.removeprefix(BOM)
    if servable(expected):
        assert outcome == expected
    else:
        assert isinstance(outcome, Rejection)


@FUZZ
@given(raw=st.binary(max_size=256), charset=st.one_of(st.sampled_from(CHARSETS), st.text(max_size=30)))
def test_any_charset_value_is_decoded_or_refused_cleanly(raw, charset):
    outcome = decode_and_validate(raw, f"text/plain; charset={charset}", LIMIT)
    assert_well_formed(outcome)
    if isinstance(outcome, Rejection) and outcome.status == 415:
        # Only a charset outside the well-known ones is refused.
        assert outcome.type == "UnsupportedCharset"
        with contextlib.suppress(LookupError, ValueError):
            assert codecs.lookup(charset.strip()).name not in {codecs.lookup(c).name for c in CHARSETS}


# ---- forms and gRPC, as TorchServe's worker hands them over ---------------------------------------

field_names = st.one_of(
    st.sampled_from(["text", "data", "lang", "id", "file", "body", "text_pair"]), st.text(min_size=1, max_size=12)
)
field_values = st.one_of(
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=200)
)
form_fields = st.dictionaries(field_names, field_values, max_size=5)
form_types = st.sampled_from([URLENCODED, MULTIPART, URLENCODED + "; charset=utf-8", "Multipart/Form-Data; boundary=x"])


@FUZZ
@given(fields=form_fields, content_type=form_types, content_length=st.one_of(st.none(), st.integers(0, 10_000)))
def test_forms(fields, content_type, content_length):
    item, headers = form(fields, content_type, content_length=content_length)
    decoded = decode_request(item, headers, LIMIT, route=route_of(headers))
    outcome = validated(decoded)
    assert_well_formed(outcome)
    chosen_name = next((name for name in ("text", "data") if name in fields), None)  # a field named body: ignored
    chosen = fields.get(chosen_name)
    if chosen is None:
        # No field carries the text: say so (never echoing a field), unless nothing at all was sent.
        media_type = content_type.split(";")[0].strip().lower()
        if not fields and headers["Content-Length"] == "0":
            assert outcome == rejection.empty_text()
        else:
            assert outcome == rejection.form_without_text(media_type, len(fields))
        return
    try:
        text = chosen.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError:
        assert outcome.type == "InvalidUTF8"
        return
    if not servable(text):
        assert isinstance(outcome, Rejection)
        return
    has_pair = "text_pair" in fields
    try:
        pair = fields["text_pair"].decode("utf-8").removeprefix(BOM) if has_pair else None
    except UnicodeDecodeError:
        pair = None
    expected = expected_outcome(text, pair, has_pair)
    if expected is None:
        assert isinstance(outcome, Rejection) and "text_pair" in outcome.message
    else:
        assert outcome == expected, "a servable text in the chosen field is the text (with its pair)"


@FUZZ
@given(
    text=st.text(min_size=1, max_size=300),
    others=form_fields,
    content_type=form_types,
    name=st.sampled_from(["text", "data"]),
)
def test_a_servable_text_field_is_never_lost(text, others, content_type, name):
    assume(servable(text.removeprefix(BOM)))
    fields = {k: v for k, v in others.items() if k not in ("text", "text_pair")}
    fields[name] = text.encode("utf-8", "surrogatepass")
    item, headers = form(fields, content_type)
    outcome = validated(decode_request(item, headers, LIMIT, route=route_of(headers)))
    assert outcome == text.removeprefix(BOM)


@FUZZ
@given(inputs=st.dictionaries(field_names, field_values, max_size=4))
def test_grpc_input_maps(inputs):
    item, headers = grpc(inputs)
    outcome = validated(decode_request(item, headers, LIMIT, route=route_of(headers)))
    assert_well_formed(outcome)
    if not any(name in inputs for name in ("body", "text", "data")):
        assert outcome == (rejection.missing_input(len(inputs)) if inputs else rejection.empty_text())


@FUZZ
@given(
    value=payload_values,
    content_type=content_types,
    header_case=st.sampled_from(["Content-Type", "content-type", "CONTENT-TYPE"]),
)
def test_raw_bodies_with_request_headers(value, content_type, header_case):
    assume(isinstance(value, (bytes, str)))
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    item, headers = raw_body(raw, content_type, header_case)
    outcome = validated(decode_request(item, headers, LIMIT, route=route_of(headers)))
    assert_well_formed(outcome)
    # The request header is read in any case: the outcome is that of the payload and its whole Content-Type.
    assert outcome == decode_and_validate(raw, content_type, LIMIT)


# ---- KServe documents: any shape of v1 instances and v2 inputs ----------------------------------

# Mostly well-formed tensors (BYTES, a shape that fits), so that the checks past the first ones are reached too.
v2_tensors = st.one_of(
    st.lists(st.text(max_size=8), min_size=1, max_size=3).flatmap(
        lambda data: st.fixed_dictionaries(
            {
                "name": st.one_of(st.sampled_from(["text", "text_pair", "input"]), json_values),
                "datatype": st.one_of(st.just("BYTES"), st.just("BYTES"), json_values),
                "shape": st.one_of(st.just([len(data)]), st.just([len(data), 1]), json_values),
                "data": st.one_of(st.just(data), json_values),
            },
            optional={"parameters": json_values},
        )
    ),
    st.dictionaries(st.sampled_from(["name", "datatype", "shape", "data", "parameters"]), json_values),
)
kserve_documents = st.one_of(
    st.fixed_dictionaries({"inputs": st.one_of(st.lists(st.one_of(v2_tensors, json_values), max_size=3), json_values)},
                          optional={"id": json_values}),
    st.fixed_dictionaries({"instances": st.one_of(st.lists(st.one_of(
        st.text(max_size=8), st.fixed_dictionaries({"text": json_values}, optional={"text_pair": json_values}),
        json_values), max_size=5), json_values)}),
)  # fmt: skip


@FUZZ
@given(document=kserve_documents)
def test_any_kserve_document_is_read_or_refused_never_raised(document):
    from handlers.decoding import Document
    from handlers.protocols import parse_envelope

    request = parse_envelope(Document(document), max_instances=4)
    if request.error is not None:
        assert 400 <= request.error.status < 500 and request.error.message
        return
    assert 1 <= len(request.instances) <= 4
    for instance in request.instances:
        assert isinstance(instance, (str, TextPair, Rejection))
        if isinstance(instance, Rejection):
            assert 400 <= instance.status < 500


@FUZZ
@given(names=st.lists(st.one_of(st.sampled_from(["text", "text_pair"]), json_values), min_size=2, max_size=2),
       data=st.lists(st.text(max_size=8), min_size=1, max_size=3))  # fmt: skip
def test_two_well_formed_v2_inputs_under_any_names_are_a_pair_or_refused(names, data):
    from handlers.decoding import Document
    from handlers.protocols import parse_envelope

    inputs = [{"name": name, "datatype": "BYTES", "shape": [len(data)], "data": data} for name in names]
    request = parse_envelope(Document({"inputs": inputs}), max_instances=4)
    if sorted(map(str, names)) == ["text", "text_pair"] and all(isinstance(name, str) for name in names):
        assert request.error is None and request.instances == tuple(TextPair(t, t) for t in data)
    else:
        assert request.error is not None and request.error.type == "MalformedRequest"
