"""Every common way of sending a text, against a real TorchServe: it works, or the answer says what to do.

The curl commands of docs/calling.md are run here as they are written, with curl, so each one is
known to work; the other cases (charsets, byte-order marks, several form fields) go through
`requests`. Every accepted text must get exactly the answer the same text gets as a plain UTF-8
body, and no request that carries a text is ever answered EmptyText.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.support import SHARED_MODEL, logs_caught_up

pytestmark = pytest.mark.e2e

MODEL = SHARED_MODEL
TEXT = "text/plain"
JSON = "application/json"
URLENCODED = "application/x-www-form-urlencoded"
# A review as a user would save it: punctuation a form parser trips on, accents, a second line.
REVIEW = "The room was great & clean, price = fair. Café crème in the morning.\nWould stay again!"
SHORT = "The room was great, loved it."


@pytest.fixture(scope="module")
def model(shared_model):
    return shared_model


@pytest.fixture(scope="module")
def review_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("review") / "review.txt"
    path.write_text(REVIEW, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def url(torchserve, model) -> str:
    return f"{torchserve.inference_url}/predictions/{model}"


@pytest.fixture(scope="module")
def reference(torchserve, model):
    """The answer for a text sent the plain way (a UTF-8 text/plain body), memoised per text."""
    answers: dict[str, dict] = {}

    def answer(text: str) -> dict:
        if text not in answers:
            response = torchserve.predict(model, text.encode("utf-8"), TEXT)
            assert response.status_code == 200, response.text
            answers[text] = response.json()
        return answers[text]

    return answer


def assert_same_answer(response: requests.Response | tuple[int, dict], expected: dict) -> None:
    status, body = (response.status_code, response.json()) if isinstance(response, requests.Response) else response
    assert status == 200, body
    assert body["label"] == expected["label"]
    assert body["scores"] == pytest.approx(expected["scores"], abs=1e-4)


def assert_rejected(response: requests.Response | tuple[int, dict], status: int, kind: str) -> dict:
    code, body = (response.status_code, response.json()) if isinstance(response, requests.Response) else response
    assert (code, body.get("type")) == (status, kind), body
    assert body["code"] == status and body["message"]
    return body


# ---- the curl commands of docs/calling.md, run as written ---------------------------------------------


def curl(torchserve, url: str, *arguments: str, cwd: Path) -> tuple[int, dict]:
    """Run `curl -s -H @<(echo "Authorization: Bearer $KEY") <arguments> URL` as docs/calling.md writes it, by bash
    with KEY in its environment (the key on no command line); return (status, JSON body)."""
    if shutil.which("curl") is None:
        if os.environ.get("CI"):
            pytest.fail("curl is not installed: docs/calling.md's commands cannot be checked")
        pytest.skip("curl is not installed")
    script = 'curl -s -w "\\n%{http_code}" -H @<(echo "Authorization: Bearer $KEY") "$@"'
    command = ["bash", "-c", script, "curl", *arguments, url]
    environment = {**os.environ, "KEY": torchserve.keys()["inference"]}
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=60, check=True)
    body, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(body)


# (curl arguments after the key, the text the server must see); run in the folder holding review.txt.
CURL_WAYS = {
    "raw body, curl -T": (["-T", "review.txt"], REVIEW),
    "raw body, --data-binary": (["-H", "Content-Type: text/plain", "--data-binary", "@review.txt"], REVIEW),
    "raw body, -d with text/plain": (["-H", "Content-Type: text/plain", "-d", SHORT], SHORT),
    "JSON": (["-H", "Content-Type: application/json", "-d", json.dumps({"text": SHORT})], SHORT),
    "multipart, -F text=@file": (["-F", "text=@review.txt"], REVIEW),
    "multipart, -F data=@file": (["-F", "data=@review.txt"], REVIEW),
    "multipart, -F text=value": (["-F", f"text={SHORT}"], SHORT),
    "urlencoded, --data-urlencode text@file": (["--data-urlencode", "text@review.txt"], REVIEW),
    "urlencoded, --data-urlencode text=value": (["--data-urlencode", f"text={REVIEW}"], REVIEW),
}


@pytest.mark.parametrize("way", CURL_WAYS)
def test_each_documented_command_gets_the_answer_of_its_text(torchserve, url, review_file, reference, way):
    arguments, text = CURL_WAYS[way]
    assert_same_answer(curl(torchserve, url, *arguments, cwd=review_file.parent), reference(text))


@pytest.mark.parametrize(
    "arguments",
    [["-d", SHORT], ["-d", "@review.txt"], ["--data-binary", "@review.txt"]],
    ids=["curl -d text", "curl -d @file", "curl --data-binary @file"],
)
def test_curl_form_habits_say_what_was_received_and_the_fix(torchserve, url, review_file, arguments):
    # curl declares these bodies application/x-www-form-urlencoded: TorchServe parses them as forms.
    body = assert_rejected(curl(torchserve, url, *arguments, cwd=review_file.parent), 400, "FormWithoutText")
    message = body["message"]
    assert URLENCODED in message
    for fix in ('-H "Content-Type: text/plain"', "--data-binary", '{"text": ...}', "--data-urlencode"):
        assert fix in message, fix
    for word in ("great", "fair", "Café", "Would stay"):  # the text itself is never echoed
        assert word not in message


def test_the_fix_the_message_gives_works(torchserve, url, review_file, reference):
    # What the FormWithoutText message tells a curl -d user to run instead.
    fixed = ["-H", "Content-Type: text/plain", "--data-binary", "@review.txt"]
    assert_same_answer(curl(torchserve, url, *fixed, cwd=review_file.parent), reference(REVIEW))


# ---- forms: which field is the text -----------------------------------------------------------------


def post(torchserve, url: str, **kwargs) -> requests.Response:
    headers = {**torchserve.auth("inference"), **kwargs.pop("headers", {})}
    return requests.post(url, headers=headers, timeout=60, **kwargs)


def test_text_field_wins_over_data_in_both_form_kinds(torchserve, url, reference):
    first, second = "the text field is the one read", "the data field is only a fallback"
    assert reference(first)["scores"] != reference(second)["scores"]  # else the test could not tell them apart
    urlencoded = post(torchserve, url, data={"lang": "en", "data": second, "text": first})
    multipart = post(torchserve, url, files={"data": (None, second), "text": (None, first), "id": (None, "7")})
    assert_same_answer(urlencoded, reference(first))
    assert_same_answer(multipart, reference(first))
    assert_same_answer(post(torchserve, url, data={"lang": "en", "data": second}), reference(second))


def test_a_text_pair_field_makes_a_pair_in_both_form_kinds_as_in_json(torchserve, url, reference):
    query, passage = "is breakfast included", "Breakfast is served daily from seven, included in every rate."
    as_json = post(torchserve, url, json={"text": query, "text_pair": passage})
    assert as_json.status_code == 200, as_json.text
    assert as_json.json()["scores"] != reference(query)["scores"]  # a pair, not its first text alone
    assert_same_answer(post(torchserve, url, data={"text": query, "text_pair": passage}), as_json.json())
    multipart = post(torchserve, url, files={"text": (None, query), "text_pair": (None, passage)})
    assert_same_answer(multipart, as_json.json())
    body = assert_rejected(post(torchserve, url, data={"text": query, "text_pair": " "}), 400, "EmptyText")
    assert "text_pair" in body["message"]


def test_a_field_named_body_is_a_field_like_any_other_never_the_text(torchserve, url, reference):
    # TorchServe names a raw body `body`; a form field of that name must neither beat `text` nor drop `text_pair`.
    query, passage, decoy = "is breakfast included", "Breakfast is served daily from seven.", "Awful, dirty room."
    as_json = post(torchserve, url, json={"text": query, "text_pair": passage})
    assert as_json.status_code == 200, as_json.text
    assert as_json.json()["scores"] != reference(decoy)["scores"]  # else the test could not tell them apart
    urlencoded = post(torchserve, url, data={"text": query, "text_pair": passage, "body": decoy})
    assert_same_answer(urlencoded, as_json.json())
    multipart = post(torchserve, url, files={"body": (None, ""), "text": (None, query), "text_pair": (None, passage)})
    assert_same_answer(multipart, as_json.json())
    assert_rejected(post(torchserve, url, data={"body": decoy}), 400, "FormWithoutText")


def test_curl_d_on_a_kserve_route_is_told_to_declare_json_and_that_fix_works(torchserve, model, review_file):
    # curl -d declares a form, so TorchServe parses the JSON as one before the handler sees it: only the header helps.
    v1 = f"{torchserve.inference_url}/v1/models/{model}:predict"
    document = json.dumps({"instances": [SHORT]})
    for arguments in (["-d", document], ["--data-binary", document]):
        body = assert_rejected(curl(torchserve, v1, *arguments, cwd=review_file.parent), 400, "FormWithoutText")
        assert '-H "Content-Type: application/json"' in body["message"], body
        assert "text/plain" not in body["message"] and "loved" not in body["message"]
    status, answer = curl(
        torchserve, v1, "-H", "Content-Type: application/json", "-d", document, cwd=review_file.parent
    )
    assert status == 200 and len(answer["predictions"]) == 1, answer


def test_a_hugging_face_style_body_is_pointed_to_the_text_field(torchserve, url, reference):
    # {"inputs": "..."} is what Hugging Face endpoints take; here it reads as a malformed v2 request: say what works.
    body = assert_rejected(post(torchserve, url, json={"inputs": SHORT}), 400, "MalformedRequest")
    assert '{"text": "..."} on /predictions' in body["message"] and SHORT not in body["message"]
    assert_same_answer(post(torchserve, url, json={"text": SHORT}), reference(SHORT))


def test_a_repeated_field_counts_once_the_last_one(torchserve, url, reference):
    # TorchServe's worker keeps one value per field name: the last one sent.
    response = post(torchserve, url, data=[("text", "first of two"), ("text", "second of two")])
    assert_same_answer(response, reference("second of two"))


def test_multipart_without_a_text_part(torchserve, url):
    response = post(torchserve, url, files={"file": ("review.txt", REVIEW.encode(), TEXT)})
    body = assert_rejected(response, 400, "FormWithoutText")
    assert "multipart form with 1 part" in body["message"] and '-F "text=@review.txt"' in body["message"]


@pytest.mark.parametrize(("body", "kind"), [(b"", "EmptyText"), (b"text=", "EmptyText"), (b"text=%20%20", "EmptyText")])
def test_forms_that_send_no_text(torchserve, url, body, kind):
    assert_rejected(post(torchserve, url, data=body, headers={"Content-Type": URLENCODED}), 400, kind)


def test_urlencoded_field_in_a_declared_charset(torchserve, url, reference):
    # "caf%E9" is Latin-1 percent-encoded; the form's charset says so.
    headers = {"Content-Type": f"{URLENCODED}; charset=ISO-8859-1"}
    assert_same_answer(post(torchserve, url, data=b"text=caf%E9+cr%E8me", headers=headers), reference("café crème"))
    plain = post(torchserve, url, data=b"text=caf%E9", headers={"Content-Type": URLENCODED})
    assert_rejected(plain, 400, "InvalidUTF8")


# ---- charsets and byte-order marks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("charset", "bom"),
    [
        ("utf-16", b""),
        ("UTF-16LE", b"\xff\xfe"),
        ("iso-8859-1", b""),
        ("windows-1252", b""),
        ("utf-8", b"\xef\xbb\xbf"),
    ],
)
def test_text_body_in_a_declared_charset(torchserve, url, reference, charset, bom):
    text = "Café crème, très bien"
    response = post(
        torchserve, url, data=bom + text.encode(charset), headers={"Content-Type": f"{TEXT}; charset={charset}"}
    )
    assert_same_answer(response, reference(text))


def test_utf8_byte_order_mark_in_text_and_json(torchserve, url, reference):
    bom = b"\xef\xbb\xbf"
    assert_same_answer(
        post(torchserve, url, data=bom + REVIEW.encode(), headers={"Content-Type": TEXT}), reference(REVIEW)
    )
    assert_same_answer(post(torchserve, url, data=bom + REVIEW.encode()), reference(REVIEW))  # no Content-Type
    document = bom + json.dumps({"text": REVIEW}).encode()
    assert_same_answer(post(torchserve, url, data=document, headers={"Content-Type": JSON}), reference(REVIEW))


def test_json_body_in_a_declared_charset(torchserve, url, reference):
    document = json.dumps({"text": REVIEW}, ensure_ascii=False).encode("utf-16")
    response = post(torchserve, url, data=document, headers={"Content-Type": f"{JSON}; charset=utf-16"})
    assert_same_answer(response, reference(REVIEW))


@pytest.mark.parametrize(
    ("data", "content_type", "status", "kind"),
    [
        (b"hello", "text/plain; charset=klingon", 415, "UnsupportedCharset"),
        (b"aGVsbG8=", "text/plain; charset=base64", 415, "UnsupportedCharset"),
        (b"odd", "text/plain; charset=utf-16", 400, "InvalidEncoding"),
        (b"caf\xe9", "text/plain", 400, "InvalidUTF8"),
    ],
)
def test_charset_errors(torchserve, url, data, content_type, status, kind):
    body = assert_rejected(post(torchserve, url, data=data, headers={"Content-Type": content_type}), status, kind)
    if status == 415:
        assert "UTF-8" in body["message"]


# ---- all of it at once, in shared batches -----------------------------------------------------------


def test_every_way_mixed_in_concurrent_batches(torchserve, url, reference):
    """Decoding is per item: formats, charsets and errors sharing a batch each get their own answer."""
    bom = b"\xef\xbb\xbf"
    ok = [
        ({"data": REVIEW.encode()}, REVIEW),
        ({"data": REVIEW.encode("utf-16"), "headers": {"Content-Type": f"{TEXT}; charset=utf-16"}}, REVIEW),
        ({"data": bom + json.dumps({"text": SHORT}).encode(), "headers": {"Content-Type": JSON}}, SHORT),
        ({"data": {"text": SHORT, "lang": "en"}}, SHORT),
        ({"files": {"text": ("review.txt", REVIEW.encode(), TEXT)}}, REVIEW),
        ({"files": {"data": (None, SHORT)}}, SHORT),
        ({"files": {"data": ("doc.json", json.dumps({"text": SHORT}), JSON)}}, SHORT),  # a part declared JSON
    ]
    bad = [
        ({"data": SHORT.encode(), "headers": {"Content-Type": URLENCODED}}, (400, "FormWithoutText")),
        ({"data": b"x", "headers": {"Content-Type": f"{TEXT}; charset=klingon"}}, (415, "UnsupportedCharset")),
        ({"data": b"", "headers": {"Content-Type": TEXT}}, (400, "EmptyText")),
        ({"files": {"file": (None, SHORT)}}, (400, "FormWithoutText")),
    ]
    requests_ = [case for _ in range(4) for case in ok + bad]
    expected = {text: reference(text) for text in (REVIEW, SHORT)}
    with ThreadPoolExecutor(max_workers=16) as pool:
        responses = list(pool.map(lambda case: post(torchserve, url, **case[0]), requests_))
    for (_, outcome), response in zip(requests_, responses):
        if isinstance(outcome, tuple):
            assert_rejected(response, *outcome)
        else:
            assert_same_answer(response, expected[outcome])


def test_form_values_never_reach_the_logs(torchserve, url, model):
    marker = "zq-form-marker-4711"
    post(torchserve, url, data=f"{marker} plain words", headers={"Content-Type": URLENCODED})
    post(torchserve, url, data={"comment": marker, "other": f"{marker}-value"})
    post(torchserve, url, files={"file": (None, marker)})
    logs_caught_up(torchserve, model)  # every line these requests made the server write is written
    assert marker not in torchserve.log_text()
