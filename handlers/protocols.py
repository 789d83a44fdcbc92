"""The request formats the handler speaks: a decoded body -> its instances. Pure and torch-free.

One TorchServe batch can mix three formats, recognised per request from its body:
  predictions  raw text, or JSON {"text": "..."}              -> one instance
  KServe v1    JSON {"instances": ["...", {"text": "..."}]}   -> one instance per entry
  KServe v2    JSON {"id": ..., "inputs": [{"name": "text", "datatype": "BYTES", "shape": [N], "data": [...]}]}
An instance may be a pair of texts (handlers/instances.py): {"text": "...", "text_pair": "..."} in
the JSON formats, and in KServe v2 a second input named "text_pair" beside one named "text".
Every instance is validated, encoded and run on its own footing (handlers/pipeline.py);
this module turns a decoded body into instances; handlers/responses.py turns instance
results back into the one answer its request gets.
TorchServe's own KServe envelopes are never used: they read only the first request of
a batch (pytorch/serve #1302, #2158).

The route decides before the body does (read_request): a request that came on a KServe route is
read as v1/v2 JSON whatever its Content-Type (tritonclient.http sends none), and a body that is
not an envelope is refused there, never answered in the /predictions format. A v2 request in the
binary tensor extension (tritonclient's default: an `Inference-Header-Content-Length` header) has its
binary inputs read into its JSON first (handlers/binary_tensors.py). Which outputs a v2 request asks for as binary
(per output `parameters.binary_data`, else the request's `parameters.binary_data_output`) is read here too, and
handlers/responses.py answers them so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from handlers import rejection
from handlers.binary_tensors import HEADER_LENGTH, inline_binary_inputs, split_body
from handlers.decoding import (
    ROUTE_KSERVE,
    ROUTE_UNKNOWN,
    TEXT_FIELD,
    Document,
    asks_for_an_explanation,
    decode_request,
    payload_content_type,
    payload_of,
    request_header,
    route_of,
)
from handlers.instances import PAIR_FIELD, Instance, TextPair
from handlers.rejection import Rejection

PREDICTIONS = "predictions"
KSERVE_V1 = "kserve-v1"
KSERVE_V2 = "kserve-v2"
# The output tensors a KServe v2 answer can hold (handlers/responses.py writes them), in the order it writes them.
V2_OUTPUTS = ("label", "score", "probabilities", "truncated")


@dataclass(frozen=True)
class ParsedRequest:
    """One request of the batch, read: its format, its instances (a text or a pair, or why not), or an error for all
    of it."""

    protocol: str
    instances: tuple[Instance | Rejection, ...] = ()
    error: Rejection | None = None
    request_id: Any = None  # KServe v2 "id", echoed in the answer
    kserve_route: bool = False  # came on a KServe route: its errors carry the protocols' `error` field too
    text_input: int = 0  # KServe v2: the index of the input named "text" among two (pairs), for naming instances
    outputs: tuple[str, ...] = V2_OUTPUTS  # KServe v2: the output tensors asked for (all when none are named)
    binary_outputs: tuple[str, ...] = ()  # KServe v2: those of `outputs` asked for in the binary tensor extension

    def instance_name(self, position: int) -> str:
        """How the answer names an instance: `instances[2]`, `inputs[0].data[3]`."""
        names = {KSERVE_V1: f"instances[{position}]", KSERVE_V2: f"inputs[{self.text_input}].data[{position}]"}
        return names.get(self.protocol, "")

    def first_problem(self) -> tuple[int | None, Rejection] | None:
        """The request-level error, or the first instance that cannot be served (with its position)."""
        if self.error is not None:
            return None, self.error
        for position, instance in enumerate(self.instances):
            if isinstance(instance, Rejection):
                return position, instance
        return None


# ---- the route decides, then the body (which route: handlers/decoding.route_of) ----------------------


def read_request(item: Any, headers: Mapping[str, Any] | None, max_bytes: int, max_instances: int) -> ParsedRequest:
    """One item of a TorchServe batch -> its format and instances, the route first, then the body.

    On /predictions (and where the route is unknown) the Content-Type says whether the body is JSON.
    On a KServe route the body is JSON whatever it says and must be a v1 or v2 envelope. Where the
    route is unknown, a body with no declared media type is read as an envelope only when it is a
    well-formed one (a text to classify is never a whole v1/v2 document).
    """
    route = route_of(headers)
    if asks_for_an_explanation(headers):
        error = rejection.explanation_not_supported()
        return ParsedRequest(PREDICTIONS, error=error, kserve_route=route == ROUTE_KSERVE)
    encoding = request_header(headers, "Content-Encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        # TorchServe's frontend has no decompressor: a compressed body would be read as garbled text or JSON.
        error = rejection.unsupported_content_encoding(encoding.strip())
        return ParsedRequest(PREDICTIONS, error=error, kserve_route=route == ROUTE_KSERVE)
    if route == ROUTE_KSERVE:
        header_length = request_header(headers, HEADER_LENGTH)
        if header_length is not None:
            envelope = _binary_envelope(item, headers, header_length, max_bytes, max_instances)
        else:
            envelope = parse_envelope(
                decode_request(item, headers, max_bytes, route=route, as_json=True), max_instances
            )
        return replace(envelope, kserve_route=True)
    if route == ROUTE_UNKNOWN:
        return _without_binary_outputs(_read_unknown_route(item, headers, max_bytes, max_instances))
    return parse_request(decode_request(item, headers, max_bytes, route=route), max_instances)


def _read_unknown_route(
    item: Any, headers: Mapping[str, Any] | None, max_bytes: int, max_instances: int
) -> ParsedRequest:
    """TorchServe's gRPC API: a body with no declared media type is an envelope when it is a well-formed one."""
    name, _ = payload_of(item, headers, ROUTE_UNKNOWN)
    if name is not None and not payload_content_type(headers, name).media_type:
        envelope = parse_envelope(
            decode_request(item, headers, max_bytes, route=ROUTE_UNKNOWN, as_json=True), max_instances
        )
        if envelope.error is None:
            return envelope
    return parse_request(decode_request(item, headers, max_bytes, route=ROUTE_UNKNOWN), max_instances)


