"""KServe v2's binary tensor extension, both ways: the JSON header, then each tensor's bytes. Pure and torch-free.

On the way in, `tritonclient.http` sends its inputs this way by default (`set_data_from_numpy(..., binary_data=True)`):
the body is the JSON inference request, `Inference-Header-Content-Length` bytes long, followed by the raw tensor
data of each input that names its size in `parameters.binary_data_size`, in the order of `inputs`. A BYTES
tensor's data is its elements one after another, each a 4-byte little-endian length and then that many bytes
(tritonclient.utils.serialize_byte_tensor; the Open Inference Protocol's binary data extension). Here each
such input gets its texts as a JSON `data` array, so handlers/protocols.py reads one kind of document whatever
the client chose.

On the way out, an output the request asks for as binary (its `parameters.binary_data`, or the request's
`parameters.binary_data_output`: tritonclient's default again) must come back so: `tensor_bytes` writes its
data, and handlers/responses.encode_answer lays out the answer around it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

HEADER_LENGTH = "inference-header-content-length"
# How the answer's header is spelled: Triton's spelling (clients read it in any case; HTTP headers have none).
RESPONSE_HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_SIZE = "binary_data_size"
_LENGTH = struct.Struct("<I")


def split_body(raw: bytes, header_length: str) -> tuple[bytes, bytes] | str:
    """(JSON header, binary data) of a body whose header is `header_length` bytes long, or what is wrong."""
    length = header_length.strip()
    # ASCII digits only (str.isdigit also takes "²", which int() refuses). Leading zeros are still the same length
    # ("0104"), so they are dropped before counting: no more significant digits than the body's own length has,
    # since int() refuses strings of over 4,300 digits, and an absurd length is no length within the body anyway.
    digits = length.lstrip("0") or "0"
    if not (length.isascii() and length.isdigit()) or len(digits) > len(str(len(raw))) or int(digits) > len(raw):
        return f"{HEADER_LENGTH} is {header_length!r}, not a length within the {len(raw)}-byte body"
    return raw[: int(digits)], raw[int(digits) :]


def inline_binary_inputs(document: Any, binary: bytes) -> Any | str:
    """The request with every binary input's texts written into its `data`, or what is wrong (a message).

    Inputs without `binary_data_size` keep their JSON `data`. The sizes must account for every byte sent."""
    if not isinstance(document, Mapping) or not isinstance(document.get("inputs"), list):
        if binary:  # bytes no input claims would be dropped unread: the request is not what its sender meant
            return f"{len(binary)} bytes of binary data after a body that is not a v2 request with inputs"
        return document  # not a v2 request: protocols.py says why
    inputs, offset = [], 0
    for index, tensor in enumerate(document["inputs"]):
        parameters = tensor.get("parameters") if isinstance(tensor, Mapping) else None
        size = parameters.get(BINARY_SIZE) if isinstance(parameters, Mapping) else None
        if size is None:
            inputs.append(tensor)
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
            return f"inputs[{index}].parameters.{BINARY_SIZE} is {size!r}, past the {len(binary)} bytes of binary data"
        if tensor.get("datatype") != "BYTES":
            return f'inputs[{index}].datatype must be "BYTES" (texts), got {tensor.get("datatype")!r}'
        if tensor.get("data") is not None:  # which to classify would be a guess: KServe reads `data`, Triton the bytes
            return f"inputs[{index}] has both 'data' and parameters.{BINARY_SIZE}: send its texts one way"
        texts = byte_elements(binary[offset : offset + size])
        if isinstance(texts, str):
            return f"inputs[{index}]: {texts}"
        inputs.append({**tensor, "data": texts})
        offset += size
    if offset != len(binary):
        return f"{len(binary) - offset} bytes of binary data beyond the inputs' {BINARY_SIZE}"
    return {**document, "inputs": inputs}


def byte_elements(blob: bytes) -> list[str] | str:
    """A BYTES tensor's elements as texts (each length-prefixed, UTF-8), or what is wrong with the framing."""
    texts, offset = [], 0
    while offset < len(blob):
        if offset + _LENGTH.size > len(blob):
            return f"element {len(texts)} has a cut length prefix"
        (length,) = _LENGTH.unpack_from(blob, offset)
        start, offset = offset + _LENGTH.size, offset + _LENGTH.size + length
        if offset > len(blob):
            return f"element {len(texts)} says {length} bytes, past the end of the tensor's data"
        try:
            texts.append(blob[start:offset].decode("utf-8"))
        except UnicodeDecodeError as exc:
            return f"element {len(texts)} is not valid UTF-8 (byte {exc.start})"
    return texts


def tensor_bytes(datatype: str, data: Sequence[Any]) -> bytes:
    """A tensor's elements (flat, row-major) in the extension's binary form, as Triton writes them: BYTES each a
    4-byte little-endian length then its UTF-8, FP32 little-endian, BOOL one byte each (1 true, 0 false).

    ValueError for what cannot be written so (a string UTF-8 cannot hold, a number too large for FP32, a datatype
    this model never answers), so that the caller answers that one request 500 and its neighbours as usual."""
    try:
        if datatype == "BYTES":
            encoded = [value.encode("utf-8") for value in data]
            return b"".join(_LENGTH.pack(len(element)) + element for element in encoded)
        if datatype == "FP32":
            return struct.pack(f"<{len(data)}f", *data)
        if datatype == "BOOL":
            return bytes(1 if value else 0 for value in data)
    except (struct.error, OverflowError) as exc:
        raise ValueError(f"a {datatype} tensor that the binary form cannot hold: {exc}") from exc
    raise ValueError(f"no binary form for the datatype {datatype!r}")
