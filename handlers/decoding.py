"""Request payload -> text or JSON document. Pure and torch-free, so it can be unit-tested and fuzzed.

TorchServe's frontend hands the worker one dict per request, parameter name -> bytes:
  raw body (any Content-Type but a form)  {"body": <the bytes sent>}
  urlencoded or multipart form            one entry per field, {"text": ..., "data": ..., "other": ...};
                                          a later field of the same name replaces an earlier one
  gRPC Predictions                        the request's input map, {"data": ...} by TorchServe's convention
and, per request, a headers dict holding {"content-type": ...} for every parameter (the media
type alone: TorchServe drops the charset) and the HTTP request headers under the names the client
sent them (any case). The payload is the raw body where the frontend made one (an HTTP request that is not
a form); in a form, the field `text`, else `data`, and a field that happens to be named `body` is a field like
any other, ignored (it must never beat `text` nor drop its `text_pair`); over gRPC the input `text`, else `data`,
else `body` (what TorchServe's own handlers read). A form or gRPC input map that also has a `text_pair` field is
a pair of texts (handlers/instances.py), read as the JSON document {"text": ..., "text_pair": ...} would be.

TorchServe's form parser also swallows the most common curl habit: `curl -d "some text"` sends
application/x-www-form-urlencoded, and a body without `name=value` pairs arrives as no field at
all. Such a request gets its own rejection saying so and how to send the text instead.

The handler asks TorchServe not to pre-decode bodies (see bert_handler.py), but a value TorchServe
already decoded (str for text/*, dict/list for application/json) is accepted too, so the functions
here are correct whichever way the worker was started.
"""

from __future__ import annotations

import codecs
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from email.message import Message
from email.utils import collapse_rfc2231_value
from typing import Any

from handlers import rejection
from handlers.instances import PAIR_FIELD
from handlers.rejection import Rejection

TEXT_FIELD = "text"
RAW_BODY = "body"  # the parameter TorchServe's frontend puts an HTTP request's body in when it is not a form
# Which parameter carries the text, by how the request came. A form's or gRPC input map's fields: `text` (what the
# JSON format calls it) before `data` (TorchServe's own convention). TorchServe 0.12 drops the query parameters of
# /predictions/NAME (and the KServe routes): should one arrive, the body comes first, and in a form a field named
# `body` is not a payload. /invocations and /NAME/predict hand them over, with no route header: read as gRPC's map.
RAW_BODY_KEYS = (RAW_BODY, TEXT_FIELD, "data")
FORM_KEYS = (TEXT_FIELD, "data")
GRPC_KEYS = (TEXT_FIELD, "data", RAW_BODY)
FORM_MEDIA_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})
DEFAULT_CHARSET = "utf-8"
BOM = "\ufeff"
# Python codecs that are not charsets a client could mean: escapes, IDNA, the always-failing one.
NOT_CHARSETS = frozenset({"unicode-escape", "raw-unicode-escape", "idna", "punycode", "undefined"})


@dataclass(frozen=True)
class Document:
    """A body declared JSON and parsed, or a form's (a gRPC input map's) text and text_pair fields as the JSON
    object they stand for; handlers/protocols.py decides what it holds (one text or a pair, KServe v1 or v2)."""

    value: Any


@dataclass(frozen=True)
class ContentType:
    """A Content-Type value: its media type (lower case, "" if none) and its charset parameter (None if none)."""

    media_type: str = ""
    charset: str | None = None

    @classmethod
    def parse(cls, value: Any) -> ContentType:
        if not isinstance(value, str) or not value.strip():
            return cls()
        return _parse_content_type(value)

    @classmethod
    def _parse(cls, value: str) -> ContentType:
        media_type = value.split(";", 1)[0].strip().lower()
        # The email package parses MIME parameters properly: quoting, RFC 2231, stray whitespace.
        header = Message()
        header["content-type"] = value
        charset = header.get_param("charset")
        if charset is None:
            return cls(media_type)
        return cls(media_type, collapse_rfc2231_value(charset).strip().lower() or None)

    @property
    def is_json(self) -> bool:
        return self.media_type == "application/json"

    @property
    def is_form(self) -> bool:
        return self.media_type in FORM_MEDIA_TYPES


@functools.lru_cache(maxsize=256)
def _parse_content_type(value: str) -> ContentType:
    # Clients send a handful of distinct values; the MIME parse runs twice per request otherwise.
    return ContentType._parse(value)


