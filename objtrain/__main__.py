"""The `objtrain` executable (and `python -m objtrain`).

Only the standard library is imported here (and `objtrain.training.cores`, which imports nothing else), so
a Ctrl-C while torch and the commands are still loading ends with one line and exit 130 like a Ctrl-C at
any later moment, not a traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path

from objtrain.training.cores import cpu_ticks  # the standard library only, like this file

SPIN_COUNT = "20000"  # libgomp's default is 300000 (about 0.3 M iterations, then sleep)
BUSY_CORES = 0.5  # other programs' work at start-up, in cores, from which OpenMP threads never spin
SAMPLE_S = 0.1  # how long start-up watches the cores this process may run on
COMPUTE_COMMANDS = frozenset({"train", "compare", "eval", "generate", "corrupt"})


def _cpu_ticks(cpus: set[int] | None, stat: Path) -> tuple[int, int]:
    """(busy, total) clock ticks so far over the given CPUs (all where None), from /proc/stat."""
    per_cpu = [t for c, t in cpu_ticks(stat)[0].items() if cpus is None or c in cpus]
    return sum(b for b, _ in per_cpu), sum(t for _, t in per_cpu)


def other_work(interval: float = SAMPLE_S, stat: Path = Path("/proc/stat")) -> float | None:
    """Cores' worth of work that other programs ran on this process's CPUs over `interval` seconds, while
    this process slept; None where it cannot be read (not Linux, no /proc)."""
    cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    try:
        busy0, total0 = _cpu_ticks(cpus, stat)
        time.sleep(interval)
        busy1, total1 = _cpu_ticks(cpus, stat)
    except (OSError, ValueError):
        return None
    if total1 <= total0:
        return None
    n_cpus = len(cpus) if cpus else (os.cpu_count() or 1)
    return (busy1 - busy0) / (total1 - total0) * n_cpus


def openmp_defaults(
    environ: MutableMapping[str, str] = os.environ, others: float | None = None
) -> str | None:
    """How OpenMP threads that finish a parallel region early wait, unless the user chose
    (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`); returns the variable set (None when the user chose).

    libgomp's long default spin costs nothing on an idle machine, but beside other work a spinning thread
    burns the core its descheduled sibling (or another program) needs, and every region then waits for that
    sibling. Measured on 2 cores (benchmarks/bench_busy.py), a run beside one busy process per core kept
    0.05-0.32 of its idle speed under libgomp's default, 0.38-0.50 with a short spin (20,000 iterations) and
    0.35-0.59 never spinning (`OMP_WAIT_POLICY=PASSIVE`), by where the scheduler put its two threads;
    never spinning, `train` also packs its threads onto the cores the others leave it
    (`objtrain/training/cores.py`), which kept 0.53 every time. Alone, the short spin ran at 0.96-1.05 of
    the default and never spinning lost 5-15%. So the choice follows the machine at start-up:
    `others` cores of other programs' work (`other_work()`), at least `BUSY_CORES` of it: never spin;
    less, or unknown: the short spin. A load that arrives later meets the short spin, still 1.5x the
    default's speed beside it. libgomp reads these once, when torch loads it, so they are set here, before
    anything imports torch; child processes (torchrun ranks, loader workers) inherit them."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return None
    if others is not None and others >= BUSY_CORES:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "OMP_WAIT_POLICY"
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return "GOMP_SPINCOUNT"


class _StartupEnded(KeyboardInterrupt):
    """SIGTERM or SIGHUP while torch and the commands load (seconds on a busy machine): before the command
    takes these signals over (`objtrain.cli`), they end the start-up as Ctrl-C does, in one line."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _end_startup(signum: int, frame: object) -> None:
    raise _StartupEnded(signum)


def _startup_signals() -> dict[int, object]:
    """Install `_end_startup` for SIGTERM and SIGHUP; returns the handlers it replaced."""
    previous: dict[int, object] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup`'s ignored SIGHUP stays ignored
            previous[sig] = signal.signal(sig, _end_startup)
    return previous


def main() -> None:
    chose = "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ
    # Only the commands that run models pay the start-up look at the machine (a tenth of a second).
    computes = len(sys.argv) > 1 and sys.argv[1] in COMPUTE_COMMANDS
    previous: dict[int, object] = {}
    try:
        previous = _startup_signals()
        openmp_defaults(others=other_work() if computes and not chose else None)
        from objtrain.cli import main as cli_main

        for sig, handler in previous.items():  # the command installs its own; a finished one is not ended
            signal.signal(sig, handler)  # type: ignore[arg-type]
    except _StartupEnded as exc:
        sys.stderr.write(f"terminated ({signal.Signals(exc.signum).name}); nothing was written\n")
        sys.exit(128 + exc.signum)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was written\n")
        sys.exit(130)
    cli_main(program=True)


if __name__ == "__main__":
    main()
