"""End-to-end fixtures: a TorchServe started from exactly the generated cluster (KServe) configuration."""

from __future__ import annotations

import pytest

# What the fixture asks the generator for. A batching delay long enough that batches of several requests
# form reliably under the concurrent protocol tests (16 clients), and short enough that the answers for
# each text alone, one request at a time, each waiting it out, take seconds; every setting not named here
# is the generator's default.
CLUSTER_MODEL = "bert"
# The response timeout differs from model-config.yaml's on purpose: a test shows the configuration's wins.
CLUSTER_OPTIONS = {"batch_size": 8, "max_batch_delay": 30, "workers": 1, "response_timeout": 50}
# KServe's stock TorchServe runtime sets this variable to turn TorchServe's (batch-unsafe) envelope on.
# The fixture's server runs with it set, so every test against it shows that it changes nothing.
ENVELOPE_ENV = {"TS_SERVICE_ENVELOPE": "kserve"}
# The only keys the fixture may change: addresses and ports, to free loopback ones.
ADDRESS_KEYS = {
    "inference_address",
    "management_address",
    "metrics_address",
    "grpc_inference_port",
    "grpc_management_port",
}


@pytest.fixture(scope="module")
def kserve_layout(tiny_checkpoint, make_archive, model_store, tmp_path_factory):
    """(root, config path): the KServe storage layout built by the generator; root stands for /mnt/models."""
    from tooling.cluster_config import build_kserve_layout

    archive = make_archive(tiny_checkpoint, "cluster-tiny")
    root = tmp_path_factory.mktemp("mnt-models")
    config = build_kserve_layout(model_store / archive, root, CLUSTER_MODEL, root=str(root), **CLUSTER_OPTIONS)
    return root, config


@pytest.fixture(scope="module")
def kserve_config_server(kserve_layout, tmp_path_factory):
    """(server, model name): TorchServe started from exactly the generated config.properties.

    Only addresses and ports are changed (to free loopback ports); the model is loaded at start-up
    by the configuration itself (nothing is registered), without token authorization, and with
    TS_SERVICE_ENVELOPE=kserve in the server's environment.
    """
    from tests.support import server_from_layout
    from tooling.torchserve import read_properties

    root, config = kserve_layout
    generated = read_properties(config)
    server = server_from_layout(tmp_path_factory.mktemp("kserve-config-server"), root, config)
    changed = {
        key for key in generated.keys() | server.properties.keys() if generated.get(key) != server.properties.get(key)
    }
    assert changed <= ADDRESS_KEYS, f"the test server must run the generated configuration; changed: {changed}"
    with pytest.MonkeyPatch.context() as env:
        for name, value in ENVELOPE_ENV.items():
            env.setenv(name, value)  # captured by the server process at start; restored right after
        server.start()
    try:
        server.wait_until_ready(CLUSTER_MODEL)
        yield server, CLUSTER_MODEL
    finally:
        server.stop()
