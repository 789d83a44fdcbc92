"""KServe v2's binary tensor extension (handlers/binary_tensors.py), read from the bytes tritonclient itself makes.

tritonclient.http sends binary inputs by default; `InferenceServerClient.generate_request_body` is the very
function its `infer` sends through, so these bodies are the client's own. Every malformed framing is a
400 for the request, never an exception.
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

from handlers.binary_tensors import byte_elements, inline_binary_inputs, split_body
from handlers.instances import TextPair
from handlers.protocols import KSERVE_V2, read_request
from tests.request_shapes import raw_body

LIMIT = 64 * 1024
INSTANCES = 64


def tritonclient_body(columns: dict[str, list[str]], binary: bool = True) -> tuple[bytes, int | None]:
    """The body tritonclient.http's infer sends for these BYTES inputs, and its JSON header's length (None: JSON)."""
    inputs = []
    for name, texts in columns.items():
        tensor = triton.InferInput(name, [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
        inputs.append(tensor)
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, request_id="r7")
    return (body.encode() if isinstance(body, str) else body), json_size


def read_on_the_kserve_route(body: bytes, json_size: int | None):
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
    for body, size in ((b"{}" + b"tail", 2), (b'{"inputs": 3}', 13)):
        parsed = read_on_the_kserve_route(body, size)
        assert parsed.error is not None and parsed.error.status == 400, body


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
