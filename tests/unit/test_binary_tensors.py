"""KServe v2's binary tensor extension (handlers/binary_tensors.py), read from the bytes tritonclient itself makes,
and answered in the layout its own result parser (and KServe's) reads.

tritonclient.http sends binary inputs, and asks for binary outputs, by default;
`InferenceServerClient.generate_request_body` is the very function its `infer` sends through, so these bodies
are the client's own, and `InferResult.from_response_body` the parser its `infer` reads the answer with. Every
malformed framing is a 400 for the request, never an exception.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as triton
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.utils import serialize_byte_tensor

from handlers.binary_tensors import byte_elements, inline_binary_inputs, split_body, tensor_bytes
from handlers.decoding import Document
from handlers.instances import TextPair
from handlers.protocols import KSERVE_V2, V2_OUTPUTS, parse_request, read_request
from handlers.rejection import Rejection
from handlers.responses import (
    BINARY_CONTENT,
    JSON_CONTENT,
    ModelIdentity,
    Prediction,
    encode_answer,
    error_answer,
    success_answer,
    to_json,
)
from tests.request_shapes import raw_body

LIMIT = 64 * 1024
INSTANCES = 64


def tritonclient_body(
    columns: dict[str, list[str]], binary: bool = True, outputs: list | None = None
) -> tuple[bytes, int | None]:
    """The body tritonclient.http's infer sends for these BYTES inputs (and requested outputs: None, its default,
    asks for every output as binary), and its JSON header's length (None: all JSON)."""
    inputs = []
    for name, texts in columns.items():
        tensor = triton.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
        inputs.append(tensor)
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs, request_id="r7")
    return (body.encode() if isinstance(body, str) else body), json_size


def read_on_the_kserve_route(body: bytes, json_size: int | str | None):
    item, headers = raw_body(body)  # tritonclient sends no Content-Type
    headers = {key: value for key, value in headers.items() if key != "url_path"}  # the KServe route: `explain` only
    headers.pop("Content-Type", None)
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return read_request(item, headers, LIMIT, INSTANCES)


encodable = st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=40), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(column=encodable)
def test_any_texts_tritonclient_serializes_read_back_as_they_were(column):
    raw = serialize_byte_tensor(np.array([t.encode() for t in column], dtype=object)).item()  # a 0-d array of bytes
    assert byte_elements(raw) == column


@settings(max_examples=60, deadline=None)
@given(column=encodable, binary=st.booleans())
def test_a_tritonclient_request_reads_the_same_in_binary_and_in_json(column, binary):
    request = read_on_the_kserve_route(*tritonclient_body({"text": column}, binary))
    assert (request.protocol, request.error, request.instances, request.request_id) == (
        KSERVE_V2, None, tuple(column), "r7",
    )  # fmt: skip


def test_pairs_travel_as_two_binary_inputs():
    request = read_on_the_kserve_route(*tritonclient_body({"text": ["q1", "q2"], "text_pair": ["p1", "p2"]}))
    assert request.instances == (TextPair("q1", "p1"), TextPair("q2", "p2"))


def test_json_and_binary_inputs_mix_in_one_request():
    body, json_size = tritonclient_body({"text": ["q1", "q2"]}, binary=True)
    header = json.loads(body[:json_size])
    header["inputs"].append({"name": "text_pair", "datatype": "BYTES", "shape": [2], "data": ["p1", "p2"]})
    new_header = json.dumps(header).encode()
    request = read_on_the_kserve_route(new_header + body[json_size:], len(new_header))
    assert request.instances == (TextPair("q1", "p1"), TextPair("q2", "p2"))


def element(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


@pytest.mark.parametrize(
    ("blob", "fragment"),
    [
        (element(b"ok") + b"\x05\x00", "element 1 has a cut length prefix"),
        (element(b"ok") + struct.pack("<I", 9) + b"abc", "element 1 says 9 bytes, past the end"),
        (element(b"caf\xe9"), "element 0 is not valid UTF-8 (byte 3)"),
    ],
)
def test_broken_element_framing_is_named(blob, fragment):
    assert fragment in byte_elements(blob)
    # Sent as a request's input, the same framing is that request's 400, naming the input and the element.
    tensor = {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(blob)}}
    header = json.dumps({"inputs": [tensor]}).encode()
    parsed = read_on_the_kserve_route(header + blob, len(header))
    assert parsed.error is not None and parsed.error.status == 400
    assert f"inputs[0]: {fragment}" in parsed.error.message


