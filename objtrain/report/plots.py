"""What a comparison's plots and a sweep's share: matplotlib without a display, a grid of panels, one
colour per arm, a fitted curve's bootstrap band, and each PNG written whole."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from objtrain.io import atomic_file
from objtrain.stats import fit as fitting


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: PNGs on a machine without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def arm_colours(names: Iterable[str]) -> dict[str, str]:
    """One colour per arm, in the experiment's order: an arm keeps its colour in every panel."""
    return {name: f"C{i % 10}" for i, name in enumerate(names)}


def panel_grid(panels: int, width: float, height: float, head: float = 0.0) -> tuple[Any, list[Any], int]:
    """A figure of `panels` panels, three to a row (`width` x `height` inches each, `head` more for the
    title), the unused ones blank: the figure, its panels in order, and the number of rows."""
    cols = min(panels, 3)
    rows = math.ceil(panels / cols)
    fig, axes = pyplot().subplots(rows, cols, figsize=(width * cols, height * rows + head), squeeze=False)
    for ax in axes.flat[panels:]:
        ax.axis("off")
    return fig, list(axes.flat), rows


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
