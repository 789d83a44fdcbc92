"""Request decoding and validation as pure functions: every rejection and the valid edge cases."""

from __future__ import annotations

import json

import pytest

from handlers import rejection
from handlers.decoding import (
    ROUTE_UNKNOWN,
    ContentType,
    Document,
    decode_request,
    payload_of,
    request_header,
    route_of,
    text_codec,
)
from handlers.rejection import Rejection
from handlers.validation import validate_text
from tests.rejection_cases import MAX_BYTES as LIMIT
from tests.rejection_cases import REJECTED_BODIES
from tests.request_shapes import MULTIPART, URLENCODED, form, grpc, raw_body
from tests.support import decode_and_validate, plain_outcome

JSON = "application/json"


def check(value, content_type, limit=LIMIT):
    return decode_and_validate(value, content_type, limit)


@pytest.mark.parametrize(
    ("value", "content_type", "status", "kind"),
    [
        *REJECTED_BODIES,  # the table the in-process and HTTP tests check too
        ("\u3000\u2003", "text/plain", 400, "EmptyText"),  # unicode whitespace only, pre-decoded
        (None, "text/plain", 400, "EmptyText"),  # request without a body
        ("x" * (LIMIT + 1), "text/plain", 413, "PayloadTooLarge"),  # pre-decoded str
    ],
)
def test_rejections(value, content_type, status, kind):
    outcome = check(value, content_type)
    assert isinstance(outcome, Rejection), outcome
    assert (outcome.status, outcome.type) == (status, kind)
    assert outcome.message
    assert outcome.body() == {"code": status, "type": kind, "message": outcome.message}


@pytest.mark.parametrize(
    ("value", "content_type", "expected"),
    [
        (b"Great product", "text/plain", "Great product"),
        (b"Great product", None, "Great product"),  # curl -T sends no content type
        (b"Great product", "application/octet-stream", "Great product"),
        ("Grand hôtel, très propre".encode(), "text/plain; charset=utf-8", "Grand hôtel, très propre"),
        ("素晴らしいホテルでした".encode(), "text/plain", "素晴らしいホテルでした"),
        ("Loved it 😍🎉".encode(), "text/plain", "Loved it 😍🎉"),
        (b"nul\x00inside", "text/plain", "nul\x00inside"),
        (b'{"text": "ok", "lang": "en", "extra": [1, 2]}', JSON, "ok"),
        (b'{"text": "json \\u00e9\\ud83d\\ude00"}', "Application/JSON; charset=utf-8", "json é😀"),
        (b'{"text": "a"}', "text/plain", '{"text": "a"}'),  # not declared JSON: the body is the text
        (b"x" * LIMIT, "text/plain", "x" * LIMIT),  # exactly at the limit
        ("already decoded by TorchServe", "text/plain", "already decoded by TorchServe"),
        ({"text": "pre-parsed JSON"}, JSON, "pre-parsed JSON"),
        (bytearray(b"bytearray body"), "text/plain", "bytearray body"),
    ],
)
def test_valid_payloads(value, content_type, expected):
    assert check(value, content_type) == expected


def test_very_long_text_passes_validation_the_token_cap_is_applied_later():
    text = "word " * 10_000
    assert check(text.encode(), "text/plain") == text


def test_byte_limit_is_checked_before_decoding():
    # Invalid UTF-8 *and* too large: the size answer wins, so no work is spent decoding.
    outcome = check(b"\xff" * 100, "text/plain", limit=10)
    assert isinstance(outcome, Rejection) and outcome.status == 413


def test_pre_parsed_json_that_is_not_an_object():
    outcome = decode_and_validate([1, 2], JSON, LIMIT)
    assert isinstance(outcome, Rejection) and outcome.type == "NotAnObject"


def test_payload_of_reads_the_raw_body_first_and_a_form_or_grpc_by_text_then_data():
    # On /predictions a body that is not a form is the text, whatever parameter might arrive beside it.
    item, headers = raw_body(b"a")
    assert payload_of({**item, "text": b"t", "data": b"d"}, headers, route_of(headers)) == ("body", b"a")
    # In a form, a field (or query parameter) named `body` is a field like any other: `text`, else `data`.
    for content_type in (URLENCODED, MULTIPART):
        item, headers = form({"body": b"a", "text": b"t", "data": b"d"}, content_type)
        assert payload_of(item, headers, route_of(headers)) == ("text", b"t")
        item, headers = form({"body": b"a", "data": b"d"}, content_type)
        assert payload_of(item, headers, route_of(headers)) == ("data", b"d")
        item, headers = form({"body": b"a"}, content_type)
        assert payload_of(item, headers, route_of(headers)) == (None, None)
    # gRPC's input map: `text`, else `data`, else `body` (what TorchServe's own handlers read).
    assert payload_of(*grpc({"body": b"a", "text": b"t", "data": b"d"}), ROUTE_UNKNOWN) == ("text", b"t")
    assert payload_of(*grpc({"body": b"a", "data": b"d"}), ROUTE_UNKNOWN) == ("data", b"d")
    assert payload_of(*grpc({"body": b"a", "other": b"o"}), ROUTE_UNKNOWN) == ("body", b"a")
    assert payload_of({}, None, ROUTE_UNKNOWN) == (None, None)
    assert payload_of("not a dict", None, ROUTE_UNKNOWN) == (None, None)


