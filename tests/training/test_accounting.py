"""Peak memory on CPU: the process's resident high-water mark, resettable per run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from objtrain.training.accounting import PeakMemory

STATUS = Path("/proc/self/status")


def vm_hwm() -> int:
    line = next(ln for ln in STATUS.read_text().splitlines() if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_cpu_peak_is_the_high_water_mark_from_the_last_reset() -> None:
    memory = PeakMemory(torch.device("cpu"))
    memory.reset()
    before = memory.peak_bytes()
    assert before == vm_hwm()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, every page touched
    after = memory.peak_bytes()
    assert after == vm_hwm() and after - before >= 60 << 20
    del block
    memory.reset()
    assert memory.peak_bytes() < after  # the reset drops the mark to what is resident now
