"""The code base stays clean: ruff lint and formatting, as configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys

from tooling.paths import REPO


def run_ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check():
    result = run_ruff("check", ".")
    assert result.returncode == 0, result.stdout


def test_ruff_format():
    result = run_ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout
