#!/usr/bin/env bash
# README command 2: set up if needed, then run the whole test suite. Extra arguments go to pytest.
# Its files are shared out between two processes (pytest-xdist): most of the suite's time is spent waiting on
# servers, so two take about two thirds of one's time on CI's two cores (docs/development.md, "Tests");
# `scripts/test.sh -n 0` runs it in one.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# OpenMP threads (PyTorch's pools, in the test processes and in the TorchServe workers they start) wait for work
# without spinning: two test processes share two cores, and a pool spinning beside the other took the 2,000-request
# test from 18 s alone to 84 s beside two busy cores, 24 s with PASSIVE (docs/development.md, "Tests").
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec .venv/bin/python -m pytest --numprocesses 2 --dist loadfile "$@"
