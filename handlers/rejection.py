"""The per-item error: why one item of a batch gets no prediction.

A rejection never leaves its item; neighbours in the same batch are unaffected.
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


def too_many_tokens(limit: int) -> Rejection:
    return Rejection(422, "TooManyTokens", f"text is longer than the limit of {limit} tokens")


def inference_failed() -> Rejection:
    return Rejection(500, "InferenceFailed", "the model failed on this item")


def out_of_memory() -> Rejection:
    return Rejection(507, "OutOfMemory", "the model ran out of memory on this item")


def internal_error() -> Rejection:
    return Rejection(500, "InternalError", "the handler failed on this item")
