"""A comparison report in use by one `objtrain compare` is refused to a second one, in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from newcomer_helpers import Result


def test_a_report_in_use_is_refused_and_a_free_one_is_written(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    from objtrain.io import OutputLock

    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump({
            "name": "unit", "question": "q", "expect": "e", "data": {"store": str(small_store)}, "seed": 0,
            "budget": {"tokens": 2 * 4 * 32},
            "train": {"batch": {"seq_len": 32, "batch_size": 4}, "precision": {"dtype": "fp32"},
                      "validation": {"rows": 4, "every": 1}, "device": "cpu", "workers": 0},
            "arms": [{"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}}],
        })
    )  # fmt: skip
    report = tmp_path / "report"
    code, _, err = cli("compare", exp, "-o", report)
    assert code == 0, err
    assert (report / "report.md").is_file()
    before = sorted(p.name for p in report.rglob("*"))
    with OutputLock(report):  # as a comparison still running in it holds it
        for extra in (["--resume"], ["--force"]):
            code, _, err = cli("compare", exp, "-o", report, *extra)
            assert code == 2 and "in use by another objtrain process" in err, err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in report.rglob("*")) == before  # neither resumed nor replaced
