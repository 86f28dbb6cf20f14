"""Counter-based randomness: every random number is a pure function of (seed, row, stream, position).

A row's corruption therefore depends only on the run seed and the row's *global* index, never on the
batch it was read in, the batch size, the number of processes, or what was drawn before it: resumed and
distributed runs see exactly the same data. It is also fully vectorised: one hash over a (B, n) grid.

The hash is SplitMix64's finaliser (Steele, Lea & Flood 2014) over a mixed 64-bit counter; int64 tensor
arithmetic wraps modulo 2^64 in PyTorch, and the logical right shifts are done with a mask. CPU grids are
hashed in numpy uint64 instead (native logical shifts, in-place updates: ~1.5x faster, same bits).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor


def _signed(x: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_ROW = _signed(0xD1B54A32D192ED03)
_POS = _signed(0xABC98388FB8FAC03)


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical (unsigned) right shift of int64 bits."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _finalise(z: Tensor) -> Tensor:
    z = z + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


_U = np.uint64
_MASK64 = (1 << 64) - 1


def _finalise_np(z: np.ndarray, last_round: bool = True) -> np.ndarray:
    """`_finalise` in place on a uint64 array whose `_GOLDEN` offset is already added.

    Without `last_round` only the top 33 bits are final (the last xor-shift touches bits 0..32 only)."""
    t = z >> _U(30)
    z ^= t
    z *= _U(_MIX1 & _MASK64)
    np.right_shift(z, _U(27), out=t)
    z ^= t
    z *= _U(_MIX2 & _MASK64)
    if last_round:
        np.right_shift(z, _U(31), out=t)
        z ^= t
    return z


@lru_cache(maxsize=64)
def _position_offsets(n: int) -> np.ndarray:
    """(n,) uint64 position * _POS + _GOLDEN (read-only; shared between calls)."""
    pos = np.arange(n, dtype=np.uint64) * _U(_POS & _MASK64) + _U(_GOLDEN & _MASK64)
    pos.setflags(write=False)
    return pos


@lru_cache(maxsize=4096)
def stream_key(seed: int, name: str) -> int:
    """A 63-bit key for (seed, stream name): distinct call sites draw independent numbers."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class RowRandom:
    """Random numbers for a batch of rows, keyed by each row's global index.

    `rows` is a (B,) int64 tensor of global row indices. Every method takes a `stream` name; the same
    (seed, row, stream, position) always gives the same number.
    """

    def __init__(self, seed: int, rows: Tensor) -> None:
        self.seed = int(seed)
        self.rows = rows.to(torch.int64).reshape(-1)

    def _base(self, stream: str) -> Tensor:
        """(B,) int64 per-row hash of (seed, row, stream)."""
        return _finalise(self.rows * _ROW + stream_key(self.seed, stream))

    def _base_np(self, stream: str) -> np.ndarray:
        """`_base` of CPU rows in numpy: a dozen tiny torch ops cost ~60 us in dispatch alone."""
        z = self.rows.numpy().view(np.uint64) * _U(_ROW & _MASK64)
        z += _U(stream_key(self.seed, stream) + (_GOLDEN & _MASK64) & _MASK64)
        return _finalise_np(z)

    def _grid_np(self, n: int, stream: str, last_round: bool = True) -> np.ndarray:
        """(B, n) uint64 hashes of a CPU grid (see `_finalise_np` for `last_round`)."""
        base = self._base_np(stream)
        return _finalise_np(base[:, None] + _position_offsets(n)[None, :], last_round)

    def bits(self, n: int, stream: str) -> Tensor:
        """(B, n) int64 of 64 random bits each."""
        if self.rows.device.type == "cpu":
            return torch.from_numpy(self._grid_np(n, stream).view(np.int64))
        base = self._base(stream)  # (B,)
        pos = torch.arange(n, dtype=torch.int64, device=self.rows.device) * _POS
        return _finalise(base[:, None] + pos[None, :])

    def bits_at(self, positions: Tensor, stream: str) -> Tensor:
        """(B, k) int64: `bits(n, stream)` read at (B, k) `positions` only (any n > positions), without
        hashing the whole grid."""
        if self.rows.device.type == "cpu":
            pos = positions.to(torch.int64).contiguous().numpy().view(np.uint64)
            z = pos * _U(_POS & _MASK64)
            z += self._base_np(stream)[:, None] + _U(_GOLDEN & _MASK64)
            return torch.from_numpy(_finalise_np(z).view(np.int64))
        base = self._base(stream)
        return _finalise(base[:, None] + positions.to(torch.int64) * _POS)

    def bits_of(self, which: Tensor, positions: Tensor, stream: str) -> Tensor:
        """(M,) int64: `bits_at` of row `which[i]` at `positions[i]`, for scattered (row, position) pairs:
        each row's key is hashed once, not once per pair."""
        if self.rows.device.type == "cpu":
            z = positions.to(torch.int64).contiguous().numpy().view(np.uint64) * _U(_POS & _MASK64)
            z += self._base_np(stream)[which.numpy()] + _U(_GOLDEN & _MASK64)
            return torch.from_numpy(_finalise_np(z).view(np.int64))
        return _finalise(self._base(stream)[which] + positions.to(torch.int64) * _POS)

    def uniform(self, n: int, stream: str) -> Tensor:
        """(B, n) float32 in [0, 1), 24 bits of resolution."""
        if self.rows.device.type == "cpu":  # the top 24 bits are final before the last xor-shift
            top = self._grid_np(n, stream, last_round=False)
            top >>= _U(40)
            out = top.view(np.int64).astype(np.float32)
            out *= np.float32(1.0 / (1 << 24))
            return torch.from_numpy(out)
        return _shr(self.bits(n, stream), 40).to(torch.float32) * (1.0 / (1 << 24))

    def uniform64(self, n: int, stream: str) -> Tensor:
        """(B, n) float64 in [0, 1), 53 bits of resolution (for thresholds that need exact rates)."""
        if self.rows.device.type == "cpu":
            top = self._grid_np(n, stream)
            top >>= _U(11)
            out = top.view(np.int64).astype(np.float64)
            out *= 1.0 / (1 << 53)
            return torch.from_numpy(out)
        return _shr(self.bits(n, stream), 11).to(torch.float64) * (1.0 / (1 << 53))

    def scalar(self, stream: str) -> Tensor:
        """(B,) float64 in [0, 1): one number per row."""
        return self.uniform64(1, stream)[:, 0]

    def integers(self, n: int, high: Tensor | int, stream: str, low: Tensor | int = 0) -> Tensor:
        """(B, n) int64 uniform on [low, high) (per-row bounds broadcast from (B,) or (B, 1))."""
        if isinstance(high, Tensor) and high.dim() == 1:
            high = high[:, None]
        if isinstance(low, Tensor) and low.dim() == 1:
            low = low[:, None]
        span = high - low
        u = self.uniform64(n, stream)
        return low + torch.floor(u * span).to(torch.int64)

    def permutation_keys(self, n: int, stream: str) -> Tensor:
        """(B, n) distinct-with-high-probability sort keys: `argsort` gives a uniform permutation per row."""
        return self.bits(n, stream)
