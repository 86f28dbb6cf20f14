"""Helper processes die with the process that started them.

A DataLoader worker left behind by a trainer killed with SIGKILL (an OOM kill, a preemption) does not end
by itself: torch's watchdog notices the new parent and leaves its loop, but the exit then joins the result
queue's feeder thread, blocked on a full pipe nobody reads, for ever; and the worker ignores SIGTERM on
purpose (`_leave_signals_to_the_trainer`), so `scancel` never clears it. On Linux the kernel sends the
worker SIGKILL when its parent dies (`prctl(PR_SET_PDEATHSIG)`), which nothing can block or ignore;
elsewhere a watchdog thread ends the worker with `os._exit`, which skips the join.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send `sig` to this process when its parent ends; False where that is not offered."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    return False


def _watch_parent(parent: int, every: float) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)  # no interpreter shutdown: it is what would block


def die_with_parent(parent: int, every: float = 1.0) -> None:
    """Make this (child) process end when `parent`, the pid that started it, ends.

    The death signal belongs to the thread that forked the child (the one iterating the DataLoader), and
    it is lost if the parent ended before it was set: hence the check of `getppid()` right after."""
    if not _set_parent_death_signal(signal.SIGKILL):
        threading.Thread(target=_watch_parent, args=(parent, every), daemon=True).start()
    if os.getppid() != parent:
        os._exit(1)