def test_sizes_that_do_not_add_up_are_refused_as_a_whole_request():
    one = element(b"a text")
    request = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 99}}]}
    assert "past the 10 bytes" in inline_binary_inputs(request, one)
    request["inputs"][0]["parameters"]["binary_data_size"] = len(one)
    assert "4 bytes of binary data beyond" in inline_binary_inputs(request, one + b"\0\0\0\0")
    request["inputs"][0]["datatype"] = "FP32"
    assert 'datatype must be "BYTES"' in inline_binary_inputs(request, one)
    assert "not a length" in split_body(b"{}", "12")
    assert "not a length" in split_body(b"{}", "-1")
    assert "not a length" in split_body(b"{}", "²")  # a digit to str.isdigit, not to int()
    assert "not a length" in split_body(b"{}", "1" + "0" * 5000)  # absurd: refused before int() is asked
    for body, size in ((b"{}" + b"tail", 2), (b'{"inputs": 3}', 13)):
        parsed = read_on_the_kserve_route(body, size)
        assert parsed.error is not None and parsed.error.status == 400, body


def test_bytes_no_input_reads_and_texts_sent_both_ways_are_refused_not_guessed():
    """A v1 body, or a v2 one without inputs, followed by binary data would have the bytes dropped unread; an input
    with both `data` and `binary_data_size` leaves which texts to classify open (KServe reads one, Triton the
    other). Each is a 400 for that request."""
    one = element(b"a text")
    v1 = json.dumps({"instances": ["a text"]}).encode()
    parsed = read_on_the_kserve_route(v1 + one, len(v1))
    assert parsed.error is not None and parsed.error.status == 400 and "not a v2 request" in parsed.error.message
    assert read_on_the_kserve_route(v1, len(v1)).instances == ("a text",)  # no bytes after it: read as v1
    both = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["other"]}
    both["parameters"] = {"binary_data_size": len(one)}
    assert "both 'data' and parameters.binary_data_size" in inline_binary_inputs({"inputs": [both]}, one)


def test_a_binary_body_over_the_size_limit_is_413_before_any_decoding():
    body, json_size = tritonclient_body({"text": ["x" * LIMIT]})
    request = read_on_the_kserve_route(body, json_size)
    assert (request.error.status, request.error.type) == (413, "PayloadTooLarge")


@settings(max_examples=300, deadline=None)
@given(
    header=st.one_of(st.binary(max_size=200), st.builds(lambda d: json.dumps(d).encode(), st.fixed_dictionaries({
        "inputs": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["text", "text_pair"]),
                                                  "datatype": st.sampled_from(["BYTES", "FP32"]),
                                                  "shape": st.lists(st.integers(-1, 4), max_size=2),
                                                  "parameters": st.fixed_dictionaries({"binary_data_size":
                                                      st.one_of(st.integers(-2, 40), st.text(max_size=3))})}),
                           max_size=3)}))),
    tail=st.binary(max_size=80),
    length=st.one_of(st.none(), st.text(max_size=6)),
)  # fmt: skip
def test_any_binary_request_is_read_or_refused_with_a_4xx_never_raised(header, tail, length):
    # `length` None: the header's true length; else any value a client might send.
    declared = str(len(header)) if length is None else length
    item, headers = raw_body(header + tail)
    headers = {key: value for key, value in headers.items() if key != "url_path"}
    headers["Inference-Header-Content-Length"] = declared
    as_json = read_on_the_kserve_route(header + tail, None)  # the same bytes with no extension header
    for parsed in (as_json, read_request(item, headers, LIMIT, INSTANCES)):
        if parsed.error is not None:
            assert 400 <= parsed.error.status < 500 and parsed.error.message
        else:
            assert parsed.instances and all(isinstance(i, (str, TextPair)) or i.status < 500 for i in parsed.instances)


