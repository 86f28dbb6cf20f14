"""T5 span boundaries (`noise.random_span_ends`, the core of span corruption and UL2's R/X denoisers) pinned
to their reference: the implementation draws the keep and the noise segmentations with keys as wide as each
side needs; the version below, kept as the specification, builds both sides' keys over the widest side.
Both must give the same boundaries and, through span corruption and UL2, bit-identical batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from objtrain.objectives import noise, span, ul2
from objtrain.objectives.noise import _INT64_MAX, _segment_by_keys, _span_counts_batched
from objtrain.objectives.registry import build_objective
from objtrain.rng import RowRandom
from objtrain.specials import Specials

SP = Specials()


def reference_span_ends(
    lengths: Tensor,
    noise_density: float | Tensor,
    mean_noise_span_length: float | Tensor,
    rr: RowRandom,
    stream: str = "spans",
) -> Tensor:
    """(N, 2k - 1) int64 boundaries of `random_spans_noise_mask` before its roll, ascending: where
    keep 1, noise 1, keep 2, ... end; the mask is noise where an odd number of them lie at or before a
    position. Unused spans pile up at max(L, 2), past the document.

    The keep and noise segmentations share one draw per gap (its high and low 32 bits) and one top-k
    over 2N rows: fewer, larger tensor ops.
    """
    N = lengths.numel()
    device = lengths.device
    lp = lengths.clamp(min=2)
    n_noise, n_spans = _span_counts_batched(lengths, noise_density, mean_noise_span_length)
    n_items = torch.cat([lp - n_noise, n_noise])  # (2N,): kept tokens, then noise tokens
    gaps = max(int(n_items.max()) - 1, 1)
    g = torch.arange(gaps, device=device)
    bits = rr.bits(gaps, stream)
    # 31 random bits from each half of a draw, above the gap index: distinct keys, so top-k and argsort
    # pick the same gaps whatever the batch (built in place: fewer temporaries)
    keys = torch.empty(2 * N, gaps, dtype=torch.int64, device=device)
    torch.bitwise_right_shift(bits, 33, out=keys[:N])
    torch.bitwise_and(bits, 0x7FFFFFFF, out=keys[N:])
    keys.bitwise_left_shift_(31).add_(g)
    keys.masked_fill_(g[None, :] >= (n_items - 1)[:, None], _INT64_MAX)
    sizes = _segment_by_keys(keys, n_items, torch.cat([n_spans, n_spans]))
    k = sizes.size(1)
    interleaved = torch.stack([sizes[:N], sizes[N:]], dim=2).reshape(N, 2 * k)
    return interleaved.cumsum(1)[:, :-1]


@pytest.mark.parametrize("density", [0.15, 0.5, 0.8])
@pytest.mark.parametrize("mean", [1.0, 3.0, 32.0])
def test_span_ends_match_the_reference(density: float, mean: float) -> None:
    g = torch.Generator().manual_seed(int(density * 100 + mean))
    for n in (1, 5, 64):
        lengths = torch.randint(0, 1200, (n,), generator=g)
        lengths[: n // 4] = torch.randint(0, 4, (n // 4,), generator=g)  # empty, 1-, 2- and 3-token documents
        rr = RowRandom(n, torch.arange(n))
        got = noise.random_span_ends(lengths, density, mean, rr, "span/mask")
        assert torch.equal(got, reference_span_ends(lengths, density, mean, rr, "span/mask"))
        # per-document density and mean span, as UL2 passes them
        d = torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.05
        m = torch.rand(n, generator=g, dtype=torch.float64) * 10 + 1
        assert torch.equal(
            noise.random_span_ends(lengths, d, m, rr, "x"), reference_span_ends(lengths, d, m, rr, "x")
        )


def batches_agree(
    objective: Any, rows: Tensor, docs: Tensor, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = torch.arange(rows.size(0)) + 100 * seed
    new = objective(rows, docs, index, seed)
    with monkeypatch.context() as m:
        for module in (noise, span, ul2):
            m.setattr(module, "random_span_ends", reference_span_ends)
        old = objective(rows, docs, index, seed)
    assert new.tensors().keys() == old.tensors().keys()
    for name, tensor in old.tensors().items():
        assert torch.equal(tensor, new.tensors()[name]), name
    assert new.stats == old.stats


@pytest.mark.parametrize("end", ["cut", "boundary", "full"])
@pytest.mark.parametrize(
    "name, kind, overrides",
    [
        ("span", "encdec", {}),
        ("span", "decoder", {}),
        ("span", "encdec", {"random_roll": True}),
        ("span", "decoder", {"random_roll": True, "noise_density": 0.5}),
        ("ul2", "encdec", {}),
        ("ul2", "decoder", {}),
        ("ul2", "encdec", {"flat_layout": False, "random_roll": True}),
        ("ul2", "encdec", {"random_roll": True}),
    ],
)
def test_batches_match_the_reference(
    make_packed_rows: Callable[[int, int, int, str], tuple[Tensor, Tensor]],
    monkeypatch: pytest.MonkeyPatch,
    end: str,
    name: str,
    kind: str,
    overrides: dict[str, Any],
) -> None:
    """Packed rows of EOS-only, one-token, short and long documents, ending as `end` says."""
    overrides = dict(overrides)
    flat = overrides.pop("flat_layout", True)
    objective = build_objective(name, SP, model_kind=kind, overrides=overrides)  # type: ignore[arg-type]
    objective.flat_layout = flat  # UL2 encoder-decoder: the flat layout (default) or the padded pieces
    for seed, width in enumerate([40, 300, 1024]):
        rows, docs = make_packed_rows(seed, 12, objective.raw_length(width), end)
        batches_agree(objective, rows, docs, seed, monkeypatch)
