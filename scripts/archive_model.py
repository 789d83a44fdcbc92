"""Package any Hugging Face sequence-classification checkpoint into a TorchServe .mar.

    python -m scripts.archive_model path/to/checkpoint [--name bert] [--export-path model_store]
    python -m scripts.archive_model path/to/checkpoint --backend onnx                 # ONNX Runtime, fp32
    python -m scripts.archive_model path/to/checkpoint --backend onnx --quantize int8 [--eval-tsv labelled.tsv]
    python -m scripts.archive_model path/to/checkpoint --name bert --version 2.0 --file-name bert-2.0.mar

The ONNX backend exports the checkpoint, refuses if any probability differs from PyTorch's by
more than 1e-4 on a fixed set of texts, and with --quantize int8 also refuses below 99 % label
agreement with PyTorch (--min-agreement changes the bar) on the demo model's held-out reviews,
on --eval-tsv (label<TAB>text rows) for other checkpoints, or on the fixed texts. The work is
done by tooling/archiving.py and tooling/onnx_export.py; this is their command line.

The archive is written whole or not at all: a failure leaves the file that was there as it was. Into
the model store of the running server (scripts/serve.sh's, or --server-config's), it refuses to write
over the file a registered model was loaded from with another version: that file is what a restart
registers, so a new version gets a file name of its own (--file-name) and scripts.update_model, which
puts it there once it serves. The same version written over it (scripts/setup.sh rebuilding
model_store/bert.mar) is warned about: the server keeps what it loaded, and a restart loads the new file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import requests
import yaml

from handlers.options import HandlerOptions
from tooling.archiving import (
    BACKENDS,
    DEFAULT_CONFIG,
    NotACheckpoint,
    add_handler_option_argument,
    archive_file_name,
    build_archive,
    write_model_config,
)
from tooling.cli_arguments import existing_file, fraction, model_name, model_version, output_folder
from tooling.model_archive import handler_options
from tooling.model_update import KeyRefused, registered_from
from tooling.onnx_export import QUANTIZATIONS, ExportFailed
from tooling.paths import MODEL_STORE
from tooling.torchserve import SERVE_SH_CONFIG, SERVE_SH_KEY_FILE, RunningServer


def served_from(target: Path, name: str, version: str, server_config: Path, key_file: Path) -> str | None:
    """Why `target` must not be written over (None: it may): it is in the running server's model store, and a
    version other than `name` `version` (another version, or another model) was registered from it, or is
    registered under the model whose restart archive it is (NAME.mar). Warns on stderr when only that one is."""
    if not target.is_file() or not server_config.is_file():
        return None
    try:
        server = RunningServer.from_files(server_config, key_file)
    except OSError:  # no key file: that server is not running
        return None
    if target.parent.resolve() != server.model_store:
        return None
    try:
        registered = registered_from(server, target.name)
    except requests.ConnectionError:  # nothing listens: nothing is registered
        return None
    except (requests.RequestException, KeyRefused, ValueError) as error:
        print(f"archive_model: WARNING: could not ask the running server what it loaded from {target} ({error})",
              file=sys.stderr)  # fmt: skip
        return None
    loaded = ", ".join(f"{model} {loaded_version}" for model, loaded_version in registered)
    if any((model, loaded_version) != (name, version) for model, loaded_version in registered):
        # Another version, or another model: a restart would register what this writes in its place.
        return (
            f"{target} is the archive of {loaded} on the running server (registered from it, or what a restart "
            f"registers): written over with {name} {version}, a restart would serve {name} {version} in its place, "
            f"unchecked. Archive it under a file name of its own (--file-name {name}-{version}.mar) and serve it with "
            f"python -m scripts.update_model, which puts it at {target.name} once it serves (docs/checkpoints.md)"
        )
    if registered:
        print(
            f"archive_model: WARNING: {target} is the archive of {loaded} on the running server: it keeps serving "
            "what it loaded, and a restart registers this new archive, unchecked",
            file=sys.stderr,
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "checkpoint", type=Path, help="Hugging Face checkpoint folder (config.json, weights, tokenizer)"
    )
    parser.add_argument(
        "--name", type=model_name, default="bert", help="model name, and the archive's file name unless --file-name"
    )
    parser.add_argument("--version", type=model_version, default="1.0", help="the model's version (default 1.0)")
    parser.add_argument("--export-path", type=output_folder, default=MODEL_STORE)
    parser.add_argument(
        "--file-name", help="the archive's file name in --export-path (default NAME.mar), e.g. for a new version"
    )
    parser.add_argument(
        "--server-config",
        type=Path,
        default=SERVE_SH_CONFIG,
        help="the running server's config.properties (default: scripts/serve.sh's), whose store is checked",
    )
    parser.add_argument("--key-file", type=Path, default=SERVE_SH_KEY_FILE, help="that server's key_file.json")
    parser.add_argument(
        "--config", type=existing_file, default=DEFAULT_CONFIG, help="model-config.yaml with handler options"
    )
    add_handler_option_argument(
        parser, "override one option of --config's handler: section (repeatable), e.g. cpu_threads=1"
    )
    parser.add_argument(
        "--backend", choices=BACKENDS, default="pytorch", help="pytorch (default; GPUs) or onnx (ONNX Runtime, CPUs)"
    )
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="onnx only: ONNX Runtime dynamic quantization")
    parser.add_argument(
        "--min-agreement",
        type=fraction,
        help="with --quantize: least fraction of labels equal to PyTorch's (default 0.99)",
    )
    parser.add_argument(
        "--eval-tsv", type=existing_file, help="onnx: labelled texts (label<TAB>text) for label agreement and accuracy"
    )
    args = parser.parse_args(argv)
    if args.backend != "onnx" and (args.quantize or args.min_agreement is not None or args.eval_tsv is not None):
        parser.error("--quantize, --min-agreement and --eval-tsv need --backend onnx")
    if args.quantize is None and args.min_agreement is not None:
        parser.error("--min-agreement applies to --quantize int8")
    try:
        target = args.export_path / archive_file_name(args.name, args.file_name)
        refusal = served_from(target, args.name, args.version, args.server_config, args.key_file)
        if refusal:
            raise ValueError(refusal)
        with tempfile.TemporaryDirectory(prefix="model-config-") as tmp:
            config = args.config
            if args.handler_option:
                # Checked like the handler checks it at load, so a typo fails here, not in the worker.
                config = write_model_config(
                    Path(tmp) / "model-config.yaml", None, args.config, **dict(args.handler_option)
                )
                HandlerOptions.from_mapping(yaml.safe_load(config.read_text())["handler"])
            build_archive(
                args.checkpoint,
                args.name,
                args.export_path,
                config,
                args.version,
                backend=args.backend,
                quantize=args.quantize,
                min_agreement=args.min_agreement,
                eval_tsv=args.eval_tsv,
                file_name=args.file_name,
            )
        try:
            options = handler_options(target)
        except ValueError:  # a --config its workers will refuse at load (a test's deliberately failing archive)
            options = None
        # CUDA graphs: a GPU's archive, which serve.sh serves with 8 workers a GPU.
        if options is not None and options.cpu_threads == 0 and not options.cuda_graphs:
            print(f"    {target.name}: cpu_threads 0, every CPU in each worker: on a CPU host scripts/serve.sh "
                  "starts one worker; --handler-option cpu_threads=1 gives one per CPU, the layout measured fastest "
                  "(docs/batching.md)")  # fmt: skip
    except (NotACheckpoint, ExportFailed, ValueError) as exc:
        print(f"archive_model: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"archive_model: torch-model-archiver failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