def _without_binary_outputs(request: ParsedRequest) -> ParsedRequest:
    """Where the route is unknown (TorchServe's gRPC API) outputs are answered in JSON whatever was asked: gRPC
    keeps a reply's body only (GRPCJob.response), and a binary answer without its Inference-Header-Content-Length
    could not be split back into its JSON and its bytes."""
    # Most requests asked for none, and replace() cost 2-3 us an item, a fifth of reading one (2-core VM).
    return replace(request, binary_outputs=()) if request.binary_outputs else request


def parse_envelope(decoded: str | Document | Rejection, max_instances: int) -> ParsedRequest:
    """A decoded body that must be a KServe v1 or v2 document -> its instances, or why not."""
    if isinstance(decoded, Rejection):
        return ParsedRequest(PREDICTIONS, error=decoded)
    document = decoded.value if isinstance(decoded, Document) else None
    if isinstance(document, Mapping) and "instances" in document:
        return _kserve_v1(document["instances"], max_instances)
    if isinstance(document, Mapping) and "inputs" in document:
        return _kserve_v2(document, max_instances)
    message = 'this route takes {"instances": [...]} (v1) or {"inputs": [...]} (Open Inference Protocol)'
    return ParsedRequest(PREDICTIONS, error=rejection.malformed_request("KServe", message))


