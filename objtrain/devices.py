"""`--device` for every command: a name the user typed -> a usable `torch.device`, or one clear line.

torch accepts `torch.device("cuda")` on a CPU-only build and fails later with an AssertionError deep in a
call; `torch.device("tpu")` raises a RuntimeError. Both become a UserError here, before any work.
`auto_dtype` is what `--dtype auto` resolves to on a device.
"""

from __future__ import annotations

from pathlib import Path

import torch

from objtrain.errors import UserError, pick_name

DEVICE_NAMES = ("auto", "cpu", "cuda", "mps")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; `cpu`, `cuda`, `cuda:N` and `mps` are checked to be usable."""
    base, sep, index_text = str(name).strip().partition(":")
    base = pick_name(base, DEVICE_NAMES, "--device")
    if base == "auto":
        if sep:
            raise UserError(f"--device auto takes no index, got {name!r}")
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    index: int | None = None
    if sep:
        if base != "cuda" or not index_text.isdigit():
            raise UserError(f"--device {name!r}: only cuda takes an index, as in cuda:0")
        index = int(index_text)
    if base == "cuda":
        if not torch.cuda.is_available():
            why = (
                "this torch was built without CUDA"
                if torch.version.cuda is None
                else "no CUDA GPU is visible"
            )
            raise UserError(f"--device cuda: {why} (use --device cpu or --device auto)")
        count = torch.cuda.device_count()
        if index is not None and index >= count:
            raise UserError(f"--device {name}: only {count} CUDA device(s), numbered from 0")
        return torch.device("cuda", index) if index is not None else torch.device("cuda")
    if base == "mps" and not _mps_available():
        raise UserError("--device mps: Apple's MPS backend is not available here (use --device cpu or auto)")
    return torch.device(base)


def cpu_features() -> set[str]:
    """The CPU's instruction-set features as torch's cpuinfo reports them (else /proc/cpuinfo's flags)."""
    get = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    if get is not None:
        try:
            return {name for name, on in get().items() if on is True}
        except (RuntimeError, TypeError, AttributeError):
            pass
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def auto_dtype(device: torch.device) -> tuple[str, str]:
    """(dtype, why) for `--dtype auto` from what the device has, never from a timing.

    CUDA: bf16 where supported, else fp16 with loss scaling. MPS: fp32. A CPU training run decides by timing
    its own step once in both precisions (`objtrain.training.precision`: bf16 units alone do not say which
    is faster); without a step to time, a CPU takes bf16 only with AMX tile units."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "this GPU supports bf16"
        return "fp16", "this GPU has no bf16"
    if device.type == "cpu":
        features = cpu_features()
        if "amx_bf16" in features:
            return "bf16", "this CPU has AMX bf16 units"
        has = "AVX512-BF16 but no AMX" if "avx512_bf16" in features else "no AMX bf16 units"
        return "fp32", f"this CPU has {has}"
    return "fp32", f"{device.type} trains in fp32"
