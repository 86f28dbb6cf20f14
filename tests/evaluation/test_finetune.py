"""`eval --finetune`: the whole model fine-tuned on a labelled task, weights chosen on dev, scored on test."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.evaluation.finetune import FinetuneConfig, finetune
from objtrain.evaluation.probe import Labelled
from objtrain.evaluation.suite import EvalOptions, evaluate
from objtrain.models.checkpoint import load_checkpoint


def keyword_task(stdlib_texts: list[str], n: int, seed: int) -> Labelled:
    """Lines of standard-library source, labelled by which of two keywords was put at a random place in
    them: learnable by a model that reads its input, never by one that ignores it."""
    rng = random.Random(seed)
    lines = [ln.strip() for text in stdlib_texts for ln in text.splitlines() if len(ln.strip()) > 20]
    texts, labels = [], []
    for _ in range(n):
        words = rng.choice(lines).split()[:8]
        label = rng.choice(["yes", "no"])
        words.insert(rng.randrange(len(words) + 1), "while" if label == "yes" else "lambda")
        texts.append(" ".join(words))
        labels.append(label)
    return Labelled(texts, labels)


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encdec"])
def test_fine_tuning_learns_a_task_a_fresh_head_cannot_guess(
    kind: str, debug_checkpoint: Callable[..., Path], tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    ckpt = load_checkpoint(debug_checkpoint(kind), "cpu")
    before = {k: v.clone() for k, v in ckpt.model.state_dict().items()}
    train, dev, test = (keyword_task(stdlib_texts, n, s) for n, s in ((256, 0), (64, 1), (128, 2)))
    config = FinetuneConfig(steps=30, lrs=(1e-3,), batch_size=16)
    out = finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=0, config=config)
    assert out["finetune_accuracy"] >= 0.75 > 0.65 >= out["finetune_majority_accuracy"]
    assert out["finetune_mcc"] >= 0.5
    assert out["finetune_test_examples"] == 128 and out["finetune_train_examples"] == 256
    assert 1 <= out["finetune_best_step"] <= 30
    # The checkpoint's own model is never trained: the fine-tune works on a copy.
    for k, v in ckpt.model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_fine_tuning_is_deterministic_under_the_seed(
    debug_checkpoint: Callable[..., Path], tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    ckpt = load_checkpoint(debug_checkpoint("decoder"), "cpu")
    train, dev, test = (keyword_task(stdlib_texts, n, s) for n, s in ((96, 0), (32, 1), (32, 2)))
    config = FinetuneConfig(steps=8, lrs=(3e-4, 1e-3), batch_size=8)
    runs = [finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=s, config=config) for s in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert runs[0]["finetune_best_step"] in (2, 4, 6, 8)


def test_eval_finetune_on_labelled_files(
    debug_checkpoint: Callable[..., Path], stdlib_texts: list[str], tmp_path: Path
) -> None:
    """Through `evaluate`: the probe's files, a fifth of train held out as dev, the scores as metrics."""
    for name, (n, seed) in {"train": (160, 0), "test": (48, 1)}.items():
        data = keyword_task(stdlib_texts, n, seed)
        rows = [json.dumps({"text": t, "label": lab}) for t, lab in zip(data.texts, data.labels, strict=True)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    options = EvalOptions(
        probe_train=tmp_path / "train.jsonl",
        probe_valid=tmp_path / "test.jsonl",
        finetune=True,
        finetune_steps=4,
        skip=("lm", "corrupted", "infill", "probe", "samples"),
    )
    held = tmp_path / "held.txt"
    held.write_text(stdlib_texts[0], encoding="utf-8")
    result = evaluate(debug_checkpoint("encoder"), data=held, options=options)
    assert 0.0 <= result["finetune_accuracy"] <= 1.0 and result["finetune_test_examples"] == 48
    assert result["finetune_train_examples"] == 128  # 160 less the fifth held out as dev
    assert "finetune" in result["part_seconds"] and "probe_accuracy" not in result


def test_the_rate_best_on_dev_is_kept_and_scored_as_its_own_fine_tune(
    debug_checkpoint: Callable[..., Path], tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    """Several rates: each fine-tune starts from the same copy, head and batch order, so the one kept is
    exactly that rate's fine-tune alone; a rate too small to learn anything in 30 steps is not kept."""
    ckpt = load_checkpoint(debug_checkpoint("encoder"), "cpu")
    train, dev, test = (keyword_task(stdlib_texts, n, s) for n, s in ((256, 0), (64, 1), (128, 2)))
    both = finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=0,
                    config=FinetuneConfig(steps=30, lrs=(1e-3, 1e-9), batch_size=16))  # fmt: skip
    alone = finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=0,
                     config=FinetuneConfig(steps=30, lrs=(1e-3,), batch_size=16))  # fmt: skip
    assert both["finetune_lr"] == 1e-3 and both["finetune_lrs_tried"] == 2.0
    assert {k: v for k, v in both.items() if k != "finetune_lrs_tried"} == {
        k: v for k, v in alone.items() if k != "finetune_lrs_tried"
    }
    tiny = finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=0,
                    config=FinetuneConfig(steps=30, lrs=(1e-9,), batch_size=16))  # fmt: skip
    assert tiny["finetune_dev_accuracy"] < both["finetune_dev_accuracy"]


