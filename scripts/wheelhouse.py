"""An offline wheelhouse for a host that reaches no package index (an air-gapped GPU host, a locked-down cluster node):

    .venv/bin/python -m scripts.wheelhouse DIR [--python-version 3.12] [--platform manylinux_2_28_x86_64]
                                               [--extras test,bench] [--skip torch ...] [--only NAME ...]
                                               [--host-freeze FILE]

Every pin of requirements.lock that serving needs (with --extras, what those extras need too), as a wheel for that
Python and platform, in DIR. Which pins are needed is read from the project's installed metadata and the lock's own
`# via` notes; torch, and what only torch needs, is left out: a GPU host keeps its own CUDA torch (scripts/setup.sh).
A pin published only as a source distribution (nvgpu) is built into a wheel here, which must be pure Python to serve
another machine. Copied to the host, README command 1 installs from it with pip's own offline switches
(docs/development.md, "Set-up"):

    PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR scripts/serve.sh

Which packages the host already has is not guessed: --host-freeze reads its `pip freeze`, and a pin it has at the
lock's version is left out (pip keeps an installed package that meets the constraints).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from scripts.constraints_beside import canonical, names_of
from tooling.cli_arguments import existing_file
from tooling.paths import REPO

LOCK = REPO / "requirements.lock"
# pyproject.toml's [build-system] requires, by name: pip builds the project in an isolated environment, which it
# fills from the wheelhouse too (tests/unit/test_wheelhouse.py holds the two alike).
BUILD_REQUIREMENTS = ("setuptools",)
PROJECT = "bert-torchserve-batching"  # pyproject.toml's name, installed in .venv by scripts/setup.sh
PURE_TAG = re.compile(r"-py[23.]*-none-any\.whl$")  # py3-none-any, py2.py3-none-any
MIB = 1024 * 1024


@dataclass(frozen=True)
class Pin:
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def lock_parents(lock_text: str) -> dict[str, set[str]]:
    """Each pinned package (canonical name) -> the packages that require it, from the lock's `# via` notes (uv writes
    them; the project itself is `bert-torchserve-batching`, the "(pyproject.toml)" dropped)."""
    parents: dict[str, set[str]] = {}
    current = None
    for line in lock_text.splitlines():
        pin = pin_of(line)
        if pin is not None:
            current = canonical(pin.name)
            parents[current] = set()
            continue
        via = re.fullmatch(r"\s+#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)(?:\s+\(.*\))?", line)
        if current is not None and via and via[1] != "via":
            parents[current].add(canonical(via[1]))
    return parents


def closure(roots: Iterable[str], parents: dict[str, set[str]], skip: Iterable[str] = ()) -> set[str]:
    """The pinned packages `roots` need, directly or through one another. A skipped package is not followed, so what
    only it needs is not reached (torch's own, where the host keeps its torch); an unpinned one is followed (torch,
    which the lock leaves to the set-up's TORCH_SPEC, where the host installs it)."""
    children: dict[str, set[str]] = {}
    for package, required_by in parents.items():
        for parent in required_by:
            children.setdefault(parent, set()).add(package)
    skipped = {canonical(name) for name in skip}
    seen: set[str] = set()
    waiting = [root for root in roots if root not in skipped]
    while waiting:
        package = waiting.pop()
        if package not in seen:
            seen.add(package)
            waiting.extend(child for child in children.get(package, ()) if child not in skipped)
    return seen & set(parents)


def pin_of(line: str) -> Pin | None:
    """A `name==version` line of the lock or of `pip freeze` (not indented, no marker); None for any other line."""
    match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line.strip())
    return Pin(match[1], match[2]) if match and not line.startswith((" ", "#")) else None


def lock_pins(lock_text: str) -> list[Pin]:
    """The lock's `name==version` lines."""
    return [pin for pin in map(pin_of, lock_text.splitlines()) if pin is not None]


LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def compatible_platforms(platform: str) -> list[str]:
    """The wheel platform tags a host of `platform` installs: for manylinux_2_N, every older glibc's tag too and the
    legacy aliases (pip's --platform takes the tags literally: manylinux_2_28 alone misses a manylinux_2_17 wheel)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not match:
        return [platform, "any"]
    newest, arch = int(match[1]), match[2]
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 4, -1)]
    tags += [f"{legacy}_{arch}" for minor, legacy in LEGACY_MANYLINUX.items() if minor <= newest]
    return [*tags, "any"]


def host_has(freeze_text: str) -> set[str]:
    """`pip freeze`'s lines as `name==version` (canonical names): what the host already has, exactly."""
    pins = (pin_of(line) for line in freeze_text.splitlines())
    return {f"{canonical(pin.name)}=={pin.version}" for pin in pins if pin is not None}


