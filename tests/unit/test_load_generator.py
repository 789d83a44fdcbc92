"""The closed loop's HTTP client (tooling/bench/http_client.py, through tooling/bench/loadgen.closed_loop)
against a real HTTP server (aiohttp's) on a free loopback port: every request and answer whole, errors
counted as the server gave them, connections the server closes opened again."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from aiohttp import web

from tooling.bench.answers import AnswerCheck
from tooling.bench.http_client import Endpoint, Pool, header_lines
from tooling.bench.loadgen import CLIENTS_PER_PROCESS, MAX_PROCESSES, closed_loop, percentile_ms, processes_for
from tooling.bench.openloop import (
    OpenLoopResult,
    Outcome,
    open_loop,
    open_loop_payloads,
    percentile_or_beyond_ms,
    schedule_for,
)
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


def test_no_load_process_holds_more_than_its_share_of_clients_where_cores_allow(monkeypatch):
    # On a machine with cores to spare, one client past a process's share starts another process.
    monkeypatch.setattr("multiprocessing.cpu_count", lambda: 16)
    assert processes_for(1) == processes_for(CLIENTS_PER_PROCESS) == 1
    assert processes_for(CLIENTS_PER_PROCESS + 1) == 2
    assert processes_for(100 * CLIENTS_PER_PROCESS) == MAX_PROCESSES


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
    # Each request's deadline: its scheduled send time plus the client's timeout.
    assert all(sent_ms + 5000 - 50 <= int(d) <= sent_ms + 5000 + 1000 for _, _, d, _ in seen)


def test_a_request_past_its_timeout_is_given_up_and_its_connection_never_reused():
    # Timeouts run from the schedule, and a generator beside busy cores sends up to a quarter of a second late:
    # a timeout of 1.5 s leaves the quick answers room, the slow ones (3 s) none.
    def slow_every_fourth(n: int, body: str, request: web.Request):
        return asyncio.sleep(3.0, answer_of(body)) if n % 4 == 0 else answer_of(body)

    with serving(slow_every_fourth) as (url, server):
        result = open_loop(url, {"Content-Type": "text/plain"}, TEXTS, rate=100, seconds=0.4, timeout_s=1.5,
                           keep_bodies=True)  # fmt: skip
    summary = result.summary()
    assert summary["gave_up"] == 10 and summary["answered_in_time"] == 30  # every fourth of 40
    assert summary["connection_errors"] == 0 and summary["refused_total"] == 0
    # No late answer was read on a reused connection: every answer in time is its own text's.
    answered = [o for o in result.outcomes if o.status == 200]
    assert all(json.loads(o.body) == ANSWERS[o.index % len(TEXTS)] and o.seconds < 1.5 for o in answered)
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


def bounded_queue(service_s: float, room: int) -> Callable[[int, str, web.Request], object]:
    """A server that computes one request at a time, `service_s` each (first come, first served), and holds at most
    `room` requests: one more is refused at once, 503 ServiceUnavailableException and its connection closed, as
    TorchServe's frontend refuses when its queue is full."""
    state = {"in_system": 0, "lock": None}

    async def serve(body: str) -> web.Response:
        if state["lock"] is None:
            state["lock"] = asyncio.Lock()  # in the server's own event loop
        try:
            async with state["lock"]:
                await asyncio.sleep(service_s)
            return answer_of(body)
        finally:
            state["in_system"] -= 1

    def answer(n: int, body: str, request: web.Request):
        if state["in_system"] >= room:
            refused = web.json_response({"code": 503, "type": "ServiceUnavailableException"}, status=503)
            refused.force_close()
            return refused
        state["in_system"] += 1
        return serve(body)

    return answer


