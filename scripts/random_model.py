"""Write a randomly initialised classifier checkpoint (tooling/checkpoints.py), for timing and tests.

python -m scripts.random_model OUT_DIR --size bert-base
python -m scripts.random_model OUT_DIR --head multi-label   # a head other than two-label softmax
"""

from __future__ import annotations

import argparse

from tooling.checkpoints import HEADS, SIZES, build_random_classifier
from tooling.cli_arguments import output_folder, seed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=output_folder)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--head", choices=sorted(HEADS), help="a head read through sigmoid or raw (handlers/scores.py)")
    args = parser.parse_args(argv)
    print(build_random_classifier(args.out_dir, args.size, args.seed, args.head))


if __name__ == "__main__":
    main()
