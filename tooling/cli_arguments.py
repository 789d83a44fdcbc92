"""argparse types for the commands in scripts/.

A value that cannot mean anything (0 epochs, a negative wait, an infinite rate, an empty list, a folder where a file
is expected) is refused as the command line is read, so a command stops with its usage and one line saying why (exit
2) before it loads, trains, writes or starts anything; deeper in, such a value became a traceback minutes into a
run, a half-written layout, or a silent nonsense (0 replicas behind a started HAProxy).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

# torch.manual_seed and numpy's generators both take seeds below 2**32.
SEED_LIMIT = 2**32

# A model's name and version are each one segment of TorchServe's and KServe's URLs (/models/NAME/VERSION,
# /v1/models/NAME:predict) and name files in the store (NAME.mar): torch-model-archiver's own pattern for names. It
# checks no version: an empty one left the manifest without a version (TorchServe registered it as 1.0, and
# tooling.model_archive.archive_version, which scripts.update_model and the cluster snapshot read, failed with a
# KeyError), and "1.0/x" names no version in a URL.
URL_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
URL_SEGMENT_RULE = "letters, digits, '_', '-' and '.', starting with a letter or digit"

T = TypeVar("T", int, float)


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None


def _finite(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number")
    return number


def _bounded(read: Callable[[str], T], value: str, is_within: Callable[[T], bool], why: str) -> T:
    """`value` read by `read`, refused with "<value> <why>" unless `is_within` holds for it."""
    number = read(value)
    if not is_within(number):
        raise argparse.ArgumentTypeError(f"{value} {why}")
    return number


def positive_int(value: str) -> int:
    return _bounded(_whole, value, lambda n: n >= 1, "is not a whole number of 1 or more")


def non_negative_int(value: str) -> int:
    return _bounded(_whole, value, lambda n: n >= 0, "is negative")


def seed(value: str) -> int:
    return _bounded(non_negative_int, value, lambda n: n < SEED_LIMIT, f"is not a seed (0 to {SEED_LIMIT - 1})")


def positive_float(value: str) -> float:
    return _bounded(_finite, value, lambda n: n > 0, "is not more than 0")


def non_negative_float(value: str) -> float:
    return _bounded(_finite, value, lambda n: n >= 0, "is negative")


def fraction(value: str) -> float:
    return _bounded(_finite, value, lambda n: 0.0 <= n <= 1.0, "is not a fraction between 0 and 1 (0.99 means 99 %)")


def list_of(item: Callable[[str], int | float]) -> Callable[[str], list]:
    """A comma-separated list, at least one item, each read by `item` (e.g. list_of(positive_int): "1,16,64")."""

    def parse(value: str) -> list:
        parts = value.split(",")
        if not value or any(not part.strip() for part in parts):
            raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of values (e.g. 1,16,64)")
        return [item(part.strip()) for part in parts]

    parse.__name__ = f"list of {item.__name__}"
    return parse


def _url_segment(value: str, what: str) -> str:
    if not URL_SEGMENT.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a {what}: {URL_SEGMENT_RULE}")
    return value


def model_name(value: str) -> str:
    return _url_segment(value, "model name")


def model_version(value: str) -> str:
    return _url_segment(value, "model version (e.g. 2.0)")


def _existing(value: str, noun: str, is_it: Callable[[Path], bool]) -> Path:
    path = Path(value)
    if not value or not path.exists():
        raise argparse.ArgumentTypeError(f"{value!r}: no such {noun}")
    if not is_it(path):
        raise argparse.ArgumentTypeError(f"{value!r} is not a {noun}")
    return path


def existing_file(value: str) -> Path:
    return _existing(value, "file", Path.is_file)


def existing_folder(value: str) -> Path:
    return _existing(value, "folder", Path.is_dir)


def output_folder(value: str) -> Path:
    """A folder to write into: made if it is missing; never '' (the current folder, by accident) or a file."""
    path = Path(value)
    if not value:
        raise argparse.ArgumentTypeError("an empty path (give '.' for the current folder)")
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a file, not a folder")
    return path
