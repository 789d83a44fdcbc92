"""A SIGTERM (a time limit, `kill`, a pod being stopped) ends this project's scripts as an error does: their
`finally` blocks and context managers stop the servers they started and keep what was measured, and the exit
status is 128 + 15, as for a process the signal killed.

Python runs a signal's handler in the main thread between any two bytecodes, a finalizer's (`__del__`) among
them, and an exception that leaves a finalizer is printed ("Exception ignored in ...") and dropped. An exit raised
there was lost, and the script ran on to its own end: a benchmark stopped by its time limit measured every cell
and exited 1. Such a dropped exit reaches `sys.unraisablehook`, which has the signal sent again a moment later,
so that the handler raises outside the finalizer.
"""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

# Long enough for the main thread to leave the hook and the finalizer (microseconds), short enough to go unnoticed.
RESEND_AFTER_S = 0.01


class Terminated(SystemExit):
    """Raised in the main thread by a signal; `code` is 128 + the signal's number."""

    @property
    def signum(self) -> int:
        return int(self.code) - 128


def exit_on_sigterm() -> None:
    """From now on a SIGTERM raises Terminated(143) in the main thread, once it is running Python code outside a
    finalizer."""
    signal.signal(signal.SIGTERM, raise_terminated)


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A signal handler: raise Terminated for `signum`. Scripts with a handler of their own (a first signal that
    asks, a second that aborts) raise through this one so that a dropped exit is sent again."""
    # Set here, as the exit is raised, not with the handler: a process that is never signalled (a test calling a
    # script's main) keeps its own hook.
    if not getattr(sys.unraisablehook, "resends_terminations", False):
        sys.unraisablehook = _resending(sys.unraisablehook)
    raise Terminated(128 + signum)


def _resending(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    def hook(unraisable: Any) -> None:  # sys.UnraisableHookArgs
        previous(unraisable)  # still printed: what was running when the signal came
        if isinstance(unraisable.exc_value, Terminated):
            # As if the signal came again a moment later, from another thread: sent from here (os.kill,
            # signal.raise_signal, _thread.interrupt_main) its handler would run at once, inside this hook, where
            # an exception is dropped too. Should the moment fall in a finalizer again, this repeats.
            resend = threading.Timer(RESEND_AFTER_S, _thread.interrupt_main, (unraisable.exc_value.signum,))
            resend.daemon = True  # never what keeps an exiting process alive
            resend.start()

    hook.resends_terminations = True
    return hook
