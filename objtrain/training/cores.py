"""Keep a CPU run's threads together on the cores other programs leave it (Linux).

Beside other programs, a run's OpenMP threads meet at a barrier after every operation. When each of them
shares a core with another program, time slicing rarely runs them together, and every region waits for
the sibling that is descheduled. Measured on 2 cores beside one busy process per core
(benchmarks/bench_busy.py, never spinning), a tiny decoder ran at either 4.6-4.7k or 6.7-7.2k tokens/s
(0.35 or 0.55 of its 13k alone), by whether the scheduler happened to put its two threads on one core
and the two busy processes on the other, or one of each on each core. Pinned to one core together, it
ran at 6.7-7.0k every time.

So while other programs want the cores, the run's threads take turns on `k` cores: its threads' share of
all runnable threads, `k = round(cores x threads / (threads + others))`, at least one, the least busy
ones. The thread count never changes (another count would change the order of floating-point sums, and
the loss curve with it). Others' demand is their runnable threads, `procs_running` in /proc/stat less this
run's own (busy time caps at the cores and would hide it), sampled ten times a second for a second; the
choice is looked at again every few seconds, so a run that started beside other work spreads out again
when that work ends.

Nothing is pinned when the machine is quiet (`k` = every core), when the OpenMP threads may spin
(`never_spins`), when the user chose a placement (`OMP_PROC_BIND`, `GOMP_CPU_AFFINITY`,
`KMP_AFFINITY`), with several processes per machine (torchrun places those) or off Linux. Loader workers
are not pinned: they start from every core the run may use (`unpin_this_process`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

PLACEMENT_VARIABLES = ("OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
LOOK_EVERY_S = 5.0  # how often the choice of cores is looked at again
SAMPLES = 10  # procs_running samples per look
ALLOWED: tuple[int, ...] = ()  # every core this process may use, before any packing (loader workers read it)


def cores_to_keep(cores: int, threads: int, others: float) -> int:
    """How many cores `threads` threads get beside `others` runnable threads of other programs: their share
    of all runnable threads, rounded, between 1 and `cores`."""
    if others <= 0:
        return cores
    return max(1, min(cores, round(cores * threads / (threads + others))))


def least_busy(busy: dict[int, int], k: int, current: Sequence[int]) -> tuple[int, ...]:
    """The `k` cores with the least busy time; the ones in use now first among equals, so that a look that
    finds the same load does not move the threads."""
    ranked = sorted(busy, key=lambda c: (busy[c], c not in current, c))
    return tuple(sorted(ranked[:k]))


def cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[dict[int, tuple[int, int]], int]:
    """({core: (busy, total) clock ticks so far}, runnable threads now) from /proc/stat."""
    ticks: dict[int, tuple[int, int]] = {}
    running = 0
    for line in stat.read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            # user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
            t = [int(x) for x in fields[:8]]
            ticks[int(name[3:])] = (sum(t) - t[3] - t[4], sum(t))
        elif name == "procs_running":
            running = int(fields[0])
    return ticks, running


def read_stat(stat: Path = Path("/proc/stat")) -> tuple[dict[int, int], int]:
    """(busy clock ticks per core so far, runnable threads now) from /proc/stat."""
    ticks, running = cpu_ticks(stat)
    return {c: busy for c, (busy, _) in ticks.items()}, running


def _runnable_threads(task_dir: Path) -> tuple[int, set[int]]:
    """(threads running or waiting for a core, child process ids) of the process whose task dir is given."""
    n, children = 0, set()
    for task in task_dir.iterdir():
        try:
            n += (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
            children.update(int(pid) for pid in (task / "children").read_text().split())
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return n, children


def own_runnable(proc: Path = Path("/proc"), pid: int | None = None) -> int:
    """Runnable threads of this process and of its children (the loader workers are the run's, not
    another program's)."""
    n, children = _runnable_threads(proc / str(pid or os.getpid()) / "task")
    for child in children:
        try:
            n += _runnable_threads(proc / str(child) / "task")[0]
        except OSError:
            continue
    return n


def pin_threads(cpus: Sequence[int], task_dir: Path = Path("/proc/self/task")) -> None:
    """Set every thread of this process to run on `cpus` (affinity is per thread on Linux)."""
    for task in task_dir.iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue


def unpin_this_process() -> None:
    """Back to every core the run may use (a loader worker forked from a packed trainer)."""
    if ALLOWED and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, ALLOWED)


