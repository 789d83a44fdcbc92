"""A SIGTERM ends a script through its cleanup with status 143, wherever the main thread is when it comes, a
finalizer included (tooling/termination.py). Each case runs a real Python process and signals it."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import textwrap

import pytest

from tooling.paths import REPO
from tooling.termination import raise_terminated

# The signal arrives while a finalizer runs: the finalizer sends it to its own process and runs on, so the handler
# runs inside it, as a time limit's SIGTERM can land in any object's __del__ (a socket's, a response's).
IN_A_FINALIZER = """
import os, signal, sys, time
from tooling.termination import exit_on_sigterm
exit_on_sigterm()

class Resource:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):
            pass

try:
    resource = Resource()
    del resource
    time.sleep(0.5)
    print("ran on after the SIGTERM", flush=True)
finally:
    print("cleaned up", flush=True)
"""

# A second handler of a script's own (scripts/fleet.py's roll: the first signal asks, the second aborts) that
# raises through raise_terminated gets the same care.
A_SECOND_SIGNAL_IN_A_FINALIZER = """
import os, signal, sys, time
from tooling.termination import raise_terminated
asked = []

def interrupted(signum, frame):
    if asked:
        raise_terminated(signum, frame)
    asked.append(signum)

signal.signal(signal.SIGTERM, interrupted)
os.kill(os.getpid(), signal.SIGTERM)

class Resource:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):
            pass

resource = Resource()
del resource
time.sleep(0.5)
print("ran on after the second SIGTERM", flush=True)
"""


def run(program: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(program)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_a_sigterm_that_lands_in_a_finalizer_still_ends_the_script_through_its_cleanup():
    done = run(IN_A_FINALIZER)
    assert done.returncode == 128 + signal.SIGTERM, done
    assert done.stdout == "cleaned up\n", done
    # Python still says where the signal came (its "Exception ignored in" report), and nothing else went wrong.
    assert "Exception ignored in" in done.stderr and "Terminated: 143" in done.stderr, done.stderr
    assert done.stderr.count("Traceback") == 1, done.stderr


def test_a_scripts_own_handler_that_raises_through_raise_terminated_is_not_lost_in_a_finalizer_either():
    done = run(A_SECOND_SIGNAL_IN_A_FINALIZER)
    assert done.returncode == 128 + signal.SIGTERM, done
    assert "ran on" not in done.stdout, done


def test_a_sigterm_from_outside_unwinds_a_waiting_script_with_status_143():
    program = """
        import sys, time
        from tooling.termination import exit_on_sigterm
        exit_on_sigterm()
        try:
            print("waiting", flush=True)
            time.sleep(60)
        finally:
            print("cleaned up", flush=True)
    """
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(program)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout.readline() == "waiting\n"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()  # this test's own process, if it did not end
    assert process.returncode == 128 + signal.SIGTERM, err
    assert out == "cleaned up\n" and err == "", (out, err)


@pytest.mark.parametrize("command", ["benchmark", "overload", "soak", "fleet"])
def test_each_script_that_starts_servers_ends_on_sigterm_through_raise_terminated(command, sigterm_kept, capsys):
    with pytest.raises(SystemExit) as helped:
        importlib.import_module(f"scripts.{command}").main(["--help"])  # the handler is set before the arguments
    assert helped.value.code == 0 and "usage:" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is raise_terminated
