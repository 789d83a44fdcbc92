"""tooling.torchserve.server_environment: the environment of every TorchServe the tooling starts (tests, benchmark,
soak, fleet replicas). The started server is checked in tests/e2e/test_service.py and tests/e2e/test_serve_sh.py."""

from __future__ import annotations

from tooling.torchserve import server_environment


def test_the_variables_that_would_replace_the_configuration_are_not_inherited(tmp_path, monkeypatch):
    # TorchServe 0.12 reads both whatever enable_envvars_config says: TS_CONFIG_FILE replaces the --ts-config file
    # (ts/model_server.py, ConfigManager), TS_OPEN_INFERENCE_PROTOCOL=oip turns the Open Inference mode on.
    monkeypatch.setenv("TS_CONFIG_FILE", str(tmp_path / "elsewhere.properties"))
    monkeypatch.setenv("TS_OPEN_INFERENCE_PROTOCOL", "oip")
    # One TorchServe reads only with enable_envvars_config=true, which no configuration here sets: passed on as is.
    monkeypatch.setenv("TS_SERVICE_ENVELOPE", "kserve")
    environment = server_environment(tmp_path)
    assert "TS_CONFIG_FILE" not in environment and "TS_OPEN_INFERENCE_PROTOCOL" not in environment
    assert environment["TS_SERVICE_ENVELOPE"] == "kserve"
    assert environment["LOG_LOCATION"] == str(tmp_path / "logs")
