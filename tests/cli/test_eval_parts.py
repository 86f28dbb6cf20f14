"""`objtrain eval` runs the suite's parts from one list (`objtrain/evaluation/suite.py`: EVAL_PARTS), in
the order and under the names `--skip` takes."""

from __future__ import annotations

from objtrain.evaluation.suite import EVAL_PARTS, PARTS


def test_the_parts_are_the_skip_names_in_order() -> None:
    assert tuple(part.name for part in EVAL_PARTS) == PARTS
    assert [part.name for part in EVAL_PARTS if not part.timed] == ["samples"]  # part_seconds leaves it out