def test_goodput_counts_the_requests_scheduled_in_the_window_not_the_queue_answered_after_the_arrivals_stop():
    # At most 100 answers a second (10 ms each, one at a time) and room for 20; 3x that offered for a 0.3 s warm-up
    # and a 0.6 s window. The whole schedule's answers over its length also count the 20 still queued when the
    # arrivals stop (answered afterwards): more than the server can do. The window's cannot exceed it.
    with serving(bounded_queue(0.010, 20)) as (url, server):
        result = open_loop(url, {"Content-Type": "text/plain"}, TEXTS, rate=300, seconds=0.6, timeout_s=1.0,
                           warmup_s=0.3)  # fmt: skip
    summary = result.summary()
    assert summary["window_s"] == pytest.approx([0.3, 0.9]) and summary["offered"] == 180 and result.offered == 270
    assert summary["offered_rps"] == pytest.approx(300)
    # Some answered, however loaded the machine (a run beside other work answered 18 of a possible 60): the bound
    # that matters is the upper one, the server's capacity, which the whole schedule's count exceeds.
    assert summary["answered_in_time"] > 0 and summary["goodput_rps"] <= 105, summary
    whole = summary["whole_schedule"]
    assert whole["answered_in_time"] == server.statuses[200] and whole["offered"] == 270
    # The whole schedule also counts the 20 admitted at once as the warm-up began (an empty queue), which the window
    # does not: on a quiet machine 22/s more over 0.9 s. Counted, not as rates: beside busy cores the server, slower
    # in the warm-up than in the window, once made the rates' gap 8/s.
    assert whole["answered_in_time"] >= summary["answered_in_time"] + 20, (whole, summary)
    # Most were refused at the door, at once: every request's p99 lies beyond the timeout, the admitted ones' does
    # not (each waited at most the 20 ahead of it), and the refusals came back sooner than the admitted answers. Both
    # from the send: the latencies themselves run from the schedule, and a generator sharing busy cores sends late
    # (beside two busy cores the refusals' median from the schedule was 105-248 ms once, 2 ms on a quiet machine).
    assert summary["all_p99_ms"] is None and summary["all_p99_beyond_timeout"]
    assert summary["admitted"] == summary["answered_in_time"] and summary["admitted_p99_ms"] < 1000
    assert summary["refused"] == {"503 ServiceUnavailableException": summary["refused_total"]}
    from_send = {kind: [o.seconds - o.lag for o in result.outcomes if (o.status == 200) == (kind == "answered")]
                 for kind in ("answered", "refused")}  # fmt: skip
    assert statistics.median(from_send["refused"]) < statistics.median(from_send["answered"]), summary