def _pip(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *arguments], capture_output=True, text=True, check=False)


def fetch(pin: Pin, directory: Path, python_version: str, platform: str) -> str:
    """Put `pin`'s wheel for that Python and platform into `directory`; return how ("wheel" or "built")."""
    target = ["--python-version", python_version]
    for tag in compatible_platforms(platform):
        target += ["--platform", tag]
    downloaded = _pip("download", "--no-deps", "--only-binary=:all:", *target, "--dest", str(directory), str(pin))
    if downloaded.returncode == 0:
        return "wheel"
    if "No matching distribution" not in downloaded.stderr:
        raise RuntimeError(f"{pin}: pip download failed:\n{downloaded.stderr.strip()}")
    # No wheel for that target: build one from the source distribution, usable elsewhere only if pure Python.
    with tempfile.TemporaryDirectory() as scratch:
        built = _pip("wheel", "--no-deps", "--wheel-dir", scratch, str(pin))
        if built.returncode != 0:
            raise RuntimeError(f"{pin}: no wheel for Python {python_version}, and building one failed:\n{built.stderr}")
        wheels = list(Path(scratch).glob("*.whl"))
        impure = [wheel.name for wheel in wheels if not PURE_TAG.search(wheel.name)]
        if impure:
            raise RuntimeError(f"{pin}: no wheel for Python {python_version} on {platform}; built here: {impure}")
        for wheel in wheels:
            wheel.replace(directory / wheel.name)
    return "built"


def build(directory: Path, pins: Sequence[Pin], python_version: str, platform: str) -> list[str]:
    """Fetch every pin's wheel into `directory`; return the pins built here from source."""
    directory.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=4) as pool:  # pip's start dominates each fetch: a few at once
        outcomes = list(pool.map(lambda pin: fetch(pin, directory, python_version, platform), pins))
    return [str(pin) for pin, how in zip(pins, outcomes) if how == "built"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where the wheels go (made if missing)")
    parser.add_argument("--python-version", default="3.12", help="the host's Python, e.g. 3.12 (default)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="the host's wheel platform tag")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=["torch"],
        help="packages the host brings, and what only they need (default: torch, as a GPU host keeps its own; "
        "--skip with no name for a host that installs torch, whose wheel then comes from PyTorch's index)",
    )
    parser.add_argument(
        "--extras",
        default="",
        help="the project's extras beside what serving needs, as scripts/setup.sh's SETUP_EXTRAS (default: none, "
        "what scripts/serve.sh installs; test,bench for README command 2)",
    )
    parser.add_argument("--only", nargs="*", help="these packages of the lock alone")
    parser.add_argument(
        "--host-freeze",
        type=existing_file,
        help="the host's `pip freeze`: a pin it has at the lock's version is not fetched (another version is)",
    )
    arguments = parser.parse_args(argv)
    lock = LOCK.read_text()
    metadata = importlib.metadata.metadata(PROJECT)
    extras = {extra.strip() for extra in arguments.extras.split(",") if extra.strip()}
    unknown = extras - set(metadata.get_all("Provides-Extra") or [])
    if unknown:
        parser.error(f"{PROJECT} has no extra {', '.join(sorted(unknown))}")
    roots = names_of(importlib.metadata.requires(PROJECT) or [], extras) | set(BUILD_REQUIREMENTS)
    needed = closure(roots, lock_parents(lock), arguments.skip)
    pins = [pin for pin in lock_pins(lock) if canonical(pin.name) in needed]
    if arguments.only:
        wanted = {canonical(name) for name in arguments.only}
        pins = [pin for pin in pins if canonical(pin.name) in wanted]
        missing = wanted - {canonical(pin.name) for pin in pins}
        if missing:
            parser.error(f"not among the pins these extras need: {', '.join(sorted(missing))} (see --extras)")
    if arguments.host_freeze:
        have = host_has(arguments.host_freeze.read_text())
        pins = [pin for pin in pins if f"{canonical(pin.name)}=={pin.version}" not in have]
    try:
        built = build(arguments.directory, pins, arguments.python_version, arguments.platform)
    except RuntimeError as error:
        print(f"wheelhouse: {error}", file=sys.stderr)
        return 1
    wheels = sorted(arguments.directory.glob("*.whl"))
    size = sum(wheel.stat().st_size for wheel in wheels) / MIB
    print(f"{arguments.directory}: {len(wheels)} wheels, {size:.1f} MiB, for {len(pins)} pins of requirements.lock"
          + (f"; built here from source: {', '.join(built)}" if built else ""))  # fmt: skip
    print(f"offline set-up on the host: PIP_NO_INDEX=1 PIP_FIND_LINKS={arguments.directory} scripts/serve.sh")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
