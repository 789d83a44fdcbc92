#!/usr/bin/env bash
# README command 2: set up if needed, then run the whole test suite. Extra arguments go to pytest.
# Its files are shared out between two processes (pytest-xdist): most of the suite's time is spent waiting on
# servers, so two take about two thirds of one's time on CI's two cores (docs/development.md, "Tests");
# `scripts/test.sh -n 0` runs it in one. Their OpenMP pools wait without spinning (tests/conftest.py says why).
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_DEMO=1 scripts/setup.sh  # the tests need the demo model and its archive
exec .venv/bin/python -m pytest --numprocesses 2 --dist loadfile "$@"
