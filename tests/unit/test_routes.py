"""The route TorchServe's frontend records in a request's headers decides how its body is read."""

from __future__ import annotations

import json

from handlers import rejection
from handlers.protocols import KSERVE_V1, KSERVE_V2, PREDICTIONS, read_request
from tests.kserve_cases import v1, v2
from tests.request_shapes import grpc, raw_body

LIMIT = 64 * 1024
INSTANCES = 64


def on_kserve_route(item_and_headers):
    """The same request as it arrives on /v1 or /v2: the frontend adds `explain` but no `url_path`."""
    item, headers = item_and_headers
    return item, {key: value for key, value in headers.items() if key != "url_path"}


def read(item_and_headers):
    item, headers = item_and_headers
    return read_request(item, headers, LIMIT, INSTANCES)


def test_kserve_route_reads_v2_json_whatever_the_content_type():
    body = json.dumps(v2("a", "b", request_id="x")).encode()
    for content_type in (None, "text/plain", "application/octet-stream"):
        request = read(on_kserve_route(raw_body(body, content_type)))
        assert (request.protocol, request.instances, request.request_id) == (KSERVE_V2, ("a", "b"), "x")


def test_kserve_route_refuses_what_is_no_envelope():
    for body in (b'{"text": "a text"}', b"[1]", b'"a JSON string"'):
        request = read(on_kserve_route(raw_body(body)))
        assert request.error is not None and request.error.type == "MalformedRequest", body
    for body in (b"a text", b"{oops"):
        assert read(on_kserve_route(raw_body(body, "text/plain"))).error.type == "MalformedJSON"


def test_predictions_route_reads_the_content_type():
    body = json.dumps(v1("a")).encode()
    assert (read(raw_body(body)).protocol, read(raw_body(body)).instances) == (PREDICTIONS, (body.decode(),))
    assert read(raw_body(body, "application/json")).protocol == KSERVE_V1


def test_unknown_route_takes_only_a_well_formed_envelope_without_content_type():
    assert read(grpc({"data": json.dumps(v1("a", "b")).encode()})).instances == ("a", "b")
    malformed = json.dumps({"instances": "not a list"}).encode()
    assert read(grpc({"data": malformed})).instances == (malformed.decode(),)
    assert read(grpc({"data": b"plain text"})).instances == ("plain text",)


def test_a_compressed_body_is_refused_on_every_route_and_an_identity_one_is_read():
    import gzip

    body = json.dumps(v2("a")).encode()
    for route in (on_kserve_route, lambda request: request):
        item, headers = route(raw_body(gzip.compress(body), "application/json"))
        request = read_request(item, {**headers, "Content-Encoding": "gzip"}, LIMIT, INSTANCES)
        assert (request.error.status, request.error.type) == (415, "UnsupportedContentEncoding")
        assert request.kserve_route == (route is on_kserve_route)  # a KServe client reads its message from `error`
        item, headers = route(raw_body(body, "application/json"))
        assert read_request(item, {**headers, "Content-Encoding": "identity"}, LIMIT, INSTANCES).instances == ("a",)


def test_an_explanation_route_is_refused_whole_in_the_form_its_client_reads():
    """TorchServe's frontend sets `explain` to "True" on /explanations/NAME and KServe's :explain and /explain (and
    "False" on the prediction routes): this handler has no explainer, so those requests are refused, never predicted."""
    item, headers = raw_body(json.dumps({"text": "a"}).encode(), "application/json")
    explained = {**headers, "explain": "True"}
    plain = read((item, explained))
    assert (plain.error, plain.kserve_route) == (rejection.explanation_not_supported(), False)
    body = json.dumps(v1("a")).encode()
    kserve = read(on_kserve_route((raw_body(body, "application/json")[0], explained)))
    assert (kserve.error, kserve.kserve_route) == (rejection.explanation_not_supported(), True)
    assert kserve.error.status == 501 and "not explanations" in kserve.error.message
    assert read((item, headers)).instances == ("a",)  # "False": predicted