def test_a_stalled_generator_hides_no_latency_its_timeouts_and_deadlines_run_from_the_schedule(monkeypatch):
    # The generator's event loop blocks for 0.6 s on its first request (as a busy load generator would): the
    # requests scheduled meanwhile go out late, or not at all once their timeout (0.4 s) has passed. The server
    # answers each after 160 ms.
    original, stalled = Pool.post, []

    async def stalling_post(self, body: bytes, headers: bytes = b""):
        if not stalled:
            stalled.append(True)
            time.sleep(0.6)
        return await original(self, body, headers)

    monkeypatch.setattr(Pool, "post", stalling_post)
    deadlines: dict[int, int] = {}

    def record(n: int, body: str, request: web.Request):
        deadlines[int(body)] = int(request.headers["X-Request-Deadline"])
        return asyncio.sleep(0.16, web.json_response({}))

    payloads = [(str(i).encode(), {}) for i in range(40)]
    with serving(record) as (url, _):
        result = open_loop_payloads(url, {"Content-Type": "text/plain"}, payloads, rate=50, seconds=0.8,
                                    timeout_s=0.4, deadline=True)  # fmt: skip
    summary = result.summary()
    # Request i was scheduled at 20 i ms and the loop came back at 600 ms or later (the stall), sending at once every
    # request still within its timeout. Each is judged by its own lag, not its index, since a loaded machine moves
    # the loop's return (index-based margins of 50 ms failed twice in five runs beside eight busy processes):
    timeout, answer_s = 0.4, 0.16
    unsent = [o for o in result.outcomes if not o.sent]
    gave_up = [o for o in result.outcomes if o.sent and o.status == 0]
    answered = [o for o in result.outcomes if o.status == 200]
    assert len(unsent) + len(gave_up) + len(answered) == 40, result.outcomes  # no connection error, no refusal
    # past its timeout when its turn came: never sent, nothing reached the server;
    assert unsent and all(o.lag >= timeout for o in unsent) and not {o.index for o in unsent} & set(deadlines)
    assert {1, 2, 3, 4, 5, 6, 7} <= {o.index for o in unsent}  # 460 ms late or more, however soon the loop came back
    # sent, and given up 400 ms after its scheduled time, not after its send: those whose answer (160 ms after the
    # send) would come too late are all here, some of them (lags of 240-400 ms: every loop's return makes some)
    assert all(o.lag < timeout and o.seconds >= timeout - 0.005 for o in gave_up), gave_up
    assert [o for o in result.outcomes if o.sent and o.lag + answer_s > timeout] and all(
        o.status == 0 for o in result.outcomes if o.sent and o.lag + answer_s > timeout
    )
    # answered within the timeout from the schedule, the lag counted: a late one's latency holds its lag
    assert all(o.seconds <= timeout + 0.005 and o.seconds >= o.lag + answer_s - 0.01 for o in answered), answered
    assert any(o.lag > 0.04 for o in answered), answered
    assert all(o.seconds >= o.lag for o in result.outcomes)
    # The deadline is the scheduled time plus the timeout: 20 ms apart whatever the send time.
    last = max(deadlines)
    for i in deadlines:
        assert abs((deadlines[i] - deadlines[last]) - 20 * (i - last)) <= 1, (i, deadlines)
    # The lag is reported, and the cell flagged: a p99 lag of a tenth of the timeout or more.
    assert summary["send_lag_max_ms"] >= 500 and summary["send_lag_p99_ms"] >= 40 and summary["send_lag_unreliable"]
    assert summary["gave_up"] >= 12 and summary["sent_rps"] < summary["offered_rps"] == pytest.approx(50)


def _outcome(i: int, status: int, seconds: float, refusal: str = "", lag: float = 0.001) -> Outcome:
    return Outcome(i, status, seconds, sent_at=i / 100 + lag, scheduled_at=i / 100, refusal=refusal)


def test_percentiles_count_every_request_scheduled_in_the_window_those_not_answered_in_time_as_beyond():
    # One request in a hundred never answered puts the p99 beyond the timeout; without any, it is percentile_ms's.
    assert percentile_or_beyond_ms([0.1] * 99, 100, 99) is None
    assert percentile_or_beyond_ms([0.1] * 995, 1000, 99) == pytest.approx(100.0)
    spread = [0.001 * k for k in range(1, 201)]
    assert percentile_or_beyond_ms(spread, 200, 99) == pytest.approx(percentile_ms(spread, 99))
    assert percentile_or_beyond_ms([0.1] * 40, 100, 50) is None
    # 100 requests 10 ms apart, the window 0.25-1 s: 25 answered in the warm-up are not counted.
    outcomes = [_outcome(i, 200, 0.05) for i in range(25)]
    outcomes += [_outcome(i, 200, 0.05 + i / 10_000) for i in range(25, 95)]
    outcomes += [_outcome(i, 503, 0.002, "503 ServiceUnavailableException") for i in range(95, 100)]
    result = OpenLoopResult(offered=100, seconds=1.0, timeout_s=0.3, window=(0.25, 1.0), rate=100.0,
                            outcomes=outcomes)  # fmt: skip
    summary = result.summary()
    assert (summary["offered"], summary["answered_in_time"]) == (75, 70)
    assert summary["goodput_rps"] == pytest.approx(70 / 0.75) and summary["whole_schedule"]["answered_in_time"] == 95
    assert summary["p99_ms"] < 300 and summary["all_p50_ms"] < 300
    assert summary["all_p99_ms"] is None and summary["all_p99_beyond_timeout"]  # 5 of 75 refused
    # Refused at the door is not admitted: the admitted were all answered in time, and their p99 is the 200s'.
    assert summary["admitted"] == 70 and summary["admitted_p99_ms"] == pytest.approx(summary["p99_ms"])
    assert summary["refusal_p50_ms"] == pytest.approx(2.0) and not summary["send_lag_unreliable"]
    # An admitted request refused late (it would have missed its deadline), or given up, counts as beyond the timeout.
    outcomes[60] = _outcome(60, 503, 0.25, "503 DeadlineExceeded")
    late = OpenLoopResult(offered=100, seconds=1.0, timeout_s=0.3, window=(0.25, 1.0), outcomes=outcomes).summary()
    assert late["admitted"] == 70 and late["admitted_p99_ms"] is None and late["admitted_p99_beyond_timeout"]
    assert late["refused"] == {"503 ServiceUnavailableException": 5, "503 DeadlineExceeded": 1}
    outcomes[60] = _outcome(60, 0, 0.3)
    gave_up = OpenLoopResult(offered=100, seconds=1.0, timeout_s=0.3, window=(0.25, 1.0), outcomes=outcomes).summary()
    assert gave_up["gave_up"] == 1 and gave_up["admitted_p99_ms"] is None
    # Two requests in the window sent 50 ms late: the p99 lag reaches a tenth of the 300 ms timeout.
    outcomes[70], outcomes[80] = _outcome(70, 200, 0.1, lag=0.05), _outcome(80, 200, 0.1, lag=0.05)
    lagged = OpenLoopResult(offered=100, seconds=1.0, timeout_s=0.3, window=(0.25, 1.0), outcomes=outcomes).summary()
    assert lagged["send_lag_max_ms"] == pytest.approx(50) and lagged["send_lag_unreliable"]


