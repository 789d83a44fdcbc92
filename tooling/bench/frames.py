"""Frames as TorchServe's frontend sends them to a Python worker, and the worker's reading of them timed.

The encoding follows the frame format ts/protocol/otf_message_handler.py documents field by field (the
frontend writes it in Java). tests/unit/test_frame_reader.py decodes such frames with TorchServe's reader and
with handlers/frame_reader.py; `reading_speed` times the two over a real socket.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import statistics
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

END = struct.pack("!i", -1)


def sized(value: bytes) -> bytes:
    return struct.pack("!i", len(value)) + value


@dataclass(frozen=True)
class Request:
    request_id: bytes
    headers: list[tuple[bytes, bytes]]
    parameters: list[tuple[bytes, bytes, bytes]]  # name, content type, value

    def frame(self) -> bytes:
        headers = b"".join(sized(name) + sized(value) for name, value in self.headers)
        parameters = b"".join(sized(n) + sized(ct) + sized(v) for n, ct, v in self.parameters)
        return sized(self.request_id) + headers + END + parameters + END


def inference_frame(requests: Sequence[Request]) -> bytes:
    return b"I" + b"".join(r.frame() for r in requests) + END


def load_frame(name: bytes, path: bytes, batch_size: int, handler: bytes, gpu: int, envelope: bytes) -> bytes:
    return (b"L" + sized(name) + sized(path) + struct.pack("!i", batch_size) + sized(handler)
            + struct.pack("!i", gpu) + sized(envelope) + struct.pack("!?", False))  # fmt: skip


def stock_reader() -> ModuleType:
    """TorchServe's otf_message_handler loaded afresh from its file: its own one-field-at-a-time reader, whatever
    this process has installed in the imported module."""
    from ts.protocol import otf_message_handler

    spec = importlib.util.spec_from_file_location("stock_otf_message_handler", otf_message_handler.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def buffered_reader() -> ModuleType:
    """The same module whose fields come from one FrameBuffer, as install_buffered_frame_reader() makes it."""
    from handlers.frame_reader import FrameBuffer

    module = stock_reader()
    module._retrieve_buffer = FrameBuffer().read
    return module


def client_request(index: int, headers: int) -> Request:
    """A /predictions request as the worker gets it: `headers` HTTP headers (the benchmark's client sends 4:
    Host, Authorization, Content-Type, Content-Length; a request through Knative or a mesh carries more)."""
    names = [b"Host", b"Authorization", b"Content-Type", b"Content-Length"]
    names += [b"X-Forwarded-Header-%d" % i for i in range(max(0, headers - len(names)))]
    body = b"The staff were rude and the room was dirty, and the breakfast was cold."
    return Request(b"%036d" % index, [(name, b"a header value of 24 bytes") for name in names[:headers]],
                   [(b"body", b"text/plain", body)])  # fmt: skip


def reading_speed(header_counts: Sequence[int], batch_size: int, rounds: int = 7, batches: int = 50) -> list[dict]:
    """Microseconds per request for a worker to read batches of `batch_size` requests off a real socket, with
    TorchServe's reader and with the buffered one, alternated round by round; the median round. Each batch's
    frame is in the socket whole before the worker reads it, as when the frontend has written a batch."""
    os.environ.setdefault("TS_DECODE_INPUT_REQUEST", "false")  # as the handler sets it in the worker
    rows = []
    for headers in header_counts:
        frame = inference_frame([client_request(i, headers) for i in range(batch_size)])
        times: dict[str, list[float]] = {"torchserve": [], "buffered": []}
        for _ in range(rounds):
            for name, make in (("torchserve", stock_reader), ("buffered", buffered_reader)):
                times[name].append(1e6 * _time_reading(make(), frame, batches) / (batches * batch_size))
        row = {"headers": headers, "batch_size": batch_size, "frame_bytes": len(frame)}
        row |= {f"{name}_us_per_request": statistics.median(t) for name, t in times.items()}
        row["speed_up"] = row["torchserve_us_per_request"] / row["buffered_us_per_request"]
        rows.append(row)
    return rows


def _time_reading(reader: ModuleType, frame: bytes, batches: int) -> float:
    worker_end, frontend_end = socket.socketpair()
    seconds = 0.0
    try:
        frontend_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * len(frame))
        if frontend_end.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < 2 * len(frame):
            # One thread writes, then reads: a frame the socket cannot hold whole would never be sent.
            raise ValueError(f"a frame of {len(frame)} bytes does not fit this system's socket buffer: "
                             "a smaller batch")  # fmt: skip
        for _ in range(batches):
            frontend_end.sendall(frame)  # the whole batch waits in the socket, as the frontend writes it
            started = time.perf_counter()
            reader.retrieve_msg(worker_end)
            seconds += time.perf_counter() - started
    finally:
        worker_end.close()
        frontend_end.close()
    return seconds
