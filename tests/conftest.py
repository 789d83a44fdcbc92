"""Shared fixtures: tiny and demo checkpoints, a minimal TorchServe context, a real TorchServe."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from scripts.inprocess import load_handler, unpacked_layout

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def unseen_reviews() -> list[tuple[str, str]]:
    """(label, text) pairs written for the tests; none of them is in data/."""
    with (DATA / "unseen_reviews.tsv").open(encoding="utf-8") as f:
        return [(label, text) for label, text in csv.reader(f, delimiter="\t")]


# ---- checkpoints and archives ---------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from scripts.random_model import build_random_classifier

    return build_random_classifier(tmp_path_factory.mktemp("tiny") / "checkpoint", "tiny", seed=0)


@pytest.fixture(scope="session")
def demo_checkpoint() -> Path:
    """The trained demo model; scripts/setup.sh builds it, and so does this fixture if it is missing."""
    from scripts.build_demo_model import DEFAULT_OUT, main

    if not (DEFAULT_OUT / "model.safetensors").exists():
        main([])
    return DEFAULT_OUT


@pytest.fixture(scope="session")
def model_store(tmp_path_factory) -> Path:
    """A private model store: tests never touch the repository's model_store/."""
    return tmp_path_factory.mktemp("model_store")


@pytest.fixture(scope="session")
def make_archive(model_store, tmp_path_factory):
    """Build <name>.mar into the private store from a checkpoint and optional handler options."""
    from scripts.archive_model import build_archive, write_model_config

    def make(checkpoint: Path, name: str, model_config: dict | None = None, **handler_options) -> str:
        config = write_model_config(
            tmp_path_factory.mktemp("config") / "model-config.yaml", model_config, **handler_options
        )
        build_archive(checkpoint, name=name, export_path=model_store, config_file=config)
        return f"{name}.mar"

    return make


# ---- in-process handler ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def unpacked_model_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    return unpacked_layout(tiny_checkpoint, tmp_path_factory.mktemp("unpacked"))


def statuses(context, n: int) -> list[int]:
    return [context.get_response_status(i)[0] for i in range(n)]


@pytest.fixture(scope="session")
def loaded_handler(unpacked_model_dir):
    return load_handler(unpacked_model_dir)


# ---- a real TorchServe ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def torchserve(model_store, tmp_path_factory):
    """One real TorchServe on free loopback ports, with its own store, logs and keys."""
    from scripts.torchserve_process import TorchServe

    server = TorchServe(tmp_path_factory.mktemp("torchserve"), model_store)
    server.start()
    try:
        yield server
    finally:
        server.stop()
