"""The buffered frame reader (handlers/frame_reader.py) against a pristine copy of TorchServe's own reader.

Both decode the same bytes: frames written in the format the frontend sends (ts/protocol/otf_message_handler.py
documents it field by field), cut into pieces at random places, as a socket may deliver them. The stock copy is
the module loaded a second time from its file, so it keeps TorchServe's one-field-at-a-time reader whatever this
process has installed.
"""

from __future__ import annotations

import itertools
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ts.protocol import otf_message_handler

from handlers import frame_reader
from handlers.frame_reader import RECV_BYTES, FrameBuffer, install_buffered_frame_reader
from tooling.bench.frames import Request, buffered_reader, client_request, inference_frame, load_frame, stock_reader

STOCK = stock_reader()


class Pieces:
    """A connection whose recv() hands out the stream in the given pieces, never more than asked."""

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = [p for p in pieces if p]
        self.recv_calls = 0

    def recv(self, size: int) -> bytes:
        self.recv_calls += 1
        if not self._pieces:
            return b""
        piece = self._pieces[0]
        self._pieces[0] = piece[size:]
        if not self._pieces[0]:
            self._pieces.pop(0)
        return piece[:size]


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


def read_all(module, connection, frames: int) -> list:
    return [module.retrieve_msg(connection) for _ in range(frames)]


@pytest.fixture(autouse=True, scope="module")
def bodies_stay_bytes():
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TS_DECODE_INPUT_REQUEST", "false")  # as the handler sets it in the worker
        yield


blob = st.binary(max_size=40)
requests = st.lists(
    st.builds(
        Request,
        request_id=st.binary(min_size=1, max_size=36),
        headers=st.lists(st.tuples(blob, blob), max_size=12),
        parameters=st.lists(
            st.tuples(
                st.sampled_from([b"body", b"data", b"text"]),
                st.sampled_from([b"application/json", b"text/plain", b"application/octet-stream", b""]),
                st.one_of(st.binary(max_size=300), st.just(b"x" * (RECV_BYTES + 17))),
            ),
            max_size=3,
        ),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(requests, min_size=1, max_size=3), points=st.lists(st.integers(min_value=0), max_size=40))
def test_every_batch_reads_as_torchserves_own_reader_reads_it_however_the_bytes_arrive(batches, points):
    stream = load_frame(b"bert", b"/models/bert", 128, b"handler.py", 0, b"") + b"".join(map(inference_frame, batches))
    pieces = cut(stream, points)
    ours = read_all(buffered_reader(), Pieces(pieces), 1 + len(batches))
    theirs = read_all(STOCK, Pieces(pieces), 1 + len(batches))
    assert ours == theirs
    assert [len(msg) for cmd, msg in ours[1:]] == [len(b) for b in batches]
    assert all(type(r["requestId"]) is bytearray for _, msg in ours[1:] for r in msg)  # what the handler got before


def test_a_batch_whole_in_the_socket_takes_one_recv_where_torchserve_takes_one_per_field():
    batch = [client_request(i, headers=4) for i in range(128)]
    stream = inference_frame(batch)
    assert len(stream) < RECV_BYTES
    ours, theirs = Pieces([stream]), Pieces([stream])
    assert buffered_reader().retrieve_msg(ours) == STOCK.retrieve_msg(theirs)
    assert ours.recv_calls == 1
    assert theirs.recv_calls == 1 + 128 * (2 + 4 * 4 + 1 + 6 + 1) + 1


def test_frames_across_a_real_socket_back_to_back_and_larger_than_one_recv():
    big = Request(b"big", [(b"Content-Type", b"application/octet-stream")], [(b"body", b"", bytes(range(256)) * 1000)])
    small = Request(b"small", [], [(b"body", b"text/plain", b"fine")])
    stream = inference_frame([small, big, small]) + inference_frame([small])
    reader_end, writer_end = socket.socketpair()
    writer = threading.Thread(target=writer_end.sendall, args=(stream,))
    writer.start()
    try:
        first, second = read_all(buffered_reader(), reader_end, 2)
    finally:
        writer.join()
        reader_end.close()
        writer_end.close()
    assert first == STOCK.retrieve_msg(Pieces([stream]))
    assert [r["requestId"] for r in first[1]] == [b"small", b"big", b"small"]
    assert first[1][1]["parameters"][0]["value"] == bytes(range(256)) * 1000
    assert second[1][0]["parameters"][0]["value"] == b"fine"


def test_a_frontend_gone_mid_frame_ends_the_worker_quietly_as_torchserves_reader_does():
    stream = inference_frame([Request(b"r", [(b"a", b"b")], [(b"body", b"text/plain", b"cut short")])])
    for module in (buffered_reader(), STOCK):
        with pytest.raises(SystemExit) as ended:
            module.retrieve_msg(Pieces([stream[:-9]]))
        assert ended.value.code == 0


def test_installed_once_for_the_checked_torchserve_and_never_for_another(monkeypatch):
    monkeypatch.setattr(otf_message_handler, "_retrieve_buffer", STOCK._retrieve_buffer)  # restored after the test
    monkeypatch.setattr("ts.version.__version__", "0.13.0")
    assert install_buffered_frame_reader() is False
    assert otf_message_handler._retrieve_buffer is STOCK._retrieve_buffer

    monkeypatch.setattr("ts.version.__version__", next(iter(frame_reader.CHECKED_VERSIONS)))
    assert install_buffered_frame_reader() is True
    installed = otf_message_handler._retrieve_buffer
    assert isinstance(installed.__self__, FrameBuffer)
    assert install_buffered_frame_reader() is True
    assert otf_message_handler._retrieve_buffer is installed  # a second load keeps the buffer it has


def test_a_new_connection_starts_with_nothing_left_over_from_the_last():
    module = buffered_reader()
    first, second = inference_frame([Request(b"one", [], [])]), inference_frame([Request(b"two", [], [])])
    old = Pieces([first + second[:5]])  # the next frame's first bytes arrived with this one, then the frontend left
    assert module.retrieve_msg(old)[1][0]["requestId"] == b"one"
    assert module.retrieve_msg(Pieces([second]))[1][0]["requestId"] == b"two"


def test_the_benchmark_times_both_readers_on_the_same_batches(tmp_path, capsys):
    from scripts.benchmark import main

    assert main(["--frame-reading", "--batch-size", "4", "--out", str(tmp_path)]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    body = [[cell.strip() for cell in row] for row in rows[1:]]  # under the header (its rule starts "|-")
    assert [row[:2] for row in body] == [["4", "4"], ["8", "4"], ["16", "4"]]
    for row in body:
        assert float(row[3]) > 0 and float(row[4]) > 0
        # The speed-up is the ratio of the two timings printed beside it (each rounded to 0.1 us).
        assert float(row[5].removesuffix("x")) == pytest.approx(float(row[3]) / float(row[4]), rel=0.05)