def test_more_fine_tune_seeds_measure_its_own_noise_and_leave_the_score_alone(
    debug_checkpoint: Callable[..., Path], tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    """`seeds` 3: two more fine-tunes at the rate chosen, each with its own head and batch order; their
    spread with the first is the fine-tune's sd, and the score reported is still the first fine-tune's."""
    ckpt = load_checkpoint(debug_checkpoint("decoder"), "cpu")
    train, dev, test = (keyword_task(stdlib_texts, n, s) for n, s in ((96, 0), (32, 1), (64, 2)))
    config = FinetuneConfig(steps=8, lrs=(3e-4, 1e-3), batch_size=8)
    once = finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=5, config=config)
    thrice = finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=5,
                      config=FinetuneConfig(steps=8, lrs=(3e-4, 1e-3), seeds=3, batch_size=8))  # fmt: skip
    assert {
        k: v for k, v in thrice.items() if k not in ("finetune_seeds", "finetune_accuracy_tune_sd")
    } == once
    assert thrice["finetune_seeds"] == 3.0 and "finetune_accuracy_tune_sd" not in once
    # The sd of the three fine-tunes' test accuracies: the first, and each other seed alone at that rate.
    rate = FinetuneConfig(steps=8, lrs=(once["finetune_lr"],), batch_size=8)
    others = [finetune(ckpt.model, tokenizer, train, dev, test, 64, seed=s, config=rate) for s in (6, 7)]
    accuracies = [once["finetune_accuracy"], *(o["finetune_accuracy"] for o in others)]
    assert thrice["finetune_accuracy_tune_sd"] == pytest.approx(float(np.std(accuracies, ddof=1)))


@pytest.mark.parametrize(
    "bad",
    [{"finetune_steps": 0}, {"finetune_lrs": (0.0,)}, {"finetune_lrs": ()}, {"finetune_seeds": 0}],
)
def test_bad_fine_tuning_settings_are_refused(bad: dict) -> None:
    with pytest.raises(UserError, match="--finetune"):
        EvalOptions(finetune=True, **bad)


def test_the_cli_refuses_bad_fine_tuning_steps_in_one_line(
    debug_checkpoint: Callable[..., Path], objtrain_cli: Callable[..., tuple]
) -> None:
    code, _out, err = objtrain_cli("eval", debug_checkpoint("decoder"), "--finetune", "--finetune-steps", "0")
    assert code == 2 and "--finetune-steps must be at least 1" in err and "Traceback" not in err
    code, _out, err = objtrain_cli(
        "eval", debug_checkpoint("decoder"), "--finetune", "--finetune-lr", "1e-3,x"
    )
    assert code == 2 and "--finetune-lr takes comma-separated numbers" in err and "Traceback" not in err
