"""Reading a TorchServe model archive (.mar): its manifest and the model-config.yaml it carries."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import yaml

from handlers.options import HandlerOptions

# Where the archiver puts the checkpoint inside a .mar (tooling/archiving.stage, the handler's model_subdir).
MODEL_SUBDIR = HandlerOptions().model_subdir


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


def model_config(archive: Path) -> Any:
    """The archive's model-config.yaml as YAML reads it ({} for an empty one), None for an archive without one."""
    config_name = manifest_model(archive).get("configFile")
    if not config_name:
        return None
    with zipfile.ZipFile(archive) as mar:
        return yaml.safe_load(mar.read(config_name)) or {}


def handler_options(archive: Path) -> HandlerOptions:
    """The handler options of the archive's model-config.yaml (the defaults where it has none); ValueError for a
    section the handler would refuse at load, NotAnArchive for a file that is not an archive."""
    config = model_config(archive)
    section = config.get("handler") if isinstance(config, dict) else None
    if section is not None and not isinstance(section, dict):
        raise ValueError(f"{archive}: the handler section of its model-config.yaml is not a mapping")
    try:
        return HandlerOptions.from_mapping(section)
    except ValueError as exc:
        raise ValueError(f"{archive}: its model-config.yaml: {exc}") from exc


def archive_response_timeout(archive: Path, default: int) -> int:
    """The response timeout TorchServe 0.12 will use for `archive`: its model-config.yaml's, if it has one.

    With a model config in the archive TorchServe takes `responseTimeout` from it (default 120) and
    ignores the server's and the snapshot's value; without one the server's default applies.
    """
    config = model_config(archive)
    return default if config is None else int(config.get("responseTimeout", 120))


def archive_answers(archive: Path) -> tuple[tuple[str, ...], str] | None:
    """What a checkpoint archive answers with: its labels in class order and how its scores are read (softmax,
    sigmoid or none: handlers/scores.py), from the config.json it carries; None for an archive without one."""
    from handlers.loading import label_names
    from handlers.scores import score_function

    config_name = f"{MODEL_SUBDIR}/config.json"
    try:
        with zipfile.ZipFile(archive) as mar:
            config = json.loads(mar.read(config_name))
    except (OSError, zipfile.BadZipFile, KeyError, ValueError):
        return None
    labels = config.get("id2label") or {}
    count = config.get("num_labels") or len(labels) or 2  # transformers' PretrainedConfig default: two labels
    return tuple(label_names(labels, count)), score_function(config.get("problem_type"), count)  # JSON's keys: str
