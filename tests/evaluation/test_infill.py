"""Infilling: tasks cut from functions, prompts in the model's mode, exact match and parse rate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from objtrain.errors import UserError
from objtrain.evaluation import infill

CODE = '''
import os


def first(items):
    """The first item."""
    for item in items:
        return item
    return None


class Box:
    def __init__(self, value):
        self.value = value
        self.seen = 0

    def get(self):
        self.seen += 1
        return self.value
'''


def test_tasks_cut_a_line_or_a_span_out_of_a_function() -> None:
    tasks = infill.code_tasks([CODE, "not python ("], 20, ("line", "span"), seed=0)
    assert tasks and {t.kind for t in tasks} == {"line", "span"}
    sources = set(infill.functions(CODE))
    for t in tasks:
        assert t.prefix + t.middle + t.suffix in sources
        assert t.middle and infill.parses(t.prefix + t.middle + t.suffix)
        if t.kind == "line":
            assert t.middle.endswith("\n") and t.middle.strip() and "\n" not in t.middle[:-1]
            assert t.prefix.startswith("def ") and t.prefix.endswith("\n")  # whole lines, signature kept
    again = infill.code_tasks([CODE], 20, ("line", "span"), seed=0)  # text without functions adds none
    assert [(t.prefix, t.middle, t.suffix) for t in again] == [(t.prefix, t.middle, t.suffix) for t in tasks]
    other = infill.code_tasks([CODE], 20, ("line", "span"), seed=1)
    assert [(t.prefix, t.middle) for t in other] != [(t.prefix, t.middle) for t in tasks]


def test_a_line_cut_never_takes_the_signature() -> None:
    source = infill.functions(CODE)[0]
    rng = np.random.default_rng(0)
    for _ in range(30):
        task = infill.cut(source, "line", rng, "t")
        assert task is not None and task.prefix.startswith("def ")


def _rigged(tokenizer, answers: dict[str, str], wrong: bool = False):
    """A stand-in for greedy decoding that reads the PSM prompt and writes the known middle."""
    s = tokenizer.specials

    def generate(model, prompt, max_new, sampling=None, stop_ids=(), use_cache=True) -> Iterator[int]:
        assert prompt[0] == s.fim_prefix and prompt[-1] == s.fim_middle and s.fim_suffix in prompt
        cut = prompt.index(s.fim_suffix)
        prefix, suffix = tokenizer.decode(prompt[1:cut]), tokenizer.decode(prompt[cut + 1 : -1])
        middle = "pass\n" if wrong else answers[prefix + "\x00" + suffix]
        yield from tokenizer.encode(middle)

    return generate


def test_a_rigged_fim_model_scores_full_exact_match(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    tasks = infill.code_tasks([CODE], 12, ("line", "span"), seed=1)
    answers = {t.prefix + "\x00" + t.suffix: t.middle for t in tasks}
    monkeypatch.setattr(infill.gen, "generate_decoder", _rigged(tokenizer, answers))
    results = infill.infill_tasks(None, "fim-psm", tokenizer, tokenizer.specials, {}, tasks)  # type: ignore[arg-type]
    m = infill.infill_metrics(results)
    assert m["infill_exact_match"] == 1.0 and m["infill_parse_rate"] == 1.0 and m["infill_stop_rate"] == 1.0
    monkeypatch.setattr(infill.gen, "generate_decoder", _rigged(tokenizer, answers, wrong=True))
    m = infill.infill_metrics(infill.infill_tasks(None, "fim-psm", tokenizer, tokenizer.specials, {}, tasks))  # type: ignore[arg-type]
    assert m["infill_exact_match"] == 0.0 and m["infill_parse_rate"] < 1.0


def test_normalised_match_ignores_trailing_whitespace_only() -> None:
    t = infill.InfillTask("t", "def f():\n", "    return 1\n", "")
    assert infill.InfillResult(t, "    return 1", True).exact_norm
    assert not infill.InfillResult(t, "    return 1", True).exact
    assert not infill.InfillResult(t, "  return 1\n", True).exact_norm


def test_modes_follow_the_training_record() -> None:
    assert infill.infill_mode("decoder", {"objective": "fim", "fim_mode": "spm"}) == "fim-spm"
    assert infill.infill_mode("decoder", {"objective": "clm"}) == "left-to-right"
    assert infill.infill_mode("decoder", {}) == "left-to-right"
    assert infill.infill_mode("encdec", {"objective": "span"}) == "sentinel"
    assert infill.infill_mode("encdec", {"objective": "bart"}) == "none"
    assert infill.infill_mode("encoder", {"objective": "mlm"}) == "none"


def test_humaneval_infilling_file(tmp_path: Path) -> None:
    good = tmp_path / "tasks.jsonl"
    good.write_text(
        '{"task_id": "test/0", "prompt": "def return1():\\n", "suffix": "1", '
        '"canonical_solution": "    return ", "entry_point": "return1"}\n'
    )
    (task,) = infill.read_infill_file(good)
    assert (task.prefix, task.middle, task.suffix) == ("def return1():\n", "    return ", "1")
    assert infill.InfillResult(task, "    return ", True).parses
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x", "prompt": "a"}\n')
    with pytest.raises(UserError, match="'suffix', 'canonical_solution'"):
        infill.read_infill_file(bad)
    with pytest.raises(UserError, match=r"--infill file .* is a directory, not a file"):
        infill.read_infill_file(tmp_path)
