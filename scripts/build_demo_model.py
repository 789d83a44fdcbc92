"""Fine-tune the demo classifier (tooling/demo_model.py) into build/demo-model.

python -m scripts.build_demo_model [--out build/demo-model] [--force]
"""

from __future__ import annotations

import argparse
import sys

from tooling.cli_arguments import fraction, output_folder, positive_float, positive_int, seed
from tooling.demo_model import AccuracyTooLow, NotTheExpectedBase, TrainingSettings, build_demo_model


def main(argv: list[str] | None = None) -> int:
    defaults = TrainingSettings()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=output_folder, default=defaults.out)
    parser.add_argument("--epochs", type=positive_int, default=defaults.epochs)
    parser.add_argument("--lr", type=positive_float, default=defaults.lr)
    parser.add_argument("--batch-size", type=positive_int, default=defaults.batch_size)
    parser.add_argument("--seed", type=seed, default=defaults.seed)
    parser.add_argument("--threads", type=positive_int, default=defaults.threads)
    parser.add_argument("--min-accuracy", type=fraction, default=defaults.min_accuracy)
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
