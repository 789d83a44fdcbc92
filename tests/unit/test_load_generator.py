"""The closed loop's HTTP client (tooling/bench/http_client.py, through tooling/bench/loadgen.closed_loop)
against a real HTTP server (aiohttp's) on a free loopback port: every request and answer whole, errors
counted as the server gave them, connections the server closes opened again."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from aiohttp import web

from tooling.bench.answers import AnswerCheck
from tooling.bench.http_client import Endpoint
from tooling.bench.loadgen import closed_loop
from tooling.torchserve import free_port

TEXTS = ["short", "a somewhat longer text, with punctuation", "é ünïcode ✓", "x" * 5000]
ANSWERS = [{"scores": {"positive": len(t) / 10_000}, "truncated": False} for t in TEXTS]


class Server:
    """What the server received and how it answered."""

    def __init__(self) -> None:
        self.bodies: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.connections: set[object] = set()


@contextmanager
def serving(answer: Callable[[int, str], web.StreamResponse | None]) -> Iterator[tuple[str, Server]]:
    """An aiohttp server in its own thread; `answer(n, body)` answers the n-th request (None: drop it)."""
    server, port, ready = Server(), free_port(), threading.Event()
    loop = asyncio.new_event_loop()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = (await request.read()).decode()
        server.bodies[body] += 1
        server.connections.add(request.transport)  # held: the set counts distinct connections
        n = sum(server.bodies.values())
        response = answer(n, body)
        if response is None:
            request.transport.close()  # no answer at all: the client sees the connection go
            raise asyncio.CancelledError
        server.statuses[response.status] += 1
        return response

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/predictions/m", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}/predictions/m", server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def answer_of(body: str) -> web.Response:
    return web.json_response(ANSWERS[TEXTS.index(body)])


def run(url: str, clients: int = 4, seconds: float = 0.5) -> dict:
    return closed_loop(url, {"Content-Type": "text/plain"}, TEXTS, clients, seconds, AnswerCheck(ANSWERS, 1e-9))


def test_every_request_arrives_whole_and_every_answer_is_read_and_checked():
    with serving(lambda n, body: answer_of(body)) as (url, server):
        result = run(url)
    assert result["errors"] == 0 and result["requests"] > 20
    assert set(server.bodies) <= set(TEXTS) and len(server.bodies) == len(TEXTS)  # whole, every text
    # Each answer belonged to its own text: none wrong, and one checked per request the client counted.
    assert result["answers_checked"] == result["requests"] == sum(server.bodies.values())
    assert result["answers_wrong"] == 0
    assert len(server.connections) == 4  # one keep-alive connection per client


def test_a_server_that_closes_every_connection_is_followed_to_a_new_one():
    def close_after(n: int, body: str) -> web.Response:
        response = answer_of(body)
        response.force_close()  # Connection: close
        return response

    with serving(close_after) as (url, server):
        result = run(url)
    assert result["errors"] == 0 and result["answers_wrong"] == 0
    assert len(server.connections) == result["requests"] == sum(server.bodies.values())


def test_error_statuses_are_counted_as_the_server_sent_them_and_the_rest_served():
    def some_refused(n: int, body: str) -> web.Response:
        if n % 3 == 0:
            refused = web.json_response({"code": 503}, status=503)
            refused.force_close()  # as TorchServe does after an error status
            return refused
        return answer_of(body)

    with serving(some_refused) as (url, server):
        result = run(url)
    assert result["errors"] == server.statuses[503] > 0
    assert result["requests"] == server.statuses[200] > 0
    assert result["answers_checked"] == result["requests"] and result["answers_wrong"] == 0


def test_a_request_dropped_without_an_answer_is_an_error_and_the_client_goes_on():
    with serving(lambda n, body: None if n % 5 == 0 else answer_of(body)) as (url, server):
        result = run(url)
    dropped = sum(server.bodies.values()) - sum(server.statuses.values())
    assert result["errors"] == dropped > 0
    assert result["requests"] == server.statuses[200] > 0


def test_the_request_head_carries_the_headers_and_never_a_second_content_length():
    endpoint = Endpoint.of(
        "http://127.0.0.1:8080/predictions/m?x=1", {"Authorization": "Bearer t", "Content-Length": "9"}
    )
    head = endpoint.head.decode()
    assert head.startswith("POST /predictions/m?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert "Authorization: Bearer t\r\n" in head and head.endswith("\r\nContent-Length: ")
    assert head.count("Content-Length") == 1
    with pytest.raises(ValueError):
        Endpoint.of("https://example.com/predictions/m", {})
