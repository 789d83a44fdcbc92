"""The code base stays clean: ruff lint and formatting, as configured in pyproject.toml, and Python's own
compiler warns about nothing in it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path

from tooling.paths import REPO


def run_ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check():
    result = run_ruff("check", ".")
    assert result.returncode == 0, result.stdout


def test_ruff_format():
    result = run_ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout


def test_python_compiles_every_file_without_a_warning():
    """What the compiler warns about (an invalid escape: a DeprecationWarning on 3.11, a SyntaxWarning from 3.12,
    later an error) and ruff does not: ruff's W605 passes `\\u` in a bytes literal (astral-sh/ruff#19543). Read
    from the source, every file ruff lints: a cached .pyc would hide the warning from the suite's own imports."""
    listed = run_ruff("check", "--show-files", ".")
    files = [Path(line) for line in listed.stdout.splitlines() if line.endswith(".py")]
    assert len(files) > 100, listed.stdout + listed.stderr  # the tree, not an empty listing
    warned = []
    for path in files:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compile(path.read_bytes(), str(path), "exec")
        warned += [f"{path.relative_to(REPO)}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught]
    assert not warned, "\n".join(warned)


def test_every_command_prints_its_shell_examples_as_written():
    """A command's docstring is its --help (argparse, RawDescriptionHelpFormatter): a shell line continuation written
    there as a lone backslash is Python's, and joins the example's two lines in what --help prints."""
    joined = []
    for path in sorted((REPO / "scripts").glob("*.py")):
        module = ast.parse(path.read_text())
        doc = ast.get_docstring(module, clean=False)
        if doc is None:
            continue
        source = ast.get_source_segment(path.read_text(), module.body[0].value)
        # An odd run of backslashes before a line's end: the last one escapes the newline (an even run is \\ pairs).
        if not source.startswith(("r", "R")) and re.search(r"(?<!\\)(?:\\\\)*\\\n", source):
            joined.append(str(path.relative_to(REPO)))
    assert not joined, f"a lone backslash ends a line of these docstrings (write \\\\): {joined}"
