"""How much memory a command may use, and the one refusal of work that cannot fit in it.

A row length is a number a user types (`--seq-len`); one that no machine holds (10^9) would otherwise be
found out by the kernel's OOM killer, with no message, after minutes, and possibly taking other processes
with it. Commands estimate what their rows need first and `check_fits` refuses, in one line naming the
estimate and the limit, before anything is allocated.

The limit is the smallest of: the machine's physical memory, the cgroup's `memory.max` (a container or a
Slurm job), and the address space left under `ulimit -v`; on a GPU, the device's memory.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

from objtrain.errors import UserError


def _cgroup_limit() -> int | None:
    """The cgroup v2 (or v1) memory limit of this process, None where there is none or it cannot be read."""
    for file in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "no limit"
            return int(text)
    return None


def _address_space_left() -> int | None:
    """Bytes of address space `ulimit -v` (RLIMIT_AS) still allows this process, None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                used = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(soft - used, 0)


def host_memory_limit() -> int:
    """Bytes of host memory this process may use (see the module's docstring)."""
    try:
        limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound known
        limits = [1 << 62]
    limits += [v for v in (_cgroup_limit(), _address_space_left()) if v is not None]
    return min(limits)


def memory_limit(device: Any = None) -> tuple[int, str]:
    """(bytes, what they are) for work on `device` (a torch.device; host memory for None or a CPU)."""
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).total_memory), f"the memory of {device}"
    return host_memory_limit(), "the memory this process may use"


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def check_fits(need: float, what: str, device: Any = None) -> None:
    """Refuse `what` (e.g. "--seq-len 1000000000") if its estimated `need` in bytes exceeds the limit."""
    limit, where = memory_limit(device)
    if need > limit:
        raise UserError(
            f"{what} needs about {gib(need)} (estimate), more than {where} ({gib(limit)}): lower it"
        )
