"""Before scripts/serve.sh sets anything up: can it serve with the settings its environment gives?

    python3 -m scripts.serve_settings    # silent and 0, or one line per setting it cannot use and 1

Each of serve.sh's numeric variables (its header lists them) must be unset, empty (its default) or a value that
means something. One that does not is said now, by the variable's name, before a set-up of minutes; later it was
scripts/latency_budget.py's usage, after the set-up, naming an option the user never typed, and MAX_BATCH_DELAY=-1
was registered as given. The values go on into URLs and config.properties as written, so a whole number is digits
alone (Python's int() would also take " 8", "+8" and "1_0", which TorchServe's Java does not).
Standard library only: it runs on the system's python3, before .venv exists.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping

from tooling.cli_arguments import non_negative_int, positive_float, positive_int

# name: (how it is read, what it means), in the order serve.sh's header gives them.
SETTINGS: dict[str, tuple[Callable[[str], float], str]] = {
    "BATCH_SIZE": (positive_int, "the largest batch TorchServe hands the handler"),
    "MAX_BATCH_DELAY": (non_negative_int, "ms TorchServe waits to fill a batch"),
    "WORKERS": (positive_int, "worker processes"),
    "LATENCY_BUDGET_MS": (positive_int, "ms a request may wait for its answer"),
    "THROUGHPUT_RPS": (positive_float, "this host's measured requests/s for the model"),
}
WHOLE = {positive_int, non_negative_int}


def problems(environment: Mapping[str, str]) -> list[str]:
    """A line for each setting in `environment` that serve.sh cannot use: its name, why (its value), what it means."""
    found = []
    for name, (read, meaning) in SETTINGS.items():
        value = environment.get(name, "")
        if value == "":  # unset or empty: serve.sh's default (${NAME:-default})
            continue
        try:
            read(value)
            if read in WHOLE and not re.fullmatch(r"[0-9]+", value):
                raise argparse.ArgumentTypeError(f"{value!r} is not a whole number: digits only")
        except argparse.ArgumentTypeError as why:
            found.append(f"{name}: {why} ({meaning})")
    return found


def main() -> int:
    found = problems(os.environ)
    for line in found:
        print(f"scripts/serve.sh: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
