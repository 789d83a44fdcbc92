"""The lock's pins less the requirements of an installed distribution, for pip's --constraint.

    python scripts/constraints_beside.py torch requirements.lock > constraints.txt

The set-up keeps a CUDA torch that a GPU image already has; that torch was installed with its own
dependencies, which the lock (compiled beside the CPU build) may contradict. Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Iterable
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def names_of(requirements: Iterable[str], extras: Iterable[str] = ()) -> set[str]:
    """The canonical names among requirements (importlib.metadata.requires' strings) needed without extras or with
    one of `extras` (a platform marker is not evaluated: such a requirement counts, so the lock never contradicts
    it)."""
    wanted = set(extras)
    names = set()
    for requirement in requirements:
        extra = re.search(r"""\bextra\s*==\s*["']([^"']+)["']""", requirement)
        if extra is None or extra[1] in wanted:
            names.add(canonical(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]))
    return names


def requirement_names(distribution: str) -> set[str]:
    """Names of the packages `distribution` requires when installed without extras."""
    return names_of(importlib.metadata.requires(distribution) or [])


def constraints_beside(distribution: str, lock_text: str) -> list[str]:
    """The lock's `name==version` lines whose package `distribution` does not require."""
    excluded = requirement_names(distribution)
    kept = []
    for line in lock_text.splitlines():
        pin = line.strip()
        if not pin or line.startswith((" ", "#")):
            continue
        if canonical(re.split(r"[\s=<>!~\[;]", pin, maxsplit=1)[0]) not in excluded:
            kept.append(pin)
    return kept


if __name__ == "__main__":
    distribution, lock = sys.argv[1:3]
    print("\n".join(constraints_beside(distribution, Path(lock).read_text())))
