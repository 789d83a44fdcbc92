"""Serve a new archive under a running model's name without failing a request (tooling/model_update.py).

    .venv/bin/python -m scripts.archive_model path/to/checkpoint --name sentiment --version 2.0 \\
        --file-name sentiment-2.0.mar --handler-option cpu_threads=1   # model_store/sentiment-2.0.mar
    .venv/bin/python -m scripts.update_model model_store/sentiment-2.0.mar   # 1.0 -> 2.0

The archive must be in the server's model store (TorchServe registers archives from there, by file
name), under a file name of its own, and carry the model's name and a version the model does not have
yet. The new version gets the running one's batch size, delay and workers (on a CPU, serve.sh's count for the
new archive's cpu_threads where the running count was serve.sh's: tooling/model_update.new_version_workers),
answers one probe request, becomes the default, and the old version is unregistered once it has finished what it
holds; then the archive is copied over model_store/sentiment.mar (one atomic rename), what scripts/serve.sh
(MODEL_NAME=sentiment) registers after a restart. On any failure before the switch the old version
goes on serving, unchanged, and sentiment.mar is still its archive. The defaults reach the server
scripts/serve.sh started; --config and --key-file reach another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import requests

from tooling.cli_arguments import existing_file, model_name, non_negative_float
from tooling.model_archive import NotAnArchive, archive_name, archive_version
from tooling.model_update import UpdateFailed, update_model
from tooling.paths import REPO, REVIEW
from tooling.torchserve import add_running_server_arguments, new_load_failure, running_server


def main(argv: list[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # each step as it happens, through a pipe or the journal too
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=Path, help="the new .mar, in the server's model store, not MODEL.mar")
    parser.add_argument(
        "--model",
        type=model_name,
        help="the served model's name (default, and it must be: the name in the archive's manifest)",
    )
    parser.add_argument(
        "--probe", type=existing_file, default=REVIEW, help="a text file the new version must answer (200)"
    )
    parser.add_argument(
        "--grace-seconds",
        type=non_negative_float,
        help="wait after the old version's queue is empty (default: its maxBatchDelay + responseTimeout); a "
        "batch it still runs when the wait ends fails",
    )
    add_running_server_arguments(parser)
    parser.add_argument("--log", type=Path, default=REPO / "logs" / "model_log.log", help="the workers' log")
    args = parser.parse_args(argv)
    server = running_server(parser, args)
    if args.archive.resolve().parent != server.model_store:
        parser.error(f"{args.archive} is not in the server's model store {server.model_store}: copy it there")
    try:
        name, version = archive_name(args.archive), archive_version(args.archive)
    except NotAnArchive as error:
        parser.error(str(error))
    model = args.model or name
    try:
        update_model(
            server, model, args.archive.name, version, args.probe.read_bytes(),
            grace_s=args.grace_seconds, explain_load_failure=new_load_failure(args.log),
        )  # fmt: skip
    except UpdateFailed as failed:
        print(f"update_model: {failed}", file=sys.stderr)
        return 1
    except (requests.RequestException, OSError) as error:
        print(f"update_model: {error}; GET /models/{model}/all shows where the update stopped", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