def _binary_envelope(
    item: Any, headers: Mapping[str, Any] | None, header_length: str, max_bytes: int, max_instances: int
) -> ParsedRequest:
    """A v2 request in the binary tensor extension: its JSON header with the binary inputs' texts written in."""

    def malformed(message: str) -> ParsedRequest:
        return ParsedRequest(KSERVE_V2, error=rejection.malformed_request("Open Inference Protocol", message))

    _, value = payload_of(item, headers, ROUTE_KSERVE)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return malformed(f"{HEADER_LENGTH} was sent, but the body did not arrive as bytes")
    raw = bytes(value)
    if len(raw) > max_bytes:  # the limit counts what the client sent, before any decoding work
        return ParsedRequest(KSERVE_V2, error=rejection.payload_too_large(len(raw), max_bytes))
    parts = split_body(raw, header_length)
    if isinstance(parts, str):
        return malformed(parts)
    header, binary = parts
    decoded = decode_request(
        {"body": header}, {"content-type": "application/json"}, max_bytes, route=ROUTE_KSERVE, as_json=True
    )
    if isinstance(decoded, Rejection):
        return ParsedRequest(KSERVE_V2, error=decoded)
    document = inline_binary_inputs(decoded.value if isinstance(decoded, Document) else decoded, binary)
    if isinstance(document, str):
        return malformed(document)
    return parse_envelope(Document(document), max_instances)


# ---- reading --------------------------------------------------------------------------------------


def parse_request(decoded: str | Document | Rejection, max_instances: int) -> ParsedRequest:
    """A decoded body (handlers/decoding.py) -> its format and instances."""
    if isinstance(decoded, Rejection):
        return ParsedRequest(PREDICTIONS, error=decoded)
    if isinstance(decoded, str):
        return ParsedRequest(PREDICTIONS, (decoded,))
    document = decoded.value
    if isinstance(document, Mapping) and TEXT_FIELD not in document:
        if "instances" in document:
            return _kserve_v1(document["instances"], max_instances)
        if "inputs" in document:
            return _kserve_v2(document, max_instances)
    text = text_from_json(document)
    if isinstance(text, Rejection):
        return ParsedRequest(PREDICTIONS, error=text)
    return ParsedRequest(PREDICTIONS, (text,))


def _kserve_v1(instances: Any, max_instances: int) -> ParsedRequest:
    def malformed(message: str) -> ParsedRequest:
        return ParsedRequest(KSERVE_V1, error=rejection.malformed_request("KServe v1", message))

    if not isinstance(instances, list):
        return malformed(f"'instances' must be an array, got {json_type_name(instances)}")
    if not instances:
        return malformed("'instances' is empty")
    if len(instances) > max_instances:
        return ParsedRequest(KSERVE_V1, error=rejection.too_many_instances(len(instances), max_instances))
    return ParsedRequest(KSERVE_V1, tuple(_v1_instance(instance) for instance in instances))


def _v1_instance(instance: Any) -> Instance | Rejection:
    if isinstance(instance, str):
        return instance
    if isinstance(instance, Mapping):
        return text_from_json(instance)
    return rejection.wrong_type("instance", json_type_name(instance) + ' (expected a string or {"text": ...})')