def test_a_p99_send_lag_of_exactly_a_tenth_of_the_timeout_flags_the_cell_unreliable():
    # "a tenth of the timeout or more": every request sent 100 ms late against a 1 s timeout is already too late.
    outcomes = [Outcome(i, 200, 0.2, sent_at=0.1, scheduled_at=0.0) for i in range(10)]
    summary = OpenLoopResult(offered=10, seconds=1.0, timeout_s=1.0, window=(0.0, 1.0), outcomes=outcomes).summary()
    assert summary["send_lag_p99_ms"] == 100.0 and summary["send_lag_unreliable"]


def test_a_constant_schedule_too_short_for_one_gap_still_sends_one_request():
    # "at least one": a cell shorter than 1/rate measures one request rather than none.
    assert schedule_for(1, 0.2, "constant") == [0.0]


def test_poisson_arrivals_span_the_whole_schedule_and_constant_ones_keep_their_count():
    assert schedule_for(200, 0.2, "constant") == [i / 200 for i in range(40)]
    for seed in range(20):
        times = schedule_for(50, 4.0, "poisson", seed)
        # Drawn until the schedule's end, not for a fixed count: the last arrival is near the end, never past it.
        assert times == sorted(times) and times[-1] < 4.0 and 4.0 - times[-1] < 0.3


def test_an_exit_raised_inside_the_parsers_callback_ends_the_load_as_the_signal_meant(monkeypatch):
    """A signal's handler runs between any two bytecodes, httptools' callbacks' among them, and httptools turns what a
    callback raises into HttpParserCallbackError: a SIGTERM's exit raised there (tooling/termination.py) must end the
    load, not pass for an unreadable response. It did pass so: a benchmark stopped by its time limit (SIGTERM) ran on
    to its end (a fresh clone's tests/e2e/test_benchmark_quick.py, exit 1 with every cell)."""
    import itertools

    from tooling.bench.http_client import Connection
    from tooling.termination import Terminated

    complete, answered = Connection.on_message_complete, itertools.count()

    def interrupted(self) -> None:
        complete(self)
        if next(answered) == 5:
            raise Terminated(143)  # where the SIGTERM's handler would raise it, inside httptools' callback

    monkeypatch.setattr(Connection, "on_message_complete", interrupted)
    started = time.monotonic()
    with serving(lambda n, body, request: answer_of(body)) as (url, _), pytest.raises(Terminated):
        run(url, clients=4, seconds=5.0)
    assert time.monotonic() - started < 4, "the load ran on after the exit"
