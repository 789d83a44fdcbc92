"""The repository holds source, docs and the small records of committed runs: weights, archives, environments and
data blobs stay out (git-ignored, or never written into the checkout). One slipped in once: two 90 MB ONNX external
data files an experiment's onnxruntime wrote into the working directory, caught before they landed."""

from __future__ import annotations

import subprocess

import pytest

from tooling.paths import REPO

# The largest tracked file is a committed run's plot or JSON, about 0.2 MB.
LARGEST_TRACKED_BYTES = 1 << 20


def test_no_tracked_file_is_a_blob():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, no tracked files to read: {listed.stderr.decode().strip()[:200]}")
    paths = [REPO / name for name in listed.stdout.decode().split("\0") if name]
    sizes = {str(path.relative_to(REPO)): path.stat().st_size for path in paths if path.is_file()}
    assert len(sizes) > 100, sizes  # the tree, not an empty listing
    assert {name: size for name, size in sizes.items() if size > LARGEST_TRACKED_BYTES} == {}
