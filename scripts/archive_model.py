"""Package any Hugging Face sequence-classification checkpoint into a TorchServe .mar.

    python -m scripts.archive_model path/to/checkpoint [--name bert] [--export-path model_store]
    python -m scripts.archive_model path/to/checkpoint --backend onnx                 # ONNX Runtime, fp32
    python -m scripts.archive_model path/to/checkpoint --backend onnx --quantize int8 [--eval-tsv labelled.tsv]

The ONNX backend exports the checkpoint, refuses if any probability differs from PyTorch's by
more than 1e-4 on a fixed set of texts, and with --quantize int8 also refuses below 99 % label
agreement with PyTorch (--min-agreement changes the bar) on the demo model's held-out reviews,
on --eval-tsv (label<TAB>text rows) for other checkpoints, or on the fixed texts. The work is
done by tooling/archiving.py and tooling/onnx_export.py; this is their command line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from handlers.options import HandlerOptions
from tooling.archiving import (
    BACKENDS,
    DEFAULT_CONFIG,
    NotACheckpoint,
    add_handler_option_argument,
    build_archive,
    write_model_config,
)
from tooling.onnx_export import QUANTIZATIONS, ExportFailed
from tooling.paths import MODEL_STORE


def fraction(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not a fraction between 0 and 1 (0.99 means 99 %)")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "checkpoint", type=Path, help="Hugging Face checkpoint folder (config.json, weights, tokenizer)"
    )
    parser.add_argument("--name", default="bert", help="model name, also the archive's file name (default: bert)")
    parser.add_argument("--version", default="1.0")
    parser.add_argument("--export-path", type=Path, default=MODEL_STORE)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="model-config.yaml with handler options")
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
        "--eval-tsv", type=Path, help="onnx: labelled texts (label<TAB>text) for label agreement and accuracy"
    )
    args = parser.parse_args(argv)
    if args.backend != "onnx" and (args.quantize or args.min_agreement is not None or args.eval_tsv is not None):
        parser.error("--quantize, --min-agreement and --eval-tsv need --backend onnx")
    if args.quantize is None and args.min_agreement is not None:
        parser.error("--min-agreement applies to --quantize int8")
    try:
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
            )
    except (NotACheckpoint, ExportFailed, ValueError) as exc:
        print(f"archive_model: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"archive_model: torch-model-archiver failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
