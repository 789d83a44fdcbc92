"""The closed loop's HTTP client (tooling/bench/http_client.py, through tooling/bench/loadgen.closed_loop)
against a real HTTP server (aiohttp's) on a free loopback port: every request and answer whole, errors
counted as the server gave them, connections the server closes opened again."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from aiohttp import web

from tooling.bench.answers import AnswerCheck
from tooling.bench.http_client import Endpoint, header_lines
from tooling.bench.loadgen import closed_loop
from tooling.bench.openloop import open_loop, open_loop_payloads
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
def serving(answer: Callable[[int, str, web.Request], object]) -> Iterator[tuple[str, Server]]:
    """An aiohttp server in its own thread; `answer(n, body, request)` answers the n-th request (None: drop it;
    an awaitable: answer when it is done)."""
    server, port, ready = Server(), free_port(), threading.Event()
    loop = asyncio.new_event_loop()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = (await request.read()).decode()
        server.bodies[body] += 1
        server.connections.add(request.transport)  # held: the set counts distinct connections
        n = sum(server.bodies.values())
        response = answer(n, body, request)
        if asyncio.iscoroutine(response):
            response = await response
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
    with serving(lambda n, body, request: answer_of(body)) as (url, server):
        result = run(url)
    assert result["errors"] == 0 and result["requests"] > 20
    assert set(server.bodies) <= set(TEXTS) and len(server.bodies) == len(TEXTS)  # whole, every text
    # Each answer belonged to its own text: none wrong, and one checked per request the client counted.
    assert result["answers_checked"] == result["requests"] == sum(server.bodies.values())
    assert result["answers_wrong"] == 0
    assert len(server.connections) == 4  # one keep-alive connection per client


def test_a_server_that_closes_every_connection_is_followed_to_a_new_one():
    def close_after(n: int, body: str, request: web.Request) -> web.Response:
        response = answer_of(body)
        response.force_close()  # Connection: close
        return response

    with serving(close_after) as (url, server):
        result = run(url)
    assert result["errors"] == 0 and result["answers_wrong"] == 0
    assert len(server.connections) == result["requests"] == sum(server.bodies.values())


def test_error_statuses_are_counted_as_the_server_sent_them_and_the_rest_served():
    def some_refused(n: int, body: str, request: web.Request) -> web.Response:
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
    with serving(lambda n, body, request: None if n % 5 == 0 else answer_of(body)) as (url, server):
        result = run(url)
    dropped = sum(server.bodies.values()) - sum(server.statuses.values())
    assert result["errors"] == dropped > 0
    assert result["requests"] == server.statuses[200] > 0


def test_the_request_head_carries_the_headers_and_never_a_second_content_length():
    endpoint = Endpoint.of(
        "http://127.0.0.1:8080/predictions/m?x=1", {"Authorization": "Bearer t", "Content-Length": "9"}
    )
    assert endpoint.head == b"POST /predictions/m?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer t\r\n"
    assert header_lines({"X-Request-Deadline": "17", "content-length": "3"}) == b"X-Request-Deadline: 17\r\n"
    with pytest.raises(ValueError):
        Endpoint.of("https://example.com/predictions/m", {})


# ---- the open loop (tooling/bench/openloop.py): overlapping requests, each with its own timeout -------------


def test_the_open_loop_sends_each_payload_with_its_headers_and_its_deadline():
    seen = []

    def record(n: int, body: str, request: web.Request) -> web.Response:
        seen.append((body, request.headers.get("Content-Type"), request.headers.get("X-Request-Deadline"),
                     request.headers.get("Authorization")))  # fmt: skip
        return answer_of(body)

    payloads = [(TEXTS[0].encode(), {"Content-Type": "application/json"}), (TEXTS[1].encode(), {})]
    with serving(record) as (url, _):
        sent_ms = 1000 * time.time()
        result = open_loop_payloads(url, {"Authorization": "Bearer t", "Content-Type": "text/plain"}, payloads,
                                    rate=200, seconds=0.2, timeout_s=5.0, deadline=True)  # fmt: skip
    summary = result.summary()
    assert summary["offered"] == 40 == summary["answered_in_time"] == len(seen)
    # A payload's own Content-Type wins over the run's, once; the run's other headers ride along.
    assert {(body, kind) for body, kind, _, _ in seen} == {(TEXTS[0], "application/json"), (TEXTS[1], "text/plain")}
    assert all(auth == "Bearer t" for *_, auth in seen)
    # Each request's deadline: its send time plus the client's timeout.
    assert all(sent_ms + 5000 - 50 <= int(d) <= sent_ms + 5000 + 1000 for _, _, d, _ in seen)


def test_a_request_past_its_timeout_is_given_up_and_its_connection_never_reused():
    def slow_every_fourth(n: int, body: str, request: web.Request):
        return asyncio.sleep(1.0, answer_of(body)) if n % 4 == 0 else answer_of(body)

    with serving(slow_every_fourth) as (url, server):
        result = open_loop(url, {"Content-Type": "text/plain"}, TEXTS, rate=100, seconds=0.4, timeout_s=0.3,
                           keep_bodies=True)  # fmt: skip
    summary = result.summary()
    assert summary["gave_up"] == 10 and summary["answered_in_time"] == 30  # every fourth of 40
    assert summary["connection_errors"] == 0 and summary["refused_total"] == 0
    # No late answer was read on a reused connection: every answer in time is its own text's.
    answered = [o for o in result.outcomes if o.status == 200]
    assert all(json.loads(o.body) == ANSWERS[o.index % len(TEXTS)] and o.seconds < 0.3 for o in answered)
    assert sum(server.bodies.values()) == 40


def test_the_open_loop_counts_refusals_by_status_and_type_and_dropped_requests_as_connection_errors():
    def mixed(n: int, body: str, request: web.Request):
        if n % 5 == 0:
            return None  # dropped
        if n % 5 == 1:
            refused = web.json_response({"code": 503, "type": "ServiceUnavailableException"}, status=503)
            refused.force_close()
            return refused
        return answer_of(body)

    with serving(mixed) as (url, _):
        result = open_loop(url, {"Content-Type": "text/plain"}, TEXTS, rate=100, seconds=0.5, timeout_s=2.0)
    summary = result.summary()
    assert summary["refused"] == {"503 ServiceUnavailableException": 10}
    assert summary["connection_errors"] == 10 and summary["answered_in_time"] == 30
