"""A CPU run's threads are packed onto the cores other programs leave it, and spread out again."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from objtrain.training import cores


def test_a_run_keeps_its_threads_share_of_the_runnable_threads_in_cores() -> None:
    assert cores.cores_to_keep(2, 2, 0) == 2  # quiet: every core
    assert cores.cores_to_keep(2, 2, 0.5) == 2  # a little background work: still every core
    assert cores.cores_to_keep(2, 2, 1) == 1
    assert cores.cores_to_keep(2, 2, 2) == 1  # one busy process per core: half the machine
    assert cores.cores_to_keep(16, 16, 16) == 8
    assert cores.cores_to_keep(16, 16, 4) == 13
    assert cores.cores_to_keep(4, 4, 1000) == 1  # never none


def test_the_least_busy_cores_are_kept_and_a_tie_keeps_the_cores_in_use() -> None:
    assert cores.least_busy({0: 90, 1: 10, 2: 50, 3: 10}, 2, current=()) == (1, 3)
    assert cores.least_busy({0: 100, 1: 100}, 1, current=()) == (0,)
    assert cores.least_busy({0: 100, 1: 100}, 1, current=(1,)) == (1,)  # no move for the same load


def test_stat_and_runnable_threads_are_read_from_proc(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  10 0 10 100 0 0 0 0 0 0\n"
        "cpu0 5 1 4 50 3 0 0 0 0 0\n"
        "cpu1 7 0 3 60 0 1 1 0 0 0\n"
        "intr 1 2 3\nprocs_running 5\nprocs_blocked 0\n"
    )
    assert cores.read_stat(stat) == ({0: 10, 1: 12}, 5)  # busy = all but idle and iowait

    def task(pid: int, tid: int, state: str, children: str = "") -> None:
        d = tmp_path / "proc" / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{tid} (python (x)) {state} 1 2 3\n")  # a name with spaces and parentheses
        (d / "children").write_text(children)

    task(100, 100, "R", "200 ")
    task(100, 101, "S")
    task(100, 102, "R")
    task(200, 200, "R")  # a loader worker: the run's own, not another program's
    task(300, 300, "R")  # another program
    assert cores.own_runnable(tmp_path / "proc", 100) == 3


class FakeMachine:
    """/proc/stat as a test sets it: others' runnable threads and per-core busy ticks that grow."""

    def __init__(self, others: float, busy_per_look: dict[int, int], own: int = 2) -> None:
        self.others, self.busy_per_look, self.own = others, busy_per_look, own
        self.ticks = dict.fromkeys(busy_per_look, 0)
        self.pins: list[tuple[int, ...]] = []

    def read(self) -> tuple[dict[int, int], int]:
        for c, n in self.busy_per_look.items():
            self.ticks[c] += n
        return dict(self.ticks), round(self.others) + self.own

    def pin(self, cpus: Sequence[int]) -> None:
        self.pins.append(tuple(cpus))


def test_the_packer_packs_beside_busy_programs_and_spreads_out_when_they_end() -> None:
    machine = FakeMachine(others=2, busy_per_look={0: 100, 1: 60})
    packer = cores.CorePacker(
        2, read=machine.read, runnable=lambda: machine.own, pin=machine.pin, allowed=(0, 1)
    )
    assert packer.look(samples=3, pause=0) == (1,)  # the less busy core
    assert machine.pins == [(1,)]
    assert packer.look(samples=3, pause=0) == (1,)  # the same load: nothing moves
    assert machine.pins == [(1,)]
    machine.others = 0  # the other programs ended
    assert packer.look(samples=3, pause=0) == (0, 1)
    assert machine.pins == [(1,), (0, 1)]
    machine.others = 2
    packer.look(samples=3, pause=0)
    packer.stop()  # the run ends: every core again
    assert machine.pins[-1] == (0, 1) and packer.current == (0, 1)


def test_a_quiet_machine_pins_nothing() -> None:
    machine = FakeMachine(others=0.4, busy_per_look={0: 5, 1: 5})
    packer = cores.CorePacker(
        2, read=machine.read, runnable=lambda: machine.own, pin=machine.pin, allowed=(0, 1)
    )
    assert packer.look(samples=5, pause=0) == (0, 1)
    packer.stop()
    assert machine.pins == []


def test_packing_applies_only_to_one_cpu_process_whose_threads_never_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", *cores.PLACEMENT_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    assert not cores.never_spins({})  # libgomp's default spins 300,000 iterations
    assert not cores.never_spins({"GOMP_SPINCOUNT": "20000"})
    assert cores.never_spins({"OMP_WAIT_POLICY": "passive"}) and cores.never_spins({"GOMP_SPINCOUNT": "0"})
    assert cores.core_packer(2, "cpu", 1) is None  # spinning threads: packing them would starve a sibling
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert cores.core_packer(2, "cuda", 1) is None
    assert cores.core_packer(2, "cpu", 2) is None  # torchrun places its ranks
    monkeypatch.setenv("OMP_PROC_BIND", "close")
    assert cores.core_packer(2, "cpu", 1) is None  # the user placed the threads
    monkeypatch.delenv("OMP_PROC_BIND")
    if len(os.sched_getaffinity(0)) >= 2:
        with cores.packed_cores(2, "cpu", 1) as packer:
            assert isinstance(packer, cores.CorePacker)
        assert packer.current == packer.allowed  # unpinned when the block ends
        assert os.sched_getaffinity(0) == set(packer.allowed)


CHILD = """
import os, sys, threading
from objtrain.training import cores
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(3)]
for t in threads:
    t.start()
allowed = sorted(os.sched_getaffinity(0))
cores.ALLOWED = tuple(allowed)
cores.pin_threads([allowed[-1]])
pinned = {tid: os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}
print(len(pinned), all(s == {allowed[-1]} for s in pinned.values()))
cores.unpin_this_process()
print(os.sched_getaffinity(0) == set(allowed))
stop.set()
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread affinity is Linux's")
def test_every_thread_of_the_process_is_pinned_and_a_worker_gets_every_core_back() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    count, all_pinned, unpinned = out.split()
    assert int(count) >= 4 and all_pinned == "True"  # the main thread and the three others
    assert unpinned == "True"