def _kserve_v2(document: Mapping[str, Any], max_instances: int) -> ParsedRequest:
    request_id = document.get("id")

    def malformed(message: str) -> ParsedRequest:
        error = rejection.malformed_request("Open Inference Protocol", message)
        return ParsedRequest(KSERVE_V2, error=error, request_id=request_id)

    # The protocol's `id` is a string, echoed in the answer: anything else is not echoed, but refused (a lone
    # surrogate, valid JSON, could not be written back as UTF-8).
    if request_id is not None and not _unicode_string(request_id):
        problem = (
            "'id' is not valid Unicode (a lone surrogate)"
            if isinstance(request_id, str)
            else f"'id' must be a string, got {json_type_name(request_id)}"
        )
        error = rejection.malformed_request("Open Inference Protocol", problem)
        return ParsedRequest(KSERVE_V2, error=error)

    inputs = document["inputs"]
    if not isinstance(inputs, list) or not inputs:
        got = "" if isinstance(inputs, list) else f", got {json_type_name(inputs)}"
        return malformed(f"'inputs' must be a non-empty array of input tensors{got}{_plain_texts_hint(inputs)}")
    if len(inputs) > 2:
        return malformed(f"expected one input tensor of texts (or two: {TEXT_FIELD!r} and {PAIR_FIELD!r}), "
                         f"got {len(inputs)}")  # fmt: skip
    columns = []
    for index, tensor in enumerate(inputs):
        column = _v2_texts(tensor, index)
        if isinstance(column, str):
            return malformed(column + _plain_texts_hint(inputs))
        columns.append(column)
    text_input = 0
    if len(inputs) == 1:
        # Any name serves for a lone input of texts, but not the pair's second one: as JSON and forms refuse a
        # `text_pair` without its `text`, rather than classify the second text as if it were the first.
        if inputs[0].get("name") == PAIR_FIELD:
            return malformed(f"an input named {PAIR_FIELD!r} is the second text of a pair: send the first as an "
                             f"input named {TEXT_FIELD!r} beside it")  # fmt: skip
        data = columns[0]
    else:
        names = [tensor["name"] for tensor in inputs]
        if not all(isinstance(name, str) for name in names) or sorted(names) != sorted((TEXT_FIELD, PAIR_FIELD)):
            return malformed(f"two input tensors must be named {TEXT_FIELD!r} and {PAIR_FIELD!r}, got {names!r}")
        if len(columns[0]) != len(columns[1]):
            return malformed(f"{TEXT_FIELD!r} has {len(columns[0])} texts and {PAIR_FIELD!r} {len(columns[1])}")
        text_input = names.index(TEXT_FIELD)
        texts, pairs = columns[text_input], columns[1 - text_input]
        data = [TextPair(text, pair) for text, pair in zip(texts, pairs)]
    asked = _v2_outputs(document.get("outputs"), document.get("parameters"))
    if isinstance(asked, str):
        return malformed(asked)
    outputs, binary_outputs = asked
    if len(data) > max_instances:
        error = rejection.too_many_instances(len(data), max_instances)
        return ParsedRequest(KSERVE_V2, error=error, request_id=request_id)
    return ParsedRequest(
        KSERVE_V2, tuple(data), request_id=request_id, text_input=text_input, outputs=outputs,
        binary_outputs=binary_outputs,
    )  # fmt: skip


def _v2_outputs(requested: Any, parameters: Any) -> tuple[tuple[str, ...], tuple[str, ...]] | str:
    """The output tensors a v2 request asks for (`outputs`, optional: all when absent) and those of them it asks
    for as binary, or what is wrong.

    The binary data extension's flags: an output's `parameters.binary_data` says whether it comes back binary; one
    that does not say follows the request's `parameters.binary_data_output` (JSON when neither says). tritonclient
    sets the first on every output it names (True by default) and the second when it names none."""
    every = _flag(parameters, "binary_data_output", "parameters")
    if isinstance(every, str):
        return every
    if requested is None or requested == []:  # none named: every one, as Triton answers
        return V2_OUTPUTS, V2_OUTPUTS if every else ()
    if not isinstance(requested, list):
        return f"'outputs' must be an array of {{\"name\": ...}}, got {json_type_name(requested)}"
    names, binary = [], set()
    for index, tensor in enumerate(requested):
        if not isinstance(tensor, Mapping):
            return f"outputs[{index}] must be an object with a 'name', got {json_type_name(tensor)}"
        if tensor.get("name") not in V2_OUTPUTS:
            return f"outputs[{index}].name must be one of {', '.join(V2_OUTPUTS)}, got {tensor.get('name')!r}"
        own = _flag(tensor.get("parameters"), "binary_data", f"outputs[{index}].parameters")
        if isinstance(own, str):
            return own
        if (tensor.get("parameters") or {}).get("classification") is not None:
            # The classification extension (tritonclient's class_count) asks for the top k classes as strings in
            # place of the tensor; answering the tensor instead would hand the client another shape than it reads.
            return (
                f"outputs[{index}].parameters.classification is not supported: ask for the "
                f"'label', 'score' or 'probabilities' output, each class's probability by name"
            )
        names.append(tensor["name"])
        if own or (own is None and every):  # named twice, once as binary: binary (the client can read that)
            binary.add(tensor["name"])
    return tuple(name for name in V2_OUTPUTS if name in names), tuple(name for name in V2_OUTPUTS if name in binary)