def test_a_form_field_named_body_neither_beats_the_text_nor_drops_its_pair():
    # curl --data-urlencode "text=a" --data-urlencode "text_pair=b" --data-urlencode "body=hello"
    pair = Document({"text": "a", "text_pair": "b"})
    assert decode(form({"text": b"a", "text_pair": b"b", "body": b"hello"})) == pair
    assert decode(form({"body": b"", "text": b"a", "text_pair": b"b"}, MULTIPART)) == pair
    assert decode(form({"body": b"", "text": REVIEW.encode()}, MULTIPART)) == REVIEW
    assert decode(form({"body": REVIEW.encode()})) == rejection.form_without_text(URLENCODED, 1)
    # Over gRPC a `body` input beside the text is not the text either, and a pair read from it keeps its pair.
    assert decode(grpc({"body": b"hello", "text": b"a", "text_pair": b"b"})) == pair
    assert decode(grpc({"body": b"a", "text_pair": b"b"})) == pair


def test_a_form_on_a_route_that_reads_json_is_told_to_declare_json():
    # curl -d '{"instances": ["Loved it."]}' on a KServe route: TorchServe parsed it as a form, no field arrived.
    sent = (form({}, content_length=30), form({'{"instances": ["a': b'b"]}'}), form({"x": b"y"}, MULTIPART))
    for item, headers in sent:
        outcome = decode_request(item, headers, LIMIT, route=route_of(headers), as_json=True)
        assert (outcome.status, outcome.type) == (400, "FormWithoutText")
        assert "Content-Type: application/json" in outcome.message and "text/plain" not in outcome.message
        assert "instances" not in outcome.message  # never the field names: they may be the text
    # The same body on /predictions keeps the advice that works there.
    assert decode(form({}, content_length=30)) == rejection.form_without_text(URLENCODED, 0)


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        (" APPLICATION/JSON ", True),
        ("text/plain", False),
        ("application/jsonx", False),
        (None, False),
        ("", False),
    ],
)
def test_json_content_type(content_type, expected):
    assert ContentType.parse(content_type).is_json is expected


def test_validate_text_returns_the_text_unchanged():
    assert validate_text("  padded  ") == "  padded  "


def test_rejection_phrase_is_the_http_reason():
    outcome = check(b"", "text/plain")
    assert outcome.phrase == "Bad Request"
    assert Rejection(413, "PayloadTooLarge", "m").phrase == "Request Entity Too Large"


