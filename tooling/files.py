"""Writing a file whole: for a file another process may read at any moment (HAProxy's saved server states at its
start, the fleet's records, a benchmark's results while a time limit may stop the run)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """`text` as `path`'s whole content, or the file as it was: written to a temporary file in the same folder and
    renamed over `path`, so a process stopped mid-write (a time limit's SIGTERM) never leaves half a file."""
    path = Path(path)
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below, before the rename
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", suffix=".partial", delete=False
    )
    try:
        with handle:
            handle.write(text)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
