"""Package any Hugging Face sequence-classification checkpoint into a TorchServe .mar.

    python -m scripts.archive_model path/to/checkpoint [--name bert] [--export-path model_store]

The work is done by tooling/archiving.py; this is its command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tooling.archiving import DEFAULT_CONFIG, NotACheckpoint, build_archive
from tooling.paths import MODEL_STORE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "checkpoint", type=Path, help="Hugging Face checkpoint folder (config.json, weights, tokenizer)"
    )
    parser.add_argument("--name", default="bert", help="model name, also the archive's file name (default: bert)")
    parser.add_argument("--version", default="1.0")
    parser.add_argument("--export-path", type=Path, default=MODEL_STORE)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="model-config.yaml with handler options")
    args = parser.parse_args(argv)
    try:
        build_archive(args.checkpoint, args.name, args.export_path, args.config, args.version)
    except NotACheckpoint as exc:
        print(f"archive_model: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
