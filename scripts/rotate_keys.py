"""Issue new inference and management keys for a running TorchServe, before or after the old ones expire.

    .venv/bin/python -m scripts.rotate_keys                 # both keys of the server scripts/serve.sh started
    */30 * * * * cd /path/to/checkout && .venv/bin/python -m scripts.rotate_keys    # crontab: keys never lapse

TorchServe's keys expire token_expiration_min minutes (60 unless config.properties says otherwise) after
they are issued; from then on every call with them, /ping included, is refused (400 InvalidKeyException).
The API key in key_file.json never expires and is what issues new ones: TorchServe rewrites key_file.json,
and the old key stops working at once, so clients read the key from the file again when it is refused.
scripts/serve.sh does this itself when it finds its server's keys expired.
"""

from __future__ import annotations

import argparse
import sys

import requests

from tooling.torchserve import add_running_server_arguments, running_server

KINDS = ("inference", "management")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_running_server_arguments(parser)
    sys.stdout.reconfigure(line_buffering=True)
    args = parser.parse_args(argv)
    server = running_server(parser, args)
    if server.key_file is None:
        print("rotate_keys: the server's configuration turns token authorization off: it has no keys", file=sys.stderr)
        return 1
    for kind in KINDS:
        try:
            answer = requests.post(
                f"{server.management_url}/token", params={"type": kind}, headers=server.headers("API"), timeout=10
            )
        except (requests.RequestException, OSError) as error:  # OSError: a key file this user may not read
            print(f"rotate_keys: {error}", file=sys.stderr)
            return 1
        if answer.status_code != 200:
            print(
                f"rotate_keys: the {kind} key was not rotated (HTTP {answer.status_code}: {answer.text.strip()})",
                file=sys.stderr,
            )
            return 1
        print(f"{kind} key rotated; it expires {server.key_entries()[kind]['expiration time']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
