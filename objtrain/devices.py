"""`--device` for every command: a name the user typed -> a usable `torch.device`, or one clear line.

torch accepts `torch.device("cuda")` on a CPU-only build and fails later with an AssertionError deep in a
call; `torch.device("tpu")` raises a RuntimeError. Both become a UserError here, before any work.
"""

from __future__ import annotations

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
