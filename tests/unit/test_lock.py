"""requirements.lock: the environment the suite runs in is exactly the locked one, and so is the image's."""

from __future__ import annotations

from importlib import metadata

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tooling.paths import REPO

LOCK = REPO / "requirements.lock"
IMAGE_REQUIREMENTS = REPO / "deploy" / "docker" / "requirements.txt"


def pins(path) -> dict[str, str]:
    """name -> version of every `name==version` line (comments and `# via` annotations skipped)."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            [spec] = requirement.specifier
            assert spec.operator == "==", f"{path.name}: not pinned: {line}"
            found[canonicalize_name(requirement.name)] = spec.version
    return found


def test_every_locked_package_is_installed_at_its_locked_version():
    # What scripts/setup.sh installed (with the lock as constraints) is what the tests run on.
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    differing = {name: (version, installed.get(name)) for name, version in pins(LOCK).items()}
    assert {name: pair for name, pair in differing.items() if pair[0] != pair[1]} == {}


def test_the_lock_covers_the_project_and_its_extras_but_leaves_torch_to_the_set_up():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    declared += project["optional-dependencies"]["bench"]
    locked = pins(LOCK)
    assert "torch" not in locked  # TORCH_SPEC in scripts/setup.sh picks the CPU or a CUDA build
    for requirement in map(Requirement, declared):
        name = canonicalize_name(requirement.name)
        if name != "torch":
            assert name in locked, f"{name} is not in requirements.lock: run scripts/lock.sh"
            assert requirement.specifier.contains(locked[name]), (name, locked[name], str(requirement.specifier))


def test_the_image_installs_the_locked_versions():
    locked = pins(LOCK)
    image = pins(IMAGE_REQUIREMENTS)
    assert image
    assert {name: (version, locked.get(name)) for name, version in image.items() if locked.get(name) != version} == {}
