"""Request decoding and validation as pure functions: every rejection and the valid edge cases."""

from __future__ import annotations

import json

import pytest

from handlers.decoding import decode_payload, is_json_content_type, payload_of
from handlers.rejection import Rejection
from handlers.validation import decode_and_validate, validate_text

LIMIT = 64 * 1024
JSON = "application/json"


def check(value, content_type, limit=LIMIT):
    return decode_and_validate(value, content_type, limit)


@pytest.mark.parametrize(
    ("value", "content_type", "status", "kind"),
    [
        (b"", "text/plain", 400, "EmptyText"),
        (b"   \n\t ", "text/plain", 400, "EmptyText"),
        ("\u3000\u2003", "text/plain", 400, "EmptyText"),  # unicode whitespace only
        (None, "text/plain", 400, "EmptyText"),  # request without a body
        (b'{"text": ""}', JSON, 400, "EmptyText"),
        (b'{"text": "   "}', JSON, 400, "EmptyText"),
        (b'{"txt": "hello"}', JSON, 400, "MissingField"),
        (b"{}", JSON, 400, "MissingField"),
        (b'{"text": 42}', JSON, 400, "WrongType"),
        (b'{"text": null}', JSON, 400, "WrongType"),
        (b'{"text": ["a"]}', JSON, 400, "WrongType"),
        (b'{"text": {"a": 1}}', JSON, 400, "WrongType"),
        (b'{"text": "unterminated', JSON, 400, "MalformedJSON"),
        (b"not json at all", JSON, 400, "MalformedJSON"),
        (b"[" * 50_000, JSON, 400, "MalformedJSON"),  # nesting deep enough to hit the recursion limit
        (b'["text"]', JSON, 400, "NotAnObject"),
        (b'"just a string"', JSON, 400, "NotAnObject"),
        (b"42", JSON, 400, "NotAnObject"),
        (b"null", JSON, 400, "NotAnObject"),
        (b"\xff\xfe\xfa", "text/plain", 400, "InvalidUTF8"),
        (b"caf\xe9", "text/plain", 400, "InvalidUTF8"),  # latin-1, not UTF-8
        (b'{"text": "caf\xe9"}', JSON, 400, "InvalidUTF8"),
        (b'{"text": "\\ud800"}', JSON, 400, "InvalidUnicode"),  # lone surrogate via a JSON escape
        (b"x" * (LIMIT + 1), "text/plain", 413, "PayloadTooLarge"),
        (json.dumps({"text": "x" * LIMIT}).encode(), JSON, 413, "PayloadTooLarge"),
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
    outcome = decode_payload([1, 2], JSON, LIMIT)
    assert isinstance(outcome, Rejection) and outcome.type == "NotAnObject"


def test_payload_of_prefers_body_then_data():
    assert payload_of({"body": b"a", "data": b"b"}) == ("body", b"a")
    assert payload_of({"data": b"b"}) == ("data", b"b")
    assert payload_of({}) == (None, None)
    assert payload_of("not a dict") == (None, None)


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
    assert is_json_content_type(content_type) is expected


def test_validate_text_returns_the_text_unchanged():
    assert validate_text("  padded  ") == "  padded  "


def test_rejection_phrase_is_the_http_reason():
    outcome = check(b"", "text/plain")
    assert outcome.phrase == "Bad Request"
    assert Rejection(413, "PayloadTooLarge", "m").phrase == "Request Entity Too Large"
