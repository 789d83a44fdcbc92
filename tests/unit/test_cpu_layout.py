"""tooling/cpu_layout.py through scripts/cpu_layout.py: the workers scripts/serve.sh starts on a CPU host, from the
archive's cpu_threads, and what it says of them. serve.sh's use of it, through a real TorchServe:
tests/e2e/test_serve_sh.py."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from scripts.cpu_layout import shell
from tests.deploy.manifests import archive_with_handler_options
from tooling.cpu_layout import Layout, cpu_layout
from tooling.paths import REPO


@pytest.mark.parametrize(
    ("handler", "cpus", "workers", "threads"),
    [
        ({"cpu_threads": 1}, 2, 2, 1),  # the demo archive: one one-thread worker per CPU
        ({"cpu_threads": 1}, 16, 16, 1),
        ({"cpu_threads": 2}, 8, 4, 2),
        ({"cpu_threads": 0}, 2, 1, 2),  # every CPU in each worker: one
        (None, 4, 1, 4),  # no model-config.yaml: the handler's defaults, cpu_threads 0
    ],
)
def test_as_many_workers_as_the_cpus_hold_at_the_archives_threads(tmp_path, handler, cpus, workers, threads):
    layout = cpu_layout(archive_with_handler_options(tmp_path / "mine.mar", handler), cpus)
    assert (layout.cpus, layout.workers, layout.threads, layout.warning) == (cpus, workers, threads, "")
    if workers < cpus:  # said, with the archive option that gives one worker per CPU
        assert layout.note.startswith(f"mine.mar's workers run {threads} threads each (its cpu_threads"), layout.note
        assert "archived with --handler-option cpu_threads=1 it runs one per CPU" in layout.note, layout.note
    else:
        assert layout.note == ""


def test_given_workers_are_kept_with_a_warning_where_their_threads_outnumber_the_cpus(tmp_path):
    archive = archive_with_handler_options(tmp_path / "mine.mar", {"cpu_threads": 0})
    crowded = cpu_layout(archive, 2, workers=2)
    assert (crowded.workers, crowded.threads, crowded.note) == (2, 2, "")
    assert crowded.warning == (
        "2 worker(s) of 2 threads each on 2 CPUs: more threads than CPUs, which cost a PyTorch archive 6-9x its "
        "requests/s; leave WORKERS unset for 1 (docs/batching.md)"
    )
    fitting = cpu_layout(archive, 2, workers=1)
    assert (fitting.workers, fitting.note, fitting.warning) == (1, "", "")  # given: no note either


def read_back(assignments: str) -> list[str]:
    """`assignments` eval'd by bash, then CPUS, WORKERS, LAYOUT_NOTE and LAYOUT_WARNING as it reads them."""
    reads = '"$CPUS" "$WORKERS" "$LAYOUT_NOTE" "$LAYOUT_WARNING"'
    script = f'eval {shlex.quote(assignments)}; printf "%s|%s|%s|%s" {reads}'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split("|")


def test_an_archive_of_more_threads_than_cpus_gets_one_worker_and_a_warning_naming_the_archives_fix(tmp_path):
    layout = cpu_layout(archive_with_handler_options(tmp_path / "mine.mar", {"cpu_threads": 4}), 2)
    assert (layout.workers, layout.threads, layout.note) == (1, 4, "")
    assert layout.warning.startswith("1 worker(s) of 4 threads each on 2 CPUs: more threads than CPUs"), layout
    assert layout.warning.endswith("; archive it with cpu_threads 2 or less (docs/batching.md)"), layout


def test_the_shell_assignments_read_back_as_they_were():
    layout = Layout(2, 1, 2, 2, note="it's mine.mar's; $HOME `id`", warning='"quoted" \\ back')
    assert read_back(shell(layout)) == ["2", "1", layout.note, layout.warning]


def test_the_command_prints_this_hosts_layout(tmp_path):
    archive = archive_with_handler_options(tmp_path / "mine.mar", {"cpu_threads": 0})
    command = [sys.executable, "-m", "scripts.cpu_layout", str(archive), "--workers", "2"]
    printed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout
    cpus, workers, note, warning = read_back(printed)
    assert (workers, note) == ("2", ""), printed
    assert cpu_layout(archive, int(cpus), workers=2).warning == warning != "", printed


def test_an_archive_whose_handler_options_its_workers_would_refuse_is_refused_in_one_line(tmp_path):
    archive = archive_with_handler_options(tmp_path / "mine.mar", {"cpu_threads": "two"})
    refused = subprocess.run(
        [sys.executable, "-m", "scripts.cpu_layout", str(archive)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused
    assert refused.stderr.splitlines()[-1].startswith("cpu_layout.py: error: "), refused.stderr
