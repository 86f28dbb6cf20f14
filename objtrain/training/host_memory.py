"""Host allocator settings for CPU training: keep freed activation buffers mapped between steps.

A CPU training step frees and re-allocates the same activation buffers (up to a few MB each) every step.
glibc's malloc serves blocks above its mmap threshold with fresh `mmap`s and trims the free top of the
heap back to the OS above its trim threshold (dynamic defaults: a few MB), so each step page-faults
its activations back in: ~1,000 minor faults per compiled step at the nanoGPT benchmark's shapes (4-6%
of a bare step; the whole loop faults less, ~250 per step). Raising both thresholds keeps those pages
in the heap, where the next step reuses them; the process's peak memory is unchanged (the same
buffers, reused). PyTorch's CPU tuning guide gets the same
effect by preloading jemalloc or tcmalloc; this needs no preload.

The settings are process-wide and stay for the life of the process. Other C libraries (musl, macOS,
Windows) are left alone.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # blocks up to 32 MiB come from the heap (glibc's dynamic maximum)
TRIM_THRESHOLD = 256 << 20  # up to 256 MiB of free heap top stays mapped

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True if they are set (Linux with glibc)."""
    global _applied
    if _applied is None:
        _applied = _set_thresholds()
    return _applied


def _set_thresholds() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only: musl's mallopt is a no-op stub)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
