"""A buffered reader for the frames TorchServe's frontend sends its Python worker.

TorchServe 0.12's worker (ts/protocol/otf_message_handler.py) reads a batch off its socket one field
at a time: a recv() for every length and every value, so four for each HTTP header of each request,
and every one a system call from Python. Profiled in a served worker, that reading was its largest
cost outside the forward pass (48-59 us a request on a 2-core VM, docs/benchmarks.md#gpu), more than
the handler's own Python; on a GPU, where the pass is cheap, it is part of the floor on requests/s.

TorchServe is archived and 0.12.0 is its last release, so this cannot be mended upstream. The reader
keeps TorchServe's decoding and replaces the one primitive every field goes through,
`_retrieve_buffer(conn, length)`: one recv() takes what the socket holds (up to 64 KiB, or all of a
longer field) into a buffer, and the fields are cut from it. Each field is still the bytearray of
exactly `length` bytes the stock reader returns, a closed socket still ends the worker as it did, and
bytes of the next frame, should the frontend send them early, wait in the buffer for the next call.

Installed from the handler's initialize(), in the worker's own process, once its model has loaded:
the frontend sends nothing between the load answer and the first batch, so no frame is half-read
when the reader changes. Only for TorchServe versions whose reader it was checked against.
"""

from __future__ import annotations

import logging
import socket
import sys

logger = logging.getLogger(__name__)

# The versions whose otf_message_handler reads every field through _retrieve_buffer(conn, length).
CHECKED_VERSIONS = frozenset({"0.12.0"})

# What one recv() asks for: a batch of 128 short requests is about 40 KiB of frame.
RECV_BYTES = 64 * 1024


class FrameBuffer:
    """`read(conn, length)`: the next `length` bytes from `conn`, as TorchServe's `_retrieve_buffer` returns
    them, with as few recv() calls as the socket allows."""

    def __init__(self) -> None:
        self._conn: socket.socket | None = None
        self._data = bytearray()
        self._at = 0

    def read(self, conn: socket.socket, length: int) -> bytearray:
        if conn is not self._conn:
            # A worker has one connection for its life; a new one starts with nothing buffered.
            self._conn, self._data, self._at = conn, bytearray(), 0
        end = self._at + length
        if end > len(self._data):
            self._fill(conn, length)
            end = length
        field = self._data[self._at : end]
        self._at = end
        return field

    def _fill(self, conn: socket.socket, length: int) -> None:
        """Keep the unread bytes, then receive until `length` of them are buffered."""
        # A fresh buffer when all was read (the usual case: a frame ends a batch), so one large body
        # does not keep its memory for the worker's life.
        self._data = self._data[self._at :] if self._at < len(self._data) else bytearray()
        self._at = 0
        while len(self._data) < length:
            packet = conn.recv(max(RECV_BYTES, length - len(self._data)))
            if not packet:
                # What the stock reader does when the frontend goes away: the worker ends quietly.
                logging.info("Frontend disconnected.")
                sys.exit(0)
            self._data += packet


def install_buffered_frame_reader() -> bool:
    """Make this process's TorchServe worker read frames through a FrameBuffer; True when it does."""
    try:
        from ts.protocol import otf_message_handler
        from ts.version import __version__ as torchserve_version
    except ImportError:
        return False
    current = getattr(otf_message_handler, "_retrieve_buffer", None)
    if isinstance(getattr(current, "__self__", None), FrameBuffer):
        return True
    if torchserve_version not in CHECKED_VERSIONS or current is None:
        logger.info("TorchServe %s: its worker keeps its own frame reader (checked: %s)",
                    torchserve_version, ", ".join(sorted(CHECKED_VERSIONS)))  # fmt: skip
        return False
    otf_message_handler._retrieve_buffer = FrameBuffer().read
    return True