# ---- charsets and byte-order marks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "content_type", "expected"),
    [
        ("Grand hôtel".encode("utf-16"), "text/plain; charset=utf-16", "Grand hôtel"),  # BOM + little-endian
        ("Grand hôtel".encode("utf-16-be"), "text/plain; charset=UTF-16BE", "Grand hôtel"),
        ("café crème".encode("latin-1"), "text/plain; charset=ISO-8859-1", "café crème"),
        ("naïve “quotes”".encode("cp1252"), 'text/plain; charset="windows-1252"', "naïve “quotes”"),
        ("素晴らしい".encode("shift_jis"), "text/plain;charset=Shift_JIS", "素晴らしい"),
        ("素晴らしい".encode("utf-32"), "text/plain; charset=utf-32", "素晴らしい"),
        (b"plain", "text/plain; format=flowed", "plain"),  # other parameters are ignored
        (b"\xef\xbb\xbfWith a BOM", "text/plain", "With a BOM"),  # UTF-8 byte-order mark, stripped
        (b"\xef\xbb\xbfWith a BOM", None, "With a BOM"),
        (b"\xef\xbb\xbfWith a BOM", "text/plain; charset=utf-8", "With a BOM"),
        ("\ufeffBOM".encode("utf-16-le"), "text/plain; charset=utf-16le", "BOM"),
        (b'\xef\xbb\xbf{"text": "JSON with a BOM"}', JSON, "JSON with a BOM"),
        ('{"text": "JSON in UTF-16"}'.encode("utf-16"), "application/json; charset=utf-16", "JSON in UTF-16"),
        ("caf\u00e9".encode("latin-1"), "text/plain; charset*=iso-8859-1''latin1", "café"),  # RFC 2231
    ],
)
def test_declared_charset_is_honoured(raw, content_type, expected):
    assert check(raw, content_type) == expected


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "kind"),
    [
        (b"text", "text/plain; charset=klingon", 415, "UnsupportedCharset"),
        (b"dGV4dA==", "text/plain; charset=base64", 415, "UnsupportedCharset"),  # a codec, but not a charset
        (b"text", "text/plain; charset=rot13", 415, "UnsupportedCharset"),
        (b"\\u0041", "text/plain; charset=unicode_escape", 415, "UnsupportedCharset"),  # Python-only escapes
        (b"text", "text/plain; charset=undefined", 415, "UnsupportedCharset"),
        (b'{"text": "x"}', "application/json; charset=nope", 415, "UnsupportedCharset"),
        (b"odd", "text/plain; charset=utf-16", 400, "InvalidEncoding"),  # 3 bytes cannot be UTF-16
        (b"\x81\x00", "text/plain; charset=shift_jis", 400, "InvalidEncoding"),
        (b"caf\xe9", "text/plain; charset=utf-8", 400, "InvalidUTF8"),  # declared UTF-8 keeps its own type
        (b"\xef\xbb\xbf", "text/plain", 400, "EmptyText"),  # a BOM alone is no text
        (b"\xef\xbb\xbf" + b"x" * LIMIT, "text/plain", 413, "PayloadTooLarge"),  # the BOM counts: bytes sent
        (b"x" * (LIMIT + 1), "text/plain; charset=klingon", 413, "PayloadTooLarge"),  # the limit comes first
    ],
)
def test_charset_rejections(raw, content_type, status, kind):
    outcome = check(raw, content_type)
    assert isinstance(outcome, Rejection), outcome
    assert (outcome.status, outcome.type) == (status, kind), outcome.message


def test_unsupported_charset_message_names_it_and_the_default():
    outcome = check(b"text", "text/plain; charset=klingon")
    assert outcome.phrase == "Unsupported Media Type"
    assert "'klingon'" in outcome.message and "UTF-8" in outcome.message


def test_an_absurdly_long_charset_is_not_echoed_whole():
    outcome = check(b"text", "text/plain; charset=" + "k" * 5000)
    assert outcome.status == 415 and len(outcome.message) < 300


@pytest.mark.parametrize(
    ("content_type", "media_type", "charset"),
    [
        ("text/plain", "text/plain", None),
        ('Text/Plain; Charset="UTF-8"', "text/plain", "utf-8"),
        ("application/json;charset=utf-16", "application/json", "utf-16"),
        ("text/plain; charset=", "text/plain", None),
        ("", "", None),
        (None, "", None),
        ("; charset=latin1", "", "latin1"),
    ],
)
def test_content_type_parsing(content_type, media_type, charset):
    assert ContentType.parse(content_type) == ContentType(media_type, charset)


def test_text_codec_names():
    assert text_codec("latin1") == text_codec("ISO-8859-1") == "iso8859-1"
    assert text_codec("utf8") == "utf-8"
    assert text_codec("zlib") is None and text_codec("idna") is None and text_codec("nul\0") is None


# ---- one item as TorchServe's worker hands it over ------------------------------------------------

REVIEW = "The room was great & clean, price = fair."


def decode(shape, limit=LIMIT):
    item, headers = shape
    return decode_request(item, headers, limit, route=route_of(headers))


def test_raw_body_charset_comes_from_the_request_header():
    # TorchServe records only "text/plain" for the parameter; the charset is in the request's header.
    assert decode(raw_body("café".encode("utf-16"), "text/plain; charset=utf-16")) == "café"


def test_request_header_in_any_case():
    shape = raw_body(b'{"text": "lower-case header"}', "application/json", header_case="content-type")
    assert decode(shape) == Document({"text": "lower-case header"})
    headers = shape[1]
    assert request_header(headers, "Content-Type") == "application/json"
    assert request_header({"content-type": {"content-type": ""}}, "content-type") is None  # a parameter, not a header
    assert request_header(None, "content-type") is None


def test_raw_body_without_any_content_type_is_text():
    assert decode(raw_body(REVIEW.encode())) == REVIEW  # curl -T review.txt


