"""tooling.torchserve.RunningServer: how the scripts reach a server started elsewhere, from its config and key file."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from tooling.torchserve import RunningServer, key_expiry


def write_server(folder: Path, properties: dict[str, str], keys: dict | None) -> tuple[Path, Path]:
    config = folder / "config.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    key_file = folder / "key_file.json"
    if keys is not None:
        key_file.write_text(json.dumps(keys))
    return config, key_file


def keys(inference: str, management: str = "m1") -> dict:
    stamp = "2999-01-01T00:00:00.123456789Z"
    return {
        "management": {"key": management, "expiration time": stamp},
        "inference": {"key": inference, "expiration time": stamp},
        "API": {"key": "api"},
    }


def test_addresses_store_and_lifetime_come_from_the_config_relative_to_where_the_server_started(tmp_path):
    config, key_file = write_server(
        tmp_path, {"management_address": "http://127.0.0.1:9081", "model_store": "store", "token_expiration_min": "5"},
        keys("i1"),
    )  # fmt: skip
    server = RunningServer.from_files(config, key_file)
    assert server.management_url == "http://127.0.0.1:9081"
    assert server.inference_url == "http://127.0.0.1:8080"  # TorchServe's default
    assert server.model_store == (tmp_path / "store").resolve()
    assert server.key_lifetime_min == 5.0
    assert server.headers("inference") == {"Authorization": "Bearer i1"}


def test_a_missing_key_file_is_an_error_unless_the_config_turns_authorization_off(tmp_path):
    config, key_file = write_server(tmp_path, {}, None)
    with pytest.raises(FileNotFoundError, match="is the server running"):
        RunningServer.from_files(config, key_file)
    config, key_file = write_server(tmp_path, {"disable_token_authorization": "true"}, None)
    assert RunningServer.from_files(config, key_file).headers("management") == {}


class RotatingServer:
    """Stands in for requests.Session against a TorchServe whose key is rotated by the first call's refusal:
    it holds `held`, and rewrites the key file to it when it first refuses another key."""

    def __init__(self, key_file: Path, held: str) -> None:
        self.key_file, self.held, self.sent = key_file, held, []

    def request(self, method: str, url: str, headers: dict, **kwargs) -> requests.Response:
        self.sent.append(headers["Authorization"])
        response = requests.Response()
        if headers["Authorization"] == f"Bearer {self.held}":
            response.status_code, response._content = 200, b"{}"
        else:
            response.status_code = 400
            response._content = b'{"code": 400, "type": "InvalidKeyException", "message": "Token ..."}'
            self.key_file.write_text(json.dumps(keys(self.held)))
        return response


def test_a_call_refused_during_a_rotation_is_made_again_with_the_new_key(tmp_path):
    config, key_file = write_server(tmp_path, {}, keys("old"))
    server = RunningServer.from_files(config, key_file)
    session = RotatingServer(key_file, held="new")
    response = server.request(session, "GET", "http://127.0.0.1:8080/ping", "inference", timeout=1)
    assert response.status_code == 200 and session.sent == ["Bearer old", "Bearer new"]


def test_a_key_refused_and_not_rotated_is_not_tried_again(tmp_path):
    config, key_file = write_server(tmp_path, {}, keys("old"))
    server = RunningServer.from_files(config, key_file)
    session = RotatingServer(key_file, held="old-but-expired")
    key_file.write_text(json.dumps(keys("old")))
    session.key_file = tmp_path / "elsewhere.json"  # the server's refusal rotates nothing this client reads
    response = server.request(session, "GET", "http://127.0.0.1:8080/ping", "inference", timeout=1)
    assert response.status_code == 400 and session.sent == ["Bearer old"]


@pytest.mark.parametrize("fraction", ["", ".1", ".123", ".123456", ".123456789"])
def test_key_expiry_reads_javas_instants(fraction):
    expected = datetime(2026, 11, 24, 13, 35, 48, int((fraction[1:] + "000000")[:6] or 0), tzinfo=timezone.utc)
    assert key_expiry(f"2026-11-24T13:35:48{fraction}Z") == expected
