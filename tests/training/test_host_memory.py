"""CPU training keeps freed activation buffers mapped (glibc malloc thresholds)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Allocate and free 8 x 16 MiB of written tensors, 5 times. glibc's dynamic defaults depend on the
# process's history, so the script first pins them low (mmap and trim above 64 KiB: every round maps its
# 128 MiB afresh, ~160,000 minor faults); `keep_freed_memory` must then keep the pages in the heap.
SCRIPT = textwrap.dedent(
    """
    import ctypes, resource, torch
    from objtrain.training import host_memory

    def faults():
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            ts = [torch.ones(4 << 20) for _ in range(8)]
            del ts
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

    libc = ctypes.CDLL(None)
    glibc = hasattr(libc, "gnu_get_libc_version")
    if glibc:
        libc.mallopt(host_memory.M_MMAP_THRESHOLD, 64 << 10)
        libc.mallopt(host_memory.M_TRIM_THRESHOLD, 64 << 10)
    before = faults()
    applied = host_memory.keep_freed_memory()
    faults()
    print(glibc, before, applied, faults(), host_memory.keep_freed_memory())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings: Linux only")
def test_freed_buffers_stay_mapped() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout
    glibc, before, applied, after, again = out.split()
    if glibc != "True":
        assert applied == "False"  # other C libraries are left alone
        return
    assert int(before) > 50_000  # thresholds pinned low: each round's pages are faulted in again
    assert applied == "True"
    assert int(after) < 100
    assert again == "True"  # applied once; later calls report the same
