"""The objective registry: name -> class. Adding an objective = one module here + one YAML in
`configs/objectives/`, then one line in `OBJECTIVES` (see docs/adding-an-objective.md)."""

from __future__ import annotations

from objtrain.objectives.base import LossOutput, Objective

OBJECTIVES: dict[str, type[Objective]] = {}

__all__ = ["OBJECTIVES", "LossOutput", "Objective"]