def _flag(parameters: Any, key: str, where: str) -> bool | str | None:
    """A boolean flag of a `parameters` object: True, False, None when not given, or what is wrong (a message).

    A flag that is not a boolean is refused rather than guessed: either guess could answer the client in an
    encoding it does not read."""
    if parameters is None:
        return None
    if not isinstance(parameters, Mapping):
        return f"{where} must be an object, got {json_type_name(parameters)}"
    value = parameters.get(key)
    if value is None or isinstance(value, bool):
        return value
    return f"{where}.{key} must be a boolean, got {json_type_name(value)}"


def _plain_texts_hint(inputs: Any) -> str:
    """Where `inputs` holds texts themselves (Hugging Face's {"inputs": "..."}, the habit of its endpoints), the
    formats that take texts as they are; else nothing."""
    if isinstance(inputs, str) or (isinstance(inputs, list) and all(isinstance(value, str) for value in inputs)):
        return '; to send texts as they are: {"text": "..."} on /predictions, or {"instances": ["..."]} (KServe v1)'
    return ""


def _v2_texts(tensor: Any, index: int) -> list[str] | str:
    """One v2 input tensor's texts, or what is wrong with it (a message)."""
    where = f"inputs[{index}]"
    if not isinstance(tensor, Mapping):
        return f"{where} must be an object, got {json_type_name(tensor)}"
    missing = [key for key in ("name", "datatype", "shape", "data") if key not in tensor]
    if missing:
        return f"{where} has no {', '.join(repr(m) for m in missing)}"
    if tensor["datatype"] != "BYTES":
        return f'{where}.datatype must be "BYTES" (texts), got {tensor["datatype"]!r}'
    data, shape = tensor["data"], tensor["shape"]
    if not isinstance(data, list) or not data:
        return f"{where}.data must be a non-empty array of strings"
    if any(isinstance(value, list) for value in data):
        # The protocol lets a tensor's data come nested as its shape, [[t0], [t1]] for [N, 1], or flat.
        if shape != [len(data), 1] or not all(isinstance(row, list) and len(row) == 1 for row in data):
            return f"{where}.data nested does not match shape {shape!r} (expected [[text], [text], ...] for [N, 1])"
        data = [row[0] for row in data]
    if not _shape_holds(shape, len(data)):
        return f"{where}.shape {shape!r} does not match {len(data)} data elements (expected [{len(data)}])"
    for position, value in enumerate(data):
        if not isinstance(value, str):
            return f"{where}.data[{position}] must be a string, got {json_type_name(value)}"
    return data


def _unicode_string(value: Any) -> bool:
    """A str that UTF-8 can hold (no lone surrogate)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shape_holds(shape: Any, count: int) -> bool:
    """[N], or [N, 1] as some clients send a column of texts."""
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return False
    return shape == [count] or shape == [count, 1]


def json_type_name(value: Any) -> str:
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


def text_from_json(document: Any) -> Instance | Rejection:
    """Pick the text, and the second text of a pair where there is one, out of a parsed JSON document;
    other fields are ignored."""
    if not isinstance(document, Mapping):
        return rejection.not_an_object(json_type_name(document))
    if TEXT_FIELD not in document:
        return rejection.missing_field(TEXT_FIELD)
    text = document[TEXT_FIELD]
    if not isinstance(text, str):
        return rejection.wrong_type(TEXT_FIELD, json_type_name(text))
    if PAIR_FIELD not in document:
        return text
    pair = document[PAIR_FIELD]
    if not isinstance(pair, str):
        return rejection.wrong_type(PAIR_FIELD, json_type_name(pair))
    return TextPair(text, pair)
