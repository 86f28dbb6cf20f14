"""What a comparison's plots and a sweep's share: matplotlib without a display, a grid of panels, one
colour per arm, a fitted curve's bootstrap band, and each PNG written whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from objtrain.io import atomic_file
from objtrain.stats import fit as fitting


def plot_lines(plots: list[str]) -> list[str]:
    return [f"![{p}]({p})" for p in plots]


def save_png(fig: Any, path: Path) -> None:
    """A figure written whole or not at all, then closed."""
    import matplotlib.pyplot as plt

    with atomic_file(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)


def fit_band(f: fitting.Fit, c: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The 2.5-97.5% band of the fitted curve at `c` over the bootstrap replicates that converged."""
    if f.boot is None:
        return None
    good = f.boot[np.isfinite(f.boot[:, 0])]
    if len(good) < 20:
        return None
    curves = np.stack([fitting.PowerLaw(*row)(c) for row in good])
    lo, hi = np.percentile(curves, [2.5, 97.5], axis=0)
    return lo, hi