# TorchServe 0.12's frontend (InferenceRequestHandler) adds the header `explain` to the requests of
# /predictions, /explanations and the KServe routes, and `url_path` to those of /predictions and
# /explanations only. gRPC requests, and bare handler calls, carry neither (nor any request header).
ROUTE_PREDICTIONS = "predictions"
ROUTE_KSERVE = "kserve"  # /v1/models/NAME:predict|:explain, /v2/models/NAME/infer|/explain
ROUTE_UNKNOWN = "unknown"  # gRPC, or a bare handler call


def route_of(headers: Mapping[str, Any] | None) -> str:
    """Which route the request came on, from the headers TorchServe's frontend adds."""
    if request_header(headers, "url_path") is not None:
        return ROUTE_PREDICTIONS
    if request_header(headers, "explain") is not None:
        return ROUTE_KSERVE
    return ROUTE_UNKNOWN


def came_over_grpc(headers: Mapping[str, Any] | None) -> bool:
    """Whether the request came through TorchServe's gRPC API: its worker records no HTTP header for it at all, only
    each input's entry (a mapping), where every HTTP route (/invocations too) has at least Host."""
    return not any(isinstance(value, str) for value in (headers or {}).values())


def asks_to_describe(headers: Mapping[str, Any] | None) -> bool:
    """Whether the request is a management describe call (?customized=true), which TorchServe marks `describe: True`."""
    return _says_true(headers, "describe")


def asks_for_an_explanation(headers: Mapping[str, Any] | None) -> bool:
    """Whether the request came on an explanation route: TorchServe's frontend sets `explain` to "True" there."""
    return _says_true(headers, "explain")


def _says_true(headers: Mapping[str, Any] | None, name: str) -> bool:
    """A flag TorchServe's frontend sets as a request header, "True" or "False" (Java's Boolean.toString, any case)."""
    return (request_header(headers, name) or "").strip().lower() == "true"


def _payload_keys(headers: Mapping[str, Any] | None, route: str) -> tuple[str, ...]:
    """The parameters that may carry the text, in order, by how the request came (RAW_BODY_KEYS: a raw HTTP body)."""
    if ContentType.parse(request_header(headers, "content-type")).is_form:
        return FORM_KEYS
    return GRPC_KEYS if route == ROUTE_UNKNOWN else RAW_BODY_KEYS


