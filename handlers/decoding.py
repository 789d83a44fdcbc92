"""Request payload -> text. Pure and torch-free, so it can be unit-tested and fuzzed.

TorchServe hands the handler one dict per request: the raw body under ``body``
(or a form field under ``data``), as bytes. The handler asks TorchServe not to
pre-decode bodies (see bert_handler.py), but a value TorchServe already decoded
(str for text/*, dict/list for application/json) is accepted too, so the
functions here are correct whichever way the worker was started.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from handlers import rejection
from handlers.rejection import Rejection

TEXT_FIELD = "text"
PAYLOAD_KEYS = ("body", "data")


def payload_of(item: Any) -> tuple[str | None, Any]:
    """Return (parameter name, value) of the item's payload, or (None, None) if it has none."""
    if isinstance(item, Mapping):
        for key in PAYLOAD_KEYS:
            if key in item:
                return key, item[key]
    return None, None


def is_json_content_type(content_type: str | None) -> bool:
    if not isinstance(content_type, str):
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json"


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def text_from_json(document: Any) -> str | Rejection:
    """Pick the text out of a parsed JSON document; other fields are ignored."""
    if not isinstance(document, Mapping):
        return rejection.not_an_object(_json_type_name(document))
    if TEXT_FIELD not in document:
        return rejection.missing_field(TEXT_FIELD)
    text = document[TEXT_FIELD]
    if not isinstance(text, str):
        return rejection.wrong_type(TEXT_FIELD, _json_type_name(text))
    return text


def _utf8(raw: bytes) -> str | Rejection:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return rejection.invalid_utf8(exc.start)


def _parse_json(text: str) -> Any | Rejection:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return rejection.malformed_json(f"{exc.msg} at line {exc.lineno} column {exc.colno}")
    except (ValueError, RecursionError):
        # RecursionError: deeply nested arrays; ValueError: e.g. huge integer literals.
        return rejection.malformed_json("document is nested too deeply or has out-of-range values")


def decode_payload(value: Any, content_type: str | None, max_bytes: int) -> str | Rejection:
    """Turn one request's payload into its text, or say why it cannot be served.

    The byte limit is checked first, on the bytes the client sent, so an
    oversized body costs no decoding work.
    """
    if value is None:
        return rejection.empty_text()
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) > max_bytes:
            return rejection.payload_too_large(len(raw), max_bytes)
        text = _utf8(raw)
        if isinstance(text, Rejection):
            return text
    elif isinstance(value, str):
        # Already decoded by TorchServe: text/*, or JSON its own parser gave up on.
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            return rejection.payload_too_large(size, max_bytes)
        text = value
    else:
        # Already parsed by TorchServe (application/json): a dict, list, number ...
        return text_from_json(value)
    if not is_json_content_type(content_type):
        return text
    document = _parse_json(text)
    if isinstance(document, Rejection):
        return document
    return text_from_json(document)
