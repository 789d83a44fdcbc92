"""Readiness probe: exit 0 only while every model of the server configuration has its workers with the model loaded.

    python3 /usr/local/bin/model_ready.py [--config /mnt/models/config/config.properties]

TorchServe's own /ping is not enough for readiness: it answers 200 while a model is still loading,
while a dead worker is being restarted (for up to the model's maxRetryTimeoutInSec, 300 s) and when
no model was loaded at all. This probe reads the models to expect from the configuration's
`model_snapshot` and asks the management API (loopback only, no token in the cluster configuration)
whether each has at least minWorkers workers READY. Standard library only: it runs in the image.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

DEFAULT_CONFIG = "/mnt/models/config/config.properties"


def read_properties(path: str) -> dict[str, str]:
    properties = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                properties[key.strip()] = value.strip()
    return properties


def expected_models(properties: dict[str, str]) -> dict[str, int]:
    """Model name -> minimum workers, from the configuration's model_snapshot."""
    snapshot = json.loads(properties["model_snapshot"])
    return {
        name: max(1, min(int(version.get("minWorkers", 1)) for version in versions.values()))
        for name, versions in snapshot["models"].items()
    }


def not_ready(management: str, model: str, min_workers: int, timeout: float) -> str | None:
    """Why `model` cannot serve now, or None when it can."""
    try:
        with urllib.request.urlopen(f"{management}/models/{model}", timeout=timeout) as response:
            description = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"{model}: management API: {exc}"
    ready = sum(worker.get("status") == "READY" for entry in description for worker in entry.get("workers", []))
    if ready < min_workers:
        return f"{model}: {ready} of {min_workers} workers ready"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config", default=DEFAULT_CONFIG, help=f"TorchServe config.properties (default {DEFAULT_CONFIG})"
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per management request")
    args = parser.parse_args(argv)
    properties = read_properties(args.config)
    management = properties.get("management_address", "http://127.0.0.1:8081").rstrip("/")
    problems = [
        problem
        for model, min_workers in expected_models(properties).items()
        if (problem := not_ready(management, model, min_workers, args.timeout))
    ]
    for problem in problems:
        print(f"not ready: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