def _first_present(item: Any, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    if isinstance(item, Mapping):
        for key in keys:
            if key in item:
                return key, item[key]
    return None, None


def payload_of(item: Any, headers: Mapping[str, Any] | None, route: str) -> tuple[str | None, Any]:
    """Return (parameter name, value) of the item's payload, or (None, None) if it has none.

    How the request came says which parameter that is: its `route` (route_of, read once per request by the caller)
    and its `headers` (the request's, as TorchServe passes them): a raw HTTP body, a form, or gRPC's input map.
    """
    return _first_present(item, _payload_keys(headers, route))


@functools.lru_cache(maxsize=64)
def text_codec(charset: str) -> str | None:
    """Python's name for the text encoding `charset` names, or None if it names none."""
    try:
        name = codecs.lookup(charset).name
        # Decoding raises LookupError for bytes-to-bytes codecs (base64, zlib, rot13 ...).
        b"\0".decode(name, "ignore")
    except (LookupError, ValueError):
        return None
    return None if name in NOT_CHARSETS else name


def _decode_text(raw: bytes, charset: str | None) -> str | Rejection:
    codec = text_codec(charset) if charset else DEFAULT_CHARSET
    if codec is None:
        return rejection.unsupported_charset(charset)
    try:
        text = raw.decode(codec)
    except UnicodeDecodeError as exc:
        if codec == DEFAULT_CHARSET:
            return rejection.invalid_utf8(exc.start)
        return rejection.invalid_encoding(codec, exc.start)
    # A byte-order mark (what several Windows tools write first) is not part of the text.
    return text.removeprefix(BOM)


def _parse_json(text: str) -> Any | Rejection:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return rejection.malformed_json(f"{exc.msg} at line {exc.lineno} column {exc.colno}")
    except (ValueError, RecursionError):
        # RecursionError: deeply nested arrays; ValueError: e.g. huge integer literals.
        return rejection.malformed_json("document is nested too deeply or has out-of-range values")


def _decode(value: Any, content_type: ContentType, max_bytes: int) -> str | Document | Rejection:
    if value is None:
        return rejection.empty_text()
    # The limit applies to the bytes the client sent, before any decoding work.
    if _size(value) > max_bytes:
        return rejection.payload_too_large(_size(value), max_bytes)
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = _decode_text(bytes(value), content_type.charset)
        if isinstance(text, Rejection):
            return text
    elif isinstance(value, str):
        # Already decoded by TorchServe: text/*, or JSON its own parser gave up on.
        text = value.removeprefix(BOM)
    else:
        # Already parsed by TorchServe (application/json): a dict, list, number ...
        return Document(value)
    if not content_type.is_json:
        return text
    document = _parse_json(text)
    if isinstance(document, Rejection):
        return document
    return Document(document)


# ---- one item of a TorchServe batch ---------------------------------------------------------------


def request_header(headers: Mapping[str, Any] | None, name: str) -> str | None:
    """An HTTP request header by name, whatever case the client sent it in (None if absent)."""
    if not headers:
        return None
    name = name.lower()
    for key, value in headers.items():
        # Parameters' entries are dicts; request headers are strings.
        if isinstance(key, str) and isinstance(value, str) and key.lower() == name:
            return value
    return None


def parameter_content_type(headers: Mapping[str, Any] | None, name: str | None) -> str | None:
    """The content type TorchServe recorded for the request parameter `name` (None if unknown)."""
    if not headers or name is None:
        return None
    parameter = headers.get(name)
    if isinstance(parameter, Mapping):
        parameter = parameter.get("content-type")
    return parameter if isinstance(parameter, str) else None


def payload_content_type(headers: Mapping[str, Any] | None, name: str) -> ContentType:
    """The payload's media type and charset, from its parameter's entry and the request's Content-Type.

    TorchServe keeps only the media type of each parameter: the charset is the request's.
    For the raw body that is the whole Content-Type; for a form field, an urlencoded form's charset.
    """
    request = ContentType.parse(request_header(headers, "content-type"))
    parameter = ContentType.parse(parameter_content_type(headers, name))
    if name == RAW_BODY and request.media_type and not request.is_form:
        return request
    return ContentType(parameter.media_type, parameter.charset or request.charset)


def _size(value: Any) -> int:
    """The bytes a field's value was sent as (a str TorchServe already decoded: its UTF-8 length)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else 0


def _without_payload(item: Any, headers: Mapping[str, Any] | None, as_json: bool) -> Rejection:
    """Why an item with none of the payload parameters cannot be served, and what to do (on a route that reads
    JSON, a form's fix is the JSON header: a text field would not be read there either)."""
    fields = len(item) if isinstance(item, Mapping) else 0
    request = ContentType.parse(request_header(headers, "content-type"))
    if request.is_form:
        if fields == 0 and (request_header(headers, "content-length") or "").strip() == "0":
            return rejection.empty_text()  # an empty form: nothing was sent
        if as_json:
            return rejection.form_on_json_route(request.media_type, fields)
        return rejection.form_without_text(request.media_type, fields)
    if fields:
        return rejection.missing_input(fields)
    return rejection.empty_text()


def decode_request(
    item: Any, headers: Mapping[str, Any] | None, max_bytes: int, *, route: str, as_json: bool = False
) -> str | Document | Rejection:
    """One item of a TorchServe batch (its parameters, and its headers from the context) -> text or document.

    `route`: the route it came on (route_of, which the caller has read already). `as_json`: the payload is JSON
    whatever its Content-Type says (a KServe route; its charset still counts).
    """
    keys = _payload_keys(headers, route)  # once per request: it scans the headers
    name, value = _first_present(item, keys)
    if name is None:
        return _without_payload(item, headers, as_json)
    content_type = payload_content_type(headers, name)
    if as_json:
        content_type = ContentType("application/json", content_type.charset)
    decoded = _decode(value, content_type, max_bytes)
    # A raw body is the text whole: no field beside it (a query parameter) makes it a pair.
    if (keys is RAW_BODY_KEYS and name == RAW_BODY) or PAIR_FIELD not in item or isinstance(decoded, Rejection):
        return decoded
    # A form (or gRPC input map) with a second text: a pair, each field decoded with its own content type.
    if isinstance(decoded, Document):  # never read as a document with its text_pair dropped
        return rejection.wrong_type(name, f"a JSON document beside a '{PAIR_FIELD}' field (send the text as text)")
    size = _size(value) + _size(item[PAIR_FIELD])
    if size > max_bytes:  # the limit is the request's, not each field's
        return rejection.payload_too_large(size, max_bytes)
    pair = _decode(item[PAIR_FIELD], payload_content_type(headers, PAIR_FIELD), max_bytes)
    if isinstance(pair, Document):
        return rejection.wrong_type(PAIR_FIELD, "a JSON document")
    if isinstance(pair, Rejection):
        return replace(pair, message=f"{PAIR_FIELD}: {pair.message}")
    return Document({TEXT_FIELD: decoded, PAIR_FIELD: pair})
