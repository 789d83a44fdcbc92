"""Fine-tune the demo classifier (tooling/demo_model.py) into build/demo-model.

python -m scripts.build_demo_model [--out build/demo-model] [--force]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tooling.demo_model import AccuracyTooLow, NotTheExpectedBase, TrainingSettings, build_demo_model


def main(argv: list[str] | None = None) -> int:
    defaults = TrainingSettings()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=defaults.out)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--min-accuracy", type=float, default=defaults.min_accuracy)
    parser.add_argument("--force", action="store_true", help="train even if the stamp says the model is current")
    args = vars(parser.parse_args(argv))
    force = args.pop("force")
    try:
        build_demo_model(TrainingSettings(**args), force=force)
    except (AccuracyTooLow, NotTheExpectedBase) as exc:
        print(f"build_demo_model: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
