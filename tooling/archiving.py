"""Package any Hugging Face sequence-classification checkpoint into a TorchServe .mar.

The archive holds the checkpoint under model/, the handlers package as it is in
this repository (the code the tests import), and model-config.yaml whose
`handler:` section holds the handler options. Two backends: "pytorch" packs the
checkpoint as it is; "onnx" packs model.onnx (exported and checked against PyTorch
by tooling/onnx_export.py, optionally int8) with the tokenizer and config.json and
no PyTorch weights, and the handler serves it with ONNX Runtime.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from handlers.loading import ModelLoadFailed, refuse_a_tokenizer_without_a_vocabulary
from handlers.onnx_forward import ONNX_FILE
from handlers.scores import score_function
from tooling.onnx_export import DEFAULT_MIN_AGREEMENT, WEIGHT_FILES, export_checkpoint
from tooling.paths import HANDLERS, MODEL_CONFIG, MODEL_STORE

DEFAULT_CONFIG = MODEL_CONFIG
BACKENDS = ("pytorch", "onnx")


def write_model_config(
    path: Path, model_config: dict | None = None, base: Path = DEFAULT_CONFIG, **handler_options
) -> Path:
    """A model-config.yaml (the repository's, or `base`) with some settings changed, written to `path`."""
    import yaml

    config = yaml.safe_load(Path(base).read_text())
    config.update(model_config or {})
    config["handler"].update(handler_options)
    path.write_text(yaml.safe_dump(config))
    return path


def parse_handler_option(value: str) -> tuple[str, object]:
    """A command line's KEY=VALUE for one handler option, the value read as YAML (so `true`, `2` and
    `0.5` get their types) as in model-config.yaml. For argparse's `type=`: raises its ArgumentTypeError."""
    import argparse

    import yaml

    key, sep, raw = value.partition("=")
    if not key.strip() or not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key.strip(), yaml.safe_load(raw)


def add_handler_option_argument(parser, help: str) -> None:
    """`--handler-option KEY=VALUE` (repeatable) on an argparse parser; the values land in a list of pairs."""
    parser.add_argument(
        "--handler-option", type=parse_handler_option, action="append", default=[], metavar="KEY=VALUE", help=help
    )


class NotACheckpoint(ValueError):
    """The folder is not a loadable Hugging Face sequence-classification checkpoint."""


def check_checkpoint(checkpoint: Path) -> None:
    """Fail early, before archiving, if the folder is not a loadable classifier checkpoint."""
    from transformers import AutoConfig, AutoTokenizer

    if not checkpoint.is_dir():
        raise NotACheckpoint(f"{checkpoint}: no such folder; expected a Hugging Face checkpoint folder")
    if not (checkpoint / "config.json").is_file():
        raise NotACheckpoint(f"{checkpoint}: no config.json; expected a Hugging Face checkpoint folder")
    if not any((checkpoint / name).is_file() for name in WEIGHT_FILES):
        raise NotACheckpoint(f"{checkpoint}: no weights ({', '.join(WEIGHT_FILES)})")
    config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    try:
        refuse_a_tokenizer_without_a_vocabulary(len(tokenizer), config, checkpoint)
    except ModelLoadFailed as refused:
        raise NotACheckpoint(str(refused)) from None
    scores = score_function(getattr(config, "problem_type", None), config.num_labels)
    print(f"checkpoint: {config.model_type}, labels {config.id2label}, scores {scores} (handlers/scores.py)")


def stage(checkpoint: Path, staging: Path) -> None:
    model_dir = staging / "model"
    model_dir.mkdir(parents=True)
    for item in checkpoint.iterdir():
        if item.is_file():
            shutil.copy2(item, model_dir / item.name)
    shutil.copytree(HANDLERS, staging / "handlers", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def build_archive(
    checkpoint: Path,
    name: str = "bert",
    export_path: Path = MODEL_STORE,
    config_file: Path = DEFAULT_CONFIG,
    version: str = "1.0",
    backend: str = "pytorch",
    quantize: str | None = None,
    min_agreement: float | None = None,
    eval_tsv: Path | None = None,
    file_name: str | None = None,
) -> Path:
    """Write <export_path>/<file_name> (default <name>.mar) as pack_archive does; the onnx backend exports first
    and raises (tooling.onnx_export's ExportFailed, ParityError, AgreementTooLow) before anything is written if
    the checks fail."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "onnx" and (quantize or min_agreement is not None or eval_tsv is not None):
        raise ValueError("quantize, min_agreement and eval_tsv apply to the onnx backend only")
    checkpoint = checkpoint.resolve()
    check_checkpoint(checkpoint)
    if backend == "pytorch":
        return pack_archive(checkpoint, name, export_path, config_file, version, file_name)
    with tempfile.TemporaryDirectory(prefix="onnx-checkpoint-") as tmp:
        exported = Path(tmp) / "model"
        agreement = DEFAULT_MIN_AGREEMENT if min_agreement is None else min_agreement
        export_checkpoint(checkpoint, exported, quantize, eval_tsv, agreement)
        return pack_archive(exported, name, export_path, config_file, version, file_name)


def archive_file_name(name: str, file_name: str | None = None) -> str:
    """The archive's file name: `file_name`, or <name>.mar (torch-model-archiver's own)."""
    file_name = file_name or f"{name}.mar"
    if Path(file_name).name != file_name or not file_name.endswith(".mar") or file_name.startswith("."):
        raise ValueError(f"the archive's file name must be a plain NAME.mar, got {file_name!r}")
    return file_name


def pack_archive(
    model_dir: Path,
    name: str = "bert",
    export_path: Path = MODEL_STORE,
    config_file: Path = DEFAULT_CONFIG,
    version: str = "1.0",
    file_name: str | None = None,
) -> Path:
    """Pack a ready folder (a checkpoint, or an ONNX checkpoint from tooling.onnx_export) as the archive's model/,
    into <export_path>/<file_name> (default <name>.mar; the manifest's model name is `name` either way).

    torch-model-archiver writes its zip in place and the manifest last, so a write cut short (a kill, a full
    disk) would leave a truncated archive under the final name, newer than its sources. It writes into a
    private folder inside `export_path` instead (the same file system), and only the finished archive is
    renamed over the target: the old file or the new one is there, never part of one, and a failure leaves
    the old file as it was (a process killed meanwhile leaves that folder, .<file name>.*.partial, behind).
    """
    target = Path(export_path) / archive_file_name(name, file_name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="mar-staging-") as tmp,
        tempfile.TemporaryDirectory(prefix=f".{target.name}.", suffix=".partial", dir=target.parent) as out,
    ):
        staging = Path(tmp)
        stage(Path(model_dir), staging / "content")
        command = [
            str(Path(sys.executable).with_name("torch-model-archiver")),
            "--model-name", name,
            "--version", version,
            "--handler", str(HANDLERS / "bert_handler.py"),
            "--extra-files", str(staging / "content"),
            "--config-file", str(config_file),
            "--export-path", out,
            "--force",
        ]  # fmt: skip
        # The archiver stages files in $TMPDIR/<model name> and deletes that folder
        # first; a private TMPDIR keeps it from wiping an unrelated /tmp/<name>.
        env = {**os.environ, "TMPDIR": str(staging / "archiver-tmp")}
        (staging / "archiver-tmp").mkdir()
        subprocess.run(command, check=True, env=env)
        built = Path(out) / f"{name}.mar"
        with built.open("rb") as written:
            os.fsync(written.fileno())  # on disk before the rename makes it the archive
        os.replace(built, target)
    backend = "onnx" if (Path(model_dir) / ONNX_FILE).is_file() else "pytorch"
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB, {backend})")
    return target
