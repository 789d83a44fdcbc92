"""Request bodies the service must refuse, and how: one table for every layer that checks them.

Each case is (body bytes, Content-Type, expected status, expected `type`). The decoding unit
tests feed them to the pure functions, the in-process tests to the handler inside one batch,
the end-to-end tests over HTTP to a real torchserve; cases that only exist in-process (a body
TorchServe already decoded to str, no body at all) stay in the unit tests.
"""

from __future__ import annotations

import json

from handlers.options import HandlerOptions

TEXT = "text/plain"
JSON = "application/json"
MAX_BYTES = HandlerOptions.max_bytes  # the handler's default body limit (413 PayloadTooLarge above it)

REJECTED_BODIES: list[tuple[bytes, str, int, str]] = [
    (b"", TEXT, 400, "EmptyText"),
    (b"   \n\t ", TEXT, 400, "EmptyText"),
    (b'{"text": ""}', JSON, 400, "EmptyText"),
    (b'{"text": "   "}', JSON, 400, "EmptyText"),
    (b'{"txt": "hello"}', JSON, 400, "MissingField"),
    (b"{}", JSON, 400, "MissingField"),
    (b'{"text": 42}', JSON, 400, "WrongType"),
    (b'{"text": null}', JSON, 400, "WrongType"),
    (b'{"text": ["a"]}', JSON, 400, "WrongType"),
    (b'{"text": {"a": 1}}', JSON, 400, "WrongType"),
    (b'{"text": "a query", "text_pair": 7}', JSON, 400, "WrongType"),  # the second text of a pair
    (b'{"text": "a query", "text_pair": " "}', JSON, 400, "EmptyText"),
    (b'{"text": "", "text_pair": "a passage"}', JSON, 400, "EmptyText"),
    (b'{"text": "a query", "text_pair": "\\udc00"}', JSON, 400, "InvalidUnicode"),
    (b'{"text": "unterminated', JSON, 400, "MalformedJSON"),
    (b"not json at all", JSON, 400, "MalformedJSON"),
    (b"[" * 50_000, JSON, 400, "MalformedJSON"),  # nesting deep enough to hit the recursion limit
    (b'["text"]', JSON, 400, "NotAnObject"),
    (b'"just a string"', JSON, 400, "NotAnObject"),
    (b"42", JSON, 400, "NotAnObject"),
    (b"null", JSON, 400, "NotAnObject"),
    (b"\xff\xfe\xfa", TEXT, 400, "InvalidUTF8"),
    (b"caf\xe9", TEXT, 400, "InvalidUTF8"),  # latin-1, not UTF-8
    (b'{"text": "caf\xe9"}', JSON, 400, "InvalidUTF8"),
    (b'{"text": "\\ud800"}', JSON, 400, "InvalidUnicode"),  # lone surrogate via a JSON escape
    (b"x" * (MAX_BYTES + 1), TEXT, 413, "PayloadTooLarge"),
    (json.dumps({"text": "x" * MAX_BYTES}).encode(), JSON, 413, "PayloadTooLarge"),
]


def case_id(case: tuple[bytes | str | None, str, int, str]) -> str:
    """A short readable test id: the expected type, the media subtype and the start of the body."""
    body, content_type, _, kind = case
    return f"{kind}-{content_type.split('/')[-1]}-{body if body is None else body[:16]!r}"