@pytest.mark.parametrize("field", ["text", "data"])
def test_urlencoded_field_is_the_text(field):
    assert decode(form({field: REVIEW.encode()})) == REVIEW  # --data-urlencode "text@review.txt"


@pytest.mark.parametrize("field", ["text", "data"])
def test_multipart_field_is_the_text(field):
    assert decode(form({field: REVIEW.encode()}, MULTIPART)) == REVIEW  # -F "text=..."
    upload = form({field: REVIEW.encode()}, MULTIPART, part_types={field: "text/plain"})  # -F "text=@review.txt"
    assert decode(upload) == REVIEW


@pytest.mark.parametrize("content_type", [URLENCODED, MULTIPART])
def test_text_field_wins_over_data_and_other_fields(content_type):
    fields = {"lang": b"en", "data": b"the data field", "text": b"the text field", "id": b"7"}
    assert decode(form(fields, content_type)) == "the text field"
    assert decode(form({"lang": b"en", "data": b"the data field"}, content_type)) == "the data field"


def test_a_multipart_part_declared_json_is_a_document():
    shape = form({"data": b'{"text": "in a part"}'}, MULTIPART, part_types={"data": "application/json"})
    assert decode(shape) == Document({"text": "in a part"})


def test_urlencoded_form_charset_applies_to_its_fields():
    # TorchServe percent-decodes to raw bytes: "text=caf%E9" arrives as b"caf\xe9".
    shape = form({"text": b"caf\xe9"}, URLENCODED + "; charset=ISO-8859-1")
    assert decode(shape) == "café"
    assert decode(form({"text": b"caf\xe9"})).type == "InvalidUTF8"


def test_form_field_with_a_bom():
    assert decode(form({"text": b"\xef\xbb\xbf" + REVIEW.encode()}, MULTIPART)) == REVIEW


def test_form_field_over_the_limit():
    outcome = decode(form({"text": b"x" * (LIMIT + 1)}))
    assert (outcome.status, outcome.type) == (413, "PayloadTooLarge")


def test_curl_d_with_plain_text_says_what_was_received_and_how_to_fix_it():
    # curl -d "The room was great, loved it.": no name=value pair, so TorchServe passes no field at all.
    outcome = decode(form({}, content_length=29))
    assert (outcome.status, outcome.type) == (400, "FormWithoutText")
    message = outcome.message
    assert URLENCODED in message and "curl -d" in message
    for fix in ('-H "Content-Type: text/plain"', "--data-binary", '{"text": ...}', '--data-urlencode "text@'):
        assert fix in message, fix


def test_curl_d_with_text_that_looks_like_fields_never_echoes_them():
    # curl -d @review.txt where the review holds "&" and "=": the text becomes field names and values.
    fields = {"The room was great ": b" clean, price ", " fair.Second line": b""}
    outcome = decode(form(fields))
    assert outcome.type == "FormWithoutText"
    assert "2 fields" in outcome.message
    for shown in [*fields, *(value.decode() for value in fields.values())]:
        assert not shown.strip() or shown.strip() not in outcome.message


def test_multipart_without_a_text_part_names_the_fix():
    outcome = decode(form({"file": REVIEW.encode()}, MULTIPART, part_types={"file": "text/plain"}))
    assert outcome.type == "FormWithoutText"
    assert "multipart form with 1 part" in outcome.message and '-F "text=@review.txt"' in outcome.message


def test_form_content_type_in_any_case_and_with_parameters():
    outcome = decode(form({}, "Application/X-WWW-Form-Urlencoded; charset=utf-8", content_length=11))
    assert outcome.type == "FormWithoutText"


def test_an_empty_form_is_empty_text():
    outcome = decode(form({}, content_length=0))  # curl -d ""
    assert outcome.type == "EmptyText"
    assert decode(form({"text": b""})) == ""  # curl -d "text=": a text field, empty; validation refuses it
    assert validate_text("").type == "EmptyText"


def test_grpc_input_map():
    assert decode(grpc({"data": REVIEW.encode()})) == REVIEW
    assert decode(grpc({"text": "café".encode()})) == "café"
    assert decode(grpc({"data": b"\xef\xbb\xbf" + b"bom"})) == "bom"
    assert decode(grpc({"data": b"caf\xe9"})).type == "InvalidUTF8"
    missing = decode(grpc({"input": REVIEW.encode(), "lang": b"en"}))
    assert (missing.status, missing.type) == (400, "MissingField")
    assert "input={'data'" in missing.message and "2 inputs" in missing.message
    assert decode(grpc({})).type == "EmptyText"