def test_a_header_length_with_leading_zeros_is_that_length():
    """`0104` is 104: a client (or a proxy) that pads the number is still framing the body right."""
    body, json_size = tritonclient_body({"text": ["a text", "another"]})
    padded = str(json_size).zfill(len(str(len(body))) + 1)  # one digit more than the body's length has
    assert padded.startswith("0") and int(padded) == json_size
    assert split_body(body, padded) == (body[:json_size], body[json_size:])
    assert split_body(body, "0" * 5000 + str(json_size)) == (body[:json_size], body[json_size:])
    request = read_on_the_kserve_route(body, padded)
    assert (request.error, request.instances) == (None, ("a text", "another"))
    assert split_body(b"{}", "003") == "inference-header-content-length is '003', not a length within the 2-byte body"


# ---- answers: the outputs asked for as binary come back binary ------------------------------------------------

LABELS = ("negative", "positive")
PREDICTIONS = [Prediction([0.875, 0.125], False), Prediction([0.25, 0.75], True)]
MODEL = ModelIdentity("bert", "1.0")


def answer_to(body: bytes, json_size: int | None):
    """What the handler answers a tritonclient request with two texts: (its request, the answer's encoding)."""
    request = read_on_the_kserve_route(body, json_size)
    assert request.error is None, request.error
    return request, encode_answer(success_answer(request, PREDICTIONS, LABELS, MODEL))


def tritonclient_result(encoded) -> triton.InferResult:
    """The answer as tritonclient.http's infer reads it: framed by the header, if there is one."""
    headers = dict(encoded.headers)
    length = headers.get("Inference-Header-Content-Length")
    return triton.InferResult.from_response_body(encoded.body, header_length=None if length is None else int(length))


def test_tritonclients_default_binary_outputs_come_back_in_the_extensions_layout():
    """`infer(outputs=None)` sends `parameters.binary_data_output: true`: every output is binary. The JSON header
    gives each output's `binary_data_size` in place of `data`, and its bytes follow in the order of `outputs`."""
    request, encoded = answer_to(*tritonclient_body({"text": ["a", "b"]}))
    assert request.binary_outputs == V2_OUTPUTS
    assert encoded.content_type == BINARY_CONTENT
    [(name, value)] = encoded.headers
    assert name.lower() == "inference-header-content-length"
    header = json.loads(encoded.body[: int(value)])
    assert header["model_name"] == "bert" and header["id"] == "r7"
    assert [(o["name"], o["datatype"], o["shape"]) for o in header["outputs"]] == [
        ("label", "BYTES", [2]), ("score", "FP32", [2]), ("probabilities", "FP32", [2, 2]), ("truncated", "BOOL", [2]),
    ]  # fmt: skip
    assert not [o for o in header["outputs"] if "data" in o]
    # The layout, byte for byte: BYTES length-prefixed little-endian, FP32 little-endian, BOOL one byte each.
    tail = (
        element(b"negative") + element(b"positive")
        + struct.pack("<2f", 0.875, 0.75)
        + struct.pack("<4f", 0.875, 0.125, 0.25, 0.75)
        + b"\x00\x01"
    )  # fmt: skip
    assert encoded.body[int(value) :] == tail
    assert [o["parameters"] for o in header["outputs"]] == [{"binary_data_size": n} for n in (24, 8, 16, 2)]
    # And as the client reads it: bytes for BYTES, as Triton answers.
    result = tritonclient_result(encoded)
    assert result.as_numpy("label").tolist() == [b"negative", b"positive"]
    assert result.as_numpy("score").tolist() == [0.875, 0.75]
    assert result.as_numpy("probabilities").tolist() == [[0.875, 0.125], [0.25, 0.75]]
    assert result.as_numpy("truncated").tolist() == [False, True]


def test_kserves_own_parser_reads_a_binary_answer():
    kserve = pytest.importorskip("kserve.protocol.infer_type")
    _, encoded = answer_to(*tritonclient_body({"text": ["a", "b"]}))
    response = kserve.InferResponse.from_bytes(
        encoded.body, int(dict(encoded.headers)["Inference-Header-Content-Length"])
    )
    outputs = {output.name: output.as_numpy().tolist() for output in response.outputs}
    assert outputs["score"] == [0.875, 0.75] and outputs["truncated"] == [False, True]
    assert outputs["probabilities"] == [[0.875, 0.125], [0.25, 0.75]]
    assert outputs["label"] == ["negative", "positive"]  # the SDK turns a binary BYTES output into its texts


