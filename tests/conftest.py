"""Shared fixtures: tiny and demo checkpoints, archives, the in-process handler, a real TorchServe.

Tests are laid out by what they drive: unit/ (pure functions), inprocess/ (the handler
with TorchServe's own Context, no server), e2e/ (real torchserve processes over HTTP).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import SHARED_MODEL
from tooling.inprocess import load_handler, unpacked_layout

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# OpenMP threads (PyTorch's pools, in the test processes and in the TorchServe workers they start, which inherit
# this) wait for work without spinning: scripts/test.sh runs two test processes on CI's two cores, and a pool
# spinning beside the other process's test stole the cores it waited on (figures: docs/development.md, "Tests").
# Set here, before anything imports torch (libgomp reads it once, as torch loads), so it holds however the suite
# is run; an OMP_WAIT_POLICY already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _split_ports_between_processes() -> None:
    """Under pytest-xdist (scripts/test.sh runs two processes) each process draws free ports from its own share of
    the range (tooling/torchserve.PORT_RANGE_VARIABLE), and so do the fleet CLIs and servers it starts, which
    inherit it: a port one process chose and holds unbound for a while (the fleet's surge slot, chosen at `up`)
    cannot be drawn by the other. Seen once without it: "the surge replica's ports ... are taken"."""
    from tests.support import port_share
    from tooling.torchserve import PORT_RANGE_VARIABLE

    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker is None or count is None or PORT_RANGE_VARIABLE in os.environ:
        return
    low, high = port_share(int(worker.removeprefix("gw")), int(count))
    os.environ[PORT_RANGE_VARIABLE] = f"{low}-{high}"


_split_ports_between_processes()

# Under CI the fuzz tests draw the same examples every run, so a submission's verdict never rests on
# the draw; elsewhere each run explores new ones (a failure found there is kept in .hypothesis/).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked gpu run only where torch sees a CUDA device; elsewhere they are skipped, with why."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU build"
    reason = f"needs a CUDA GPU: torch {torch.__version__} ({built}) sees none"
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


# ---- checkpoints and archives ---------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from tooling.checkpoints import build_random_classifier

    return build_random_classifier(tmp_path_factory.mktemp("tiny") / "checkpoint", "tiny", seed=0)


@pytest.fixture(scope="session")
def demo_checkpoint() -> Path:
    """The trained demo model; scripts/setup.sh builds it, and so does this fixture if it is missing."""
    from tooling.demo_model import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="session")
def model_store(tmp_path_factory) -> Path:
    """A private model store: tests never touch the repository's model_store/."""
    return tmp_path_factory.mktemp("model_store")


@pytest.fixture(scope="session")
def make_archive(model_store, tmp_path_factory):
    """Build <name>.mar into the private store from a checkpoint and optional handler options."""
    from tooling.archiving import build_archive, write_model_config

    def make(
        checkpoint: Path, name: str, model_config: dict | None = None, version: str = "1.0", **handler_options
    ) -> str:
        config = write_model_config(
            tmp_path_factory.mktemp("config") / "model-config.yaml", model_config, **handler_options
        )
        build_archive(checkpoint, name=name, export_path=model_store, config_file=config, version=version)
        return f"{name}.mar"

    return make


# ---- in-process handler ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def unpacked_model_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    return unpacked_layout(tiny_checkpoint, tmp_path_factory.mktemp("unpacked"))


@pytest.fixture(scope="session")
def loaded_handler(unpacked_model_dir):
    return load_handler(unpacked_model_dir)


# ---- a real TorchServe ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def torchserve(model_store, tmp_path_factory):
    """One real TorchServe on free loopback ports, with its own store, logs and keys."""
    from tooling.torchserve import TorchServe

    server = TorchServe(tmp_path_factory.mktemp("torchserve"), model_store)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# The tiny model registered once for every end-to-end module that needs no handler options of
# its own; each module that needs other options or batching registers its own archive.


@pytest.fixture(scope="session")
def shared_model(torchserve, tiny_checkpoint, make_archive) -> str:
    archive = make_archive(tiny_checkpoint, SHARED_MODEL)
    # A short delay still forms batches under the concurrent tests' 16-30 clients.
    response = torchserve.register(archive, batch_size=8, max_batch_delay=20)
    assert response.status_code == 200, response.text
    return SHARED_MODEL


@pytest.fixture
def sigterm_kept():
    """The commands set their own SIGTERM handler as they start (tooling/termination.py); a test that runs one's
    main() in this process keeps the test process's own."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)