def test_no_headers_at_all():
    assert decode_request({"body": b"hello"}, None, LIMIT, route=ROUTE_UNKNOWN) == "hello"
    assert decode_request({}, None, LIMIT, route=ROUTE_UNKNOWN).type == "EmptyText"
    assert decode_request(None, None, LIMIT, route=ROUTE_UNKNOWN).type == "EmptyText"
    assert decode_request(
        {"body": b'{"text": "x"}'}, {"body": {"content-type": JSON}}, LIMIT, route=ROUTE_UNKNOWN
    ) == Document({"text": "x"})


# Every documented way of sending a text, as TorchServe hands it over: none may end as EmptyText.
DOCUMENTED_WAYS = {
    "curl -T review.txt": raw_body(REVIEW.encode()),
    "text/plain": raw_body(REVIEW.encode(), "text/plain"),
    "text/plain; charset=utf-16": raw_body(REVIEW.encode("utf-16"), "text/plain; charset=utf-16"),
    "text/plain with a BOM": raw_body(b"\xef\xbb\xbf" + REVIEW.encode(), "text/plain"),
    "JSON": raw_body(json.dumps({"text": REVIEW}).encode(), JSON),
    "JSON with a BOM": raw_body(b"\xef\xbb\xbf" + json.dumps({"text": REVIEW}).encode(), JSON),
    "--data-urlencode text@review.txt": form({"text": REVIEW.encode()}),
    "--data-urlencode data@review.txt": form({"data": REVIEW.encode()}),
    "-F text=@review.txt": form({"text": REVIEW.encode()}, MULTIPART, part_types={"text": "text/plain"}),
    "-F data=@review.txt": form({"data": REVIEW.encode()}, MULTIPART, part_types={"data": "application/octet-stream"}),
    "-F text=...": form({"text": REVIEW.encode()}, MULTIPART),
    "gRPC data": grpc({"data": REVIEW.encode()}),
    "gRPC text": grpc({"text": REVIEW.encode()}),
}


@pytest.mark.parametrize("way", DOCUMENTED_WAYS)
def test_every_documented_way_carries_the_text(way):
    outcome = decode(DOCUMENTED_WAYS[way])
    if isinstance(outcome, Document):
        outcome = plain_outcome(outcome)
    assert outcome == REVIEW


def test_new_rejections_have_the_error_shape():
    for reason in (
        rejection.form_without_text(URLENCODED, 0),
        rejection.form_without_text("multipart/form-data", 2),
        rejection.form_on_json_route(URLENCODED, 0),
        rejection.missing_input(1),
        rejection.unsupported_charset("x"),
        rejection.invalid_encoding("utf-16", 3),
    ):
        assert reason.body() == {"code": reason.status, "type": reason.type, "message": reason.message}
        assert 400 <= reason.status < 500 and reason.phrase != "Error"


def test_a_text_pair_field_beside_the_text_makes_a_pair_in_forms_and_grpc():
    pair = Document({"text": "is parking free", "text_pair": "Parking is free."})
    assert decode(form({"text": b"is parking free", "text_pair": b"Parking is free."})) == pair
    assert decode(form({"text": b"is parking free", "text_pair": b"Parking is free."}, MULTIPART)) == pair
    assert decode(grpc({"data": b"is parking free", "text_pair": b"Parking is free."})) == pair
    # A raw body is the text whatever it says: no field of its own can make a pair.
    assert decode(raw_body(b"text_pair")) == "text_pair"
    refused = decode(grpc({"text": b"q", "text_pair": b"\xff"}))
    assert (refused.type, refused.message.split(":")[0]) == ("InvalidUTF8", "text_pair")
    as_json = decode(form({"text": b"q", "text_pair": b'{"a": 1}'}, MULTIPART, part_types={"text_pair": JSON}))
    assert (as_json.type, as_json.message) == ("WrongType", "'text_pair' must be a string, got a JSON document")


def test_a_pair_is_never_read_as_a_document_and_counts_both_fields_against_the_limit():
    # A text typed JSON beside text_pair would be read as a document and the pair dropped: it is refused instead.
    refused = decode(form({"text": b'{"text": "q"}', "text_pair": b"p"}, MULTIPART, part_types={"text": JSON}))
    assert refused.type == "WrongType" and "text_pair" in refused.message
    half = b"x" * (LIMIT // 2 + 1)
    too_large = decode(grpc({"text": half, "text_pair": half}))
    assert (too_large.status, too_large.type) == (413, "PayloadTooLarge")
    assert decode(grpc({"text": half[:-2], "text_pair": half[:-2]})) == Document(
        {"text": half[:-2].decode(), "text_pair": half[:-2].decode()}
    )