def test_only_the_outputs_asked_for_as_binary_are_binary():
    """An output's own `binary_data` overrides the request's `binary_data_output`; one that says nothing follows it."""
    outputs = [triton.InferRequestedOutput("label", binary_data=False), triton.InferRequestedOutput("score")]
    request, encoded = answer_to(*tritonclient_body({"text": ["a", "b"]}, outputs=outputs))
    assert (request.outputs, request.binary_outputs) == (("label", "score"), ("score",))
    result = tritonclient_result(encoded)
    assert result.as_numpy("label").tolist() == ["negative", "positive"]  # JSON: str, as tritonclient reads JSON
    assert result.as_numpy("score").tolist() == [0.875, 0.75]
    assert result.get_output("label")["data"] == ["negative", "positive"]
    assert result.get_output("score")["parameters"] == {"binary_data_size": 8}

    document = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "label", "parameters": {"binary_data": False}}, {"name": "score"}, {"name": "truncated"}],
    }
    assert parse_request(Document(document), INSTANCES).binary_outputs == ("score", "truncated")
    document["parameters"]["binary_data_output"] = False
    document["outputs"][2]["parameters"] = {"binary_data": True}
    assert parse_request(Document(document), INSTANCES).binary_outputs == ("truncated",)


def test_an_answer_not_asking_for_binary_stays_json_exactly():
    outputs = [triton.InferRequestedOutput(name, binary_data=False) for name in ("label", "score")]
    for body in (tritonclient_body({"text": ["a", "b"]}, binary=True, outputs=outputs),
                 (json.dumps({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]})
                  .encode(), None)):  # fmt: skip
        request, encoded = answer_to(*body)
        answer = success_answer(request, PREDICTIONS, LABELS, MODEL)
        assert request.binary_outputs == () and answer.binary_outputs == ()
        assert (encoded.body, encoded.content_type, encoded.headers) == (
            to_json(answer.body).encode(), JSON_CONTENT, ()
        )  # fmt: skip
        assert tritonclient_result(encoded).as_numpy("label").tolist() == ["negative", "positive"]


def test_an_error_to_a_request_asking_for_binary_is_json():
    request = read_on_the_kserve_route(*tritonclient_body({"text": ["a", "b"]}))
    encoded = encode_answer(error_answer(request, 1, Rejection(400, "EmptyText", "text is empty")))
    assert (encoded.content_type, encoded.headers) == (JSON_CONTENT, ())
    assert json.loads(encoded.body)["error"] == "inputs[0].data[1]: text is empty"


def test_what_the_binary_form_cannot_hold_is_a_value_error():
    """ValueError, which the handler turns into that one request's 500 (tests/inprocess/test_handler.py)."""
    for datatype, data in (("FP32", [1e39]), ("BYTES", ["\ud800"]), ("INT8", [1])):
        with pytest.raises(ValueError):
            tensor_bytes(datatype, data)
    assert tensor_bytes("FP32", [float("nan")])[:4] == struct.pack("<f", float("nan"))  # FP32 holds a NaN


def test_over_grpc_binary_outputs_are_answered_in_json_since_the_reply_carries_no_headers():
    """TorchServe's gRPC API reaches the handler with no route header and keeps only a reply's body: a binary answer
    there would have no Inference-Header-Content-Length to split it by. The same v2 document asking for binary
    outputs is answered binary on the KServe route and in JSON over gRPC."""
    document = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}
    body = json.dumps({**document, "parameters": {"binary_data_output": True}}).encode()
    kserve = read_request({"body": body}, {"explain": "False"}, 1 << 20, INSTANCES)
    grpc = read_request({"body": body}, {}, 1 << 20, INSTANCES)
    assert kserve.protocol == grpc.protocol == KSERVE_V2
    assert kserve.binary_outputs == V2_OUTPUTS and grpc.binary_outputs == ()
