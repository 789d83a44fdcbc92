"""What TorchServe 0.12's worker hands the handler for one request: (item, headers), as seen on a real server.

Recorded with an echo handler against torchserve 0.12 (curl 7.88): the frontend
(InferenceRequestHandler.parseRequest) passes a non-form body as the parameter `body` with the
media type alone, each form field as its own parameter (content type "" for urlencoded fields and
multipart fields without a filename, the part's media type for uploads), gRPC's input map entry
by entry with content type "", and the HTTP request headers under the names the client used
(curl: "Content-Type"; a client that sends "content-type" gets that key). A body declared
urlencoded without any name=value pair (curl -d "some text") arrives as no parameter at all.
"""

from __future__ import annotations

from collections.abc import Mapping

URLENCODED = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data; boundary=------------------------d5b3834854526f06"


def _http_headers(content_type: str | None, content_length: int, header_case: str = "Content-Type") -> dict:
    headers = {
        "Authorization": "Bearer key",
        "explain": "False",
        "Accept": "*/*",
        "User-Agent": "curl/7.88.1",
        "Host": "127.0.0.1:8080",
        "Content-Length": str(content_length),
        "url_path": "",
    }
    if content_type is not None:
        headers[header_case] = content_type
    return headers


def raw_body(body: bytes, content_type: str | None = None, header_case: str = "Content-Type") -> tuple[dict, dict]:
    """curl --data-binary / -T: the body as sent, the parameter's content type without parameters."""
    media_type = content_type.split(";", 1)[0].strip() if content_type else ""
    headers = {"body": {"content-type": media_type}, **_http_headers(content_type, len(body), header_case)}
    return {"body": bytearray(body)}, headers


def form(
    fields: Mapping[str, bytes],
    content_type: str = URLENCODED,
    part_types: Mapping[str, str] | None = None,
    content_length: int | None = None,
) -> tuple[dict, dict]:
    """An urlencoded or multipart form as the worker gets it: one parameter per (last) field of each name."""
    part_types = part_types or {}
    item = {name: bytearray(value) for name, value in fields.items()}
    length = content_length if content_length is not None else sum(len(k) + len(v) + 2 for k, v in fields.items())
    headers = {name: {"content-type": part_types.get(name, "")} for name in fields}
    headers.update(_http_headers(content_type, length))
    return item, headers


def grpc(inputs: Mapping[str, bytes]) -> tuple[dict, dict]:
    """gRPC Predictions: the input map, no HTTP headers at all."""
    return {name: bytearray(value) for name, value in inputs.items()}, {name: {"content-type": ""} for name in inputs}