class CorePacker:
    """Looks at the machine every `LOOK_EVERY_S` seconds from a daemon thread and packs this process's
    threads onto the cores it should keep (module docstring). `start()` / `stop()`; `stop()` unpins."""

    def __init__(
        self,
        threads: int,
        read: Callable[[], tuple[dict[int, int], int]] = read_stat,
        runnable: Callable[[], int] = own_runnable,
        pin: Callable[[Sequence[int]], None] = pin_threads,
        look_every: float = LOOK_EVERY_S,
        allowed: Sequence[int] | None = None,
    ) -> None:
        global ALLOWED
        ALLOWED = tuple(sorted(os.sched_getaffinity(0) if allowed is None else allowed))
        self.allowed = ALLOWED
        self.threads = threads
        self.read, self.runnable, self.pin = read, runnable, pin
        self.look_every = look_every
        self.current: tuple[int, ...] = self.allowed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def look(self, samples: int = SAMPLES, pause: float = 0.1) -> tuple[int, ...]:
        """Sample the machine for `samples` x `pause` seconds and pack accordingly; returns the cores kept."""
        busy0, _ = self.read()
        others = 0.0
        for _ in range(samples):
            if self._stop.wait(pause):
                return self.current
            _, running = self.read()
            others += max(0, running - self.runnable())
        busy1, _ = self.read()
        others /= samples
        k = cores_to_keep(len(self.allowed), self.threads, others)
        busy = {c: busy1.get(c, 0) - busy0.get(c, 0) for c in self.allowed}
        chosen = self.allowed if k >= len(self.allowed) else least_busy(busy, k, self.current)
        if chosen != self.current:
            self.pin(chosen)
            self.current = chosen
        return chosen

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.look()
            except (OSError, ValueError):  # /proc unreadable: leave the threads where they are
                return
            self._stop.wait(self.look_every)

    def start(self) -> CorePacker:
        self._thread = threading.Thread(target=self._watch, name="objtrain-cores", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self.current != self.allowed:
            self.pin(self.allowed)
            self.current = self.allowed


def never_spins(environ: Mapping[str, str]) -> bool:
    """Whether OpenMP threads that reach a barrier early sleep at once. Packed threads take turns on a
    core, so a spinning one holds the core its sibling needs: beside one busy process per core, packed
    with a 20,000-iteration spin a tiny decoder ran at 2.9-3.0k tokens/s against 6.5-7.0k never spinning
    (and about 6k unpacked with that spin). The `objtrain` command never spins when it starts on a busy
    machine (`objtrain/__main__.py`)."""
    return (
        environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"
        or environ.get("GOMP_SPINCOUNT", "").strip() == "0"
    )


def core_packer(threads: int, device_type: str, world_size: int) -> CorePacker | None:
    """A started `CorePacker` where packing applies (module docstring), else None."""
    if device_type != "cpu" or world_size != 1 or threads < 1:
        return None
    if not hasattr(os, "sched_setaffinity") or not Path("/proc/stat").exists():
        return None
    if any(v in os.environ for v in PLACEMENT_VARIABLES):
        return None
    if not never_spins(os.environ):
        return None
    if len(os.sched_getaffinity(0)) < 2:
        return None
    return CorePacker(threads).start()


@contextlib.contextmanager
def packed_cores(threads: int, device_type: str, world_size: int) -> Iterator[CorePacker | None]:
    """`core_packer` for the length of a block; the threads are unpinned when it ends."""
    packer = core_packer(threads, device_type, world_size)
    try:
        yield packer
    finally:
        if packer is not None:
            packer.stop()
