"""The per-item error, and the catalogue of every error the service answers: each is built here.

A rejection says why one item of a batch gets no prediction; it never leaves its item, and
neighbours in the same batch are unaffected.
The body mirrors TorchServe's own error shape so clients parse one format.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus


@dataclass(frozen=True)
class Rejection:
    status: int
    type: str
    message: str

    @property
    def phrase(self) -> str:
        try:
            return HTTPStatus(self.status).phrase
        except ValueError:
            return "Error"

    def body(self) -> dict[str, object]:
        return {"code": self.status, "type": self.type, "message": self.message}


def empty_text() -> Rejection:
    return Rejection(400, "EmptyText", "text is empty or whitespace only")


def missing_field(field: str) -> Rejection:
    return Rejection(400, "MissingField", f"JSON body has no '{field}' field")


def wrong_type(field: str, got: str) -> Rejection:
    return Rejection(400, "WrongType", f"'{field}' must be a string, got {got}")


def malformed_json(detail: str) -> Rejection:
    return Rejection(400, "MalformedJSON", f"body is not valid JSON: {detail}")


def not_an_object(got: str) -> Rejection:
    return Rejection(400, "NotAnObject", f"JSON body must be an object, got {got}")


def invalid_utf8(position: int) -> Rejection:
    return Rejection(400, "InvalidUTF8", f"body is not valid UTF-8 (byte {position})")


def payload_too_large(size: int, limit: int) -> Rejection:
    return Rejection(413, "PayloadTooLarge", f"body is {size} bytes, limit is {limit}")


def invalid_unicode(index: int) -> Rejection:
    return Rejection(400, "InvalidUnicode", f"text has an unpaired surrogate at index {index}")


def too_many_instances(count: int, limit: int) -> Rejection:
    return Rejection(413, "TooManyInstances", f"request has {count} instances, the limit is {limit} per request")


def malformed_request(protocol: str, message: str) -> Rejection:
    """A KServe body that is JSON but not the protocol's shape; `protocol` names it in the message."""
    return Rejection(400, "MalformedRequest", f"{protocol}: {message}")


def too_many_tokens(limit: int) -> Rejection:
    return Rejection(422, "TooManyTokens", f"text is longer than the limit of {limit} tokens")


def inference_failed() -> Rejection:
    return Rejection(500, "InferenceFailed", "the model failed on this item")


def out_of_memory() -> Rejection:
    return Rejection(507, "OutOfMemory", "the model ran out of memory on this item")


def internal_error() -> Rejection:
    return Rejection(500, "InternalError", "the handler failed on this item")


def explanation_not_supported() -> Rejection:
    """An explanation route (/explanations/NAME, KServe's :explain and /explain): this handler has no explainer, and a
    prediction answered there would pass for an explanation."""
    return Rejection(501, "ExplanationNotSupported", "this model answers predictions, not explanations: call "
                     "/predictions/NAME, /v1/models/NAME:predict or /v2/models/NAME/infer")  # fmt: skip


# ---- overload (handlers/deadline.py) --------------------------------------------------------------


def deadline_exceeded(header: str, late_ms: float | None) -> Rejection:
    """503 like the frontend's full queue: the same retry-with-backoff rule serves both. `late_ms`: how long
    ago the deadline passed; None when it is still ahead but the batch's passes would end after it."""
    when = f"{late_ms:.0f} ms short" if late_ms is not None else "its batch's forward passes would end after it"
    return Rejection(
        503,
        "DeadlineExceeded",
        f"the model could not answer before the request's deadline ({header}; {when}): "
        "it was not computed; the service is overloaded, retry with backoff",
    )


def invalid_deadline(header: str) -> Rejection:
    return Rejection(400, "InvalidDeadline", f"{header} must be a Unix time in milliseconds (13 digits, not seconds)")


# ---- how the text was sent (handlers/decoding.py) -------------------------------------------------
# Messages name what was received and the exact fix, never a field's value or name: with curl -d,
# TorchServe's form parser turns the client's text itself into field names.

PLAIN_TEXT_FIX = (
    'send the text itself with -H "Content-Type: text/plain" (curl -H "Content-Type: text/plain" '
    '--data-binary @review.txt), or JSON {"text": ...} with -H "Content-Type: application/json"'
)


def form_without_text(media_type: str, fields: int) -> Rejection:
    """A form body (urlencoded or multipart) with no field named `text` or `data`."""
    if media_type == "multipart/form-data":
        received = f"a multipart form with {fields} part{'s' if fields != 1 else ''}, none named 'text' or 'data'"
        fix = 'name the part text (curl -F "text=@review.txt"), or ' + PLAIN_TEXT_FIX
    else:
        if fields:
            received = f"a form body ({media_type}) with {fields} field{'s' if fields != 1 else ''}"
            received += ", none named 'text' or 'data'"
        else:
            received = f"a form body ({media_type}) without a single name=value field"
        received += "; curl -d and --data-binary declare this type unless told otherwise"
        fix = PLAIN_TEXT_FIX + ', or as a form field: --data-urlencode "text@review.txt"'
    return Rejection(400, "FormWithoutText", f"received {received}: {fix}")


def form_on_json_route(media_type: str, fields: int) -> Rejection:
    """A form body (curl -d without a Content-Type) on a route that reads only JSON (KServe v1 and v2): TorchServe's
    frontend parsed it as a form before the handler saw it, so the JSON is lost; only the header mends it."""
    kind = "a multipart form" if media_type == "multipart/form-data" else f"a form body ({media_type})"
    received = f"{kind} with {fields} field{'s' if fields != 1 else ''}"
    return Rejection(
        400,
        "FormWithoutText",
        f"received {received} on a route that reads JSON: TorchServe parsed the body as a form, so it never "
        'arrived; send it with -H "Content-Type: application/json" (curl -d and --data-binary declare '
        "application/x-www-form-urlencoded unless told otherwise)",
    )


def missing_input(inputs: int) -> Rejection:
    """A request without a body whose inputs (gRPC's input map) include neither `text` nor `data`."""
    return Rejection(
        400,
        "MissingField",
        f"request has {inputs} input{'s' if inputs != 1 else ''}, none named 'text' or 'data' "
        "(over gRPC: input={'data': <the text as UTF-8 bytes>})",
    )


def _shown(header_value: str) -> str:
    """A client's header value as a message quotes it: cut at 40 characters, so an error body stays small."""
    return header_value if len(header_value) <= 40 else header_value[:40] + "..."


def unsupported_charset(charset: str) -> Rejection:
    return Rejection(
        415,
        "UnsupportedCharset",
        f"charset {_shown(charset)!r} in Content-Type is not a text encoding this server knows: send UTF-8 "
        "(the default; leave charset out) or a standard one such as utf-16, iso-8859-1, windows-1252, shift_jis",
    )


def unsupported_content_encoding(encoding: str) -> Rejection:
    return Rejection(
        415,
        "UnsupportedContentEncoding",
        f"Content-Encoding {_shown(encoding)!r} is not supported: TorchServe hands the body over as it was sent, "
        "so send it uncompressed (tritonclient: leave request_compression_algorithm out)",
    )


def invalid_encoding(charset: str, position: int) -> Rejection:
    """The body does not decode in the charset its Content-Type declares (InvalidUTF8 for UTF-8)."""
    return Rejection(400, "InvalidEncoding", f"body is not valid {charset} (byte {position}), the declared charset")
