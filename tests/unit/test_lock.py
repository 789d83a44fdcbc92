"""requirements.lock: the environment the suite runs in is exactly the locked one, and so is the image's."""

from __future__ import annotations

from importlib import metadata

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import pinned_versions
from tooling.paths import REPO

LOCK = REPO / "requirements.lock"
IMAGE_REQUIREMENTS = REPO / "deploy" / "docker" / "requirements.txt"


def test_every_locked_package_is_installed_at_its_locked_version():
    # What scripts/setup.sh installed (with the lock as constraints) is what the tests run on.
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    differing = {name: (version, installed.get(name)) for name, version in pinned_versions(LOCK).items()}
    assert {name: pair for name, pair in differing.items() if pair[0] != pair[1]} == {}


def test_the_lock_covers_the_project_and_its_extras_but_leaves_torch_to_the_set_up():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    declared += project["optional-dependencies"]["bench"]
    locked = pinned_versions(LOCK)
    assert "torch" not in locked  # TORCH_SPEC in scripts/setup.sh picks the CPU or a CUDA build
    for requirement in map(Requirement, declared):
        name = canonicalize_name(requirement.name)
        if name != "torch":
            assert name in locked, f"{name} is not in requirements.lock: run scripts/lock.sh"
            assert requirement.specifier.contains(locked[name]), (name, locked[name], str(requirement.specifier))


def test_the_image_installs_the_locked_versions():
    locked = pinned_versions(LOCK)
    image = pinned_versions(IMAGE_REQUIREMENTS)
    assert image
    assert {name: (version, locked.get(name)) for name, version in image.items() if locked.get(name) != version} == {}


def test_beside_a_kept_torch_the_lock_constrains_everything_but_torchs_own_dependencies():
    # scripts/setup.sh keeps a GPU image's CUDA torch and installs the rest with these constraints: the
    # lock's pins less what torch itself requires (the H100 image's torch 2.11 needs setuptools<82; the
    # lock, compiled beside the CPU build, pins 84).
    from scripts.constraints_beside import constraints_beside

    lock_text = (REPO / "requirements.lock").read_text()
    kept = {canonicalize_name(Requirement(line).name): line for line in constraints_beside("torch", lock_text)}
    locked = pinned_versions(REPO / "requirements.lock")
    torch_needs = {
        canonicalize_name(Requirement(r).name)
        for r in metadata.requires("torch") or []
        if "extra ==" not in r and "extra==" not in r
    }
    assert torch_needs & set(locked), "the lock pins none of torch's dependencies: nothing to check"
    assert set(kept) == set(locked) - torch_needs
    assert {name: str(Requirement(line).specifier) for name, line in kept.items()} == {
        name: f"=={locked[name]}" for name in kept
    }
    # Requirements behind one of torch's extras (pyyaml) stay pinned: the set-up installs none of them.
    assert "pyyaml" in kept
