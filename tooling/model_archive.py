"""Reading a TorchServe model archive (.mar): its manifest and the model-config.yaml it carries."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import yaml


class NotAnArchive(ValueError):
    """The file is not a TorchServe model archive (.mar) with a manifest."""


def manifest_model(archive: Path) -> dict:
    """The manifest's `model` entry (modelName, modelVersion, handler, configFile ...)."""
    try:
        with zipfile.ZipFile(archive) as mar:
            return json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise NotAnArchive(f"{archive}: not a TorchServe model archive ({exc})") from exc


# The version TorchServe 0.12 gives an archive whose manifest names none (ModelManager.createModelArchive):
# torch-model-archiver leaves it out for an empty --version, which archives made elsewhere may have.
UNVERSIONED = "1.0"


def archive_version(archive: Path) -> str:
    """The model version TorchServe registers a .mar by: its manifest's (scripts/archive_model.py --version)."""
    version = manifest_model(archive).get("modelVersion")
    return UNVERSIONED if version is None else str(version)


def archive_name(archive: Path) -> str:
    """The model name recorded in a .mar (scripts/archive_model.py --name)."""
    return str(manifest_model(archive)["modelName"])


def archive_response_timeout(archive: Path, default: int) -> int:
    """The response timeout TorchServe 0.12 will use for `archive`: its model-config.yaml's, if it has one.

    With a model config in the archive TorchServe takes `responseTimeout` from it (default 120) and
    ignores the server's and the snapshot's value; without one the server's default applies.
    """
    config_name = manifest_model(archive).get("configFile")
    if not config_name:
        return default
    with zipfile.ZipFile(archive) as mar:
        config = yaml.safe_load(mar.read(config_name)) or {}
    return int(config.get("responseTimeout", 120))
