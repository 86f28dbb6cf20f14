"""Baselines and noise beside every probe: bag of words, the same architecture at random init, the probe's
own sd over probe seeds, and which method measured it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation import probe
from objtrain.evaluation.suite import METRICS, EvalOptions, _probe, evaluate, near_baseline
from objtrain.models.checkpoint import load_checkpoint

WORDS = {
    "pos": ["good", "fine", "great", "nice", "lovely"],
    "neg": ["bad", "dull", "poor", "awful", "boring"],
}


def _sentences(n: int, seed: int) -> probe.Labelled:
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(n):
        label = ("pos", "neg")[i % 2]
        texts.append(f"the film was {rng.choice(WORDS[label])} and {rng.choice(['long', 'short', 'new'])}")
        labels.append(label)
    return probe.Labelled(texts, labels)


def test_bag_of_words_counts_the_training_splits_tokens_only() -> None:
    train = [[5, 5, 7], [7, 9]]
    test = [[5, 11, 11]]  # 11 never occurs in training: no feature for it
    xtr, xte = probe.bow_features([train, test], vocab_size=16)
    # features: tokens by the number of training examples they occur in (7: two; 5 and 9: one, lower id first)
    assert xtr.shape == (2, 3) and xte.shape == (1, 3)
    assert torch.allclose(
        xtr, torch.tensor([[np.log(2), np.log(3), 0.0], [np.log(2), 0.0, np.log(2)]]).double()
    )
    assert torch.allclose(xte, torch.tensor([[0.0, np.log(2), 0.0]]).double())
    assert probe.bow_features([train, test], 16, n_features=1)[0].shape == (2, 1)


def test_random_init_is_the_architecture_under_a_seed_leaving_the_rng_alone(tokenizer: Tokenizer) -> None:
    from objtrain.models.zoo import build_model, model_config

    torch.manual_seed(5)
    trained = build_model(model_config("decoder", "debug", vocab_size=tokenizer.vocab_size))
    state = torch.get_rng_state()
    a, b = probe.random_init_like(trained, 3), probe.random_init_like(trained, 3)
    assert torch.equal(torch.get_rng_state(), state)
    assert not a.training and a.config == trained.config
    for (name, pa), pb, pt in zip(a.named_parameters(), b.parameters(), trained.parameters(), strict=True):
        assert torch.equal(pa, pb) and pa.shape == pt.shape, name
    assert any(not torch.equal(pa, pt) for pa, pt in zip(a.parameters(), trained.parameters(), strict=True))


def test_probe_seed_sd_redraws_each_class_and_measures_the_spread() -> None:
    labels = ["a"] * 30 + ["b"] * 10
    idx = probe.stratified_subsample(labels, 0.8, 1)
    assert sorted(labels[i] for i in idx).count("b") == 8 and len(idx) == 32
    assert np.array_equal(idx, probe.stratified_subsample(labels, 0.8, 1))
    assert not np.array_equal(idx, probe.stratified_subsample(labels, 0.8, 2))
    g = torch.Generator().manual_seed(0)
    noisy = torch.randn(40, 4, generator=g, dtype=torch.float64)
    test_x, test_y = torch.randn(60, 4, generator=g, dtype=torch.float64), ["a", "b"] * 30

    def protocol(xs: list[torch.Tensor], ys: list[str]) -> dict[str, float]:
        return probe.run_probe(xs[0], ys, test_x, test_y)

    sd = probe.probe_seed_sd(protocol, [noisy], labels, seed=4, seeds=5)
    assert sd > 0 and sd == probe.probe_seed_sd(protocol, [noisy], labels, seed=4, seeds=5)

    # a constant feature: every refit predicts the majority, no spread
    def constant(xs: list[torch.Tensor], ys: list[str]) -> dict[str, float]:
        return probe.run_probe(xs[0], ys, torch.ones(60, 1, dtype=torch.float64), test_y)

    assert probe.probe_seed_sd(constant, [torch.ones(40, 1, dtype=torch.float64)], labels, 4) == 0.0


def _task_dir(root: Path) -> Path:
    (root / "sst2").mkdir(parents=True)
    for split, seed, n in (("train", 0, 48), ("dev", 1, 16), ("test", 2, 20)):
        data = _sentences(n, seed)
        lines = [f"{1 if y == 'pos' else 0} {t}" for t, y in zip(data.texts, data.labels, strict=True)]
        (root / "sst2" / f"stsa.binary.{split}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_every_probe_reports_its_baselines_under_fixed_names(
    debug_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    # the checkpoint is the debug encoder built under seed 0: probed at eval seed 0, the random-init
    # baseline is the checkpoint itself, and the two scores must agree
    ckpt = load_checkpoint(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32}))
    ckpt.model.eval()
    options = EvalOptions(seed=0, probe_tasks=("sst2",), probe_data=_task_dir(tmp_path / "data"))
    out = _probe(ckpt, options, 32, torch.device("cpu"))
    names = ["majority_accuracy", "bow_accuracy", "bow_mcc", "random_init_accuracy", "random_init_mcc"]
    for name in [*names, "accuracy_probe_sd"]:
        assert isinstance(out[f"probe_sst2_{name}"], float), name
        assert METRICS[f"probe_sst2_{name}"][0] == "info" and METRICS[f"probe_{name}"][0] == "info"
    assert out["probe_sst2_random_init_accuracy"] == out["probe_sst2_accuracy"]
    assert out["probe_sst2_random_init_mcc"] == out["probe_sst2_mcc"]
    assert out["probe_sst2_bow_accuracy"] == 1.0  # the label is a word of the sentence
    assert out["probe_method"] == "linear"
    # another eval seed: another random init, so another score is possible; the names stay
    bare = _probe(ckpt, EvalOptions(seed=0, probe_baselines=False, probe_seeds=1, probe_tasks=("sst2",),
                                    probe_data=tmp_path / "data"), 32, torch.device("cpu"))  # fmt: skip
    assert not any(k.endswith(("_bow_accuracy", "_random_init_accuracy", "_probe_sd")) for k in bare)
    assert bare["probe_sst2_accuracy"] == out["probe_sst2_accuracy"]


def test_the_default_probe_and_last_layer_mode_have_them_too(debug_checkpoint: Callable[..., Path]) -> None:
    ckpt = load_checkpoint(debug_checkpoint("decoder", {"objective": "clm", "seq_len": 32}))
    ckpt.model.eval()
    for layers in ("best", "last"):
        out = _probe(ckpt, EvalOptions(probe_layers=layers, probe_seeds=3), 32, torch.device("cpu"))
        for name in ("probe_bow_accuracy", "probe_random_init_accuracy", "probe_accuracy_probe_sd"):
            assert 0.0 <= out[name] <= 1.0, (layers, name)
        assert "probe_bow_mcc" not in out  # several classes: no MCC


def test_near_baseline_names_the_probes_that_do_not_beat_random_init() -> None:
    result = {"probe_accuracy": 0.50, "probe_random_init_accuracy": 0.45, "probe_accuracy_probe_sd": 0.03}
    assert "random init 0.450" in near_baseline(result)
    assert near_baseline({**result, "probe_accuracy": 0.60}) == ""
    assert near_baseline({"probe_sst2_accuracy": 0.5, "probe_sst2_random_init_accuracy": 0.6}).startswith(
        "sst2"
    )


def test_the_method_records_fine_tuning(debug_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    path = debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32})
    options = EvalOptions(
        skip=("lm", "conditional", "corrupted", "infill", "samples"),
        probe_tasks=("sst2",),
        probe_data=_task_dir(tmp_path / "data"),
        probe_seeds=1,
        probe_baselines=False,
        finetune=True,
        finetune_steps=2,
    )
    data = tmp_path / "t.txt"
    data.write_text("x = 1\n", encoding="utf-8")
    assert evaluate(path, data, options)["probe_method"] == "linear+finetune"
    options.skip = (*options.skip, "probe")
    assert evaluate(path, data, options)["probe_method"] == "finetune"


def test_probe_seeds_below_one_are_refused() -> None:
    from objtrain.errors import UserError

    with pytest.raises(UserError, match="--probe-seeds must be at least 1"):
        EvalOptions(probe_seeds=0)


def test_the_command_line_leaves_them_out_on_request(
    objtrain_cli: Callable[..., tuple[int, str, str]], debug_checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    import json

    data = tmp_path / "t.txt"
    data.write_text("x = 1\n", encoding="utf-8")
    ckpt = debug_checkpoint("decoder", {"objective": "clm", "seq_len": 32})
    args = (
        "eval",
        ckpt,
        "--data",
        data,
        "--skip",
        "lm,conditional,corrupted,infill,samples",
        "--format",
        "json",
    )
    code, out, err = objtrain_cli(*args, "--no-baselines", "--probe-seeds", "1")
    assert code == 0, err
    result = json.loads(out)
    assert "probe_accuracy" in result and "probe_bow_accuracy" not in result
    assert "probe_accuracy_probe_sd" not in result and result["probe_method"] == "linear"


def test_the_random_init_baseline_starts_where_the_run_started(debug_checkpoint: Callable[..., Path]) -> None:
    """Under the run's own training seed (its weights before step 1), so seeds spread it as they spread the
    arms; a checkpoint that records no seed falls back to the eval seed."""
    from objtrain.evaluation.suite import _ProbeTask

    def random_params(training: dict) -> tuple[list[torch.Tensor], Any]:
        ckpt = load_checkpoint(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32, **training}))
        task = _ProbeTask(ckpt, EvalOptions(seed=0), 32, torch.device("cpu"))
        return [p.detach() for p in task.random_model().parameters()], ckpt

    seven, ckpt = random_params({"seed": 7})
    expected = [p.detach() for p in probe.random_init_like(ckpt.model, 7).parameters()]
    assert all(torch.equal(a, b) for a, b in zip(seven, expected, strict=True))
    eight, _ = random_params({"seed": 8})
    assert any(not torch.equal(a, b) for a, b in zip(seven, eight, strict=True))
    unseeded, ckpt = random_params({})
    at_eval_seed = [p.detach() for p in probe.random_init_like(ckpt.model, 0).parameters()]
    assert all(torch.equal(a, b) for a, b in zip(unseeded, at_eval_seed, strict=True))


def test_baselines_are_fitted_once_a_process_for_the_arms_that_share_them(
    debug_checkpoint: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A comparison's arms share the bag of words (one tokenizer) and, seed by seed, the random-init model
    (one architecture): each is fitted once, and reused to the same numbers a fresh fit gives."""
    from objtrain.evaluation import suite

    calls = {"bow": 0, "random": 0}
    bow, random_init = probe.bow_features, probe.random_init_like

    def counted_bow(*args: Any, **kwargs: Any) -> Any:
        calls["bow"] += 1
        return bow(*args, **kwargs)

    def counted_random(*args: Any, **kwargs: Any) -> Any:
        calls["random"] += 1
        return random_init(*args, **kwargs)

    monkeypatch.setattr(probe, "bow_features", counted_bow)
    monkeypatch.setattr(probe, "random_init_like", counted_random)
    options = EvalOptions(seed=0, probe_seeds=1, probe_tasks=("sst2",), probe_data=_task_dir(tmp_path / "d"))

    def probed(seed: int, nudge: float) -> dict[str, Any]:
        ckpt = load_checkpoint(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32, "seed": seed}))
        with torch.no_grad():  # another arm: other weights, the same tokenizer and architecture
            for p in ckpt.model.parameters():
                p.add_(nudge * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        ckpt.model.eval()
        return _probe(ckpt, options, 32, torch.device("cpu"))

    baselines = ("probe_sst2_bow_accuracy", "probe_sst2_bow_mcc", "probe_sst2_random_init_accuracy",
                 "probe_sst2_random_init_mcc")  # fmt: skip
    first, second = probed(3, 0.0), probed(3, 0.5)
    assert calls == {"bow": 1, "random": 1}
    assert [second[k] for k in baselines] == [first[k] for k in baselines]
    other_seed = probed(4, 0.5)  # its own random init, the same bag of words
    assert calls == {"bow": 1, "random": 2}
    assert other_seed["probe_sst2_bow_accuracy"] == first["probe_sst2_bow_accuracy"]
    suite._BASELINES.clear()
    assert [probed(3, 0.5)[k] for k in baselines] == [first[k] for k in baselines]  # fitted afresh
    assert calls == {"bow": 2, "random": 3}
    # Shared through a folder (`compare --jobs`): a process that finds them there fits nothing again.
    monkeypatch.setattr(suite, "SHARED_BASELINES", tmp_path / "shared")
    suite._BASELINES.clear()
    assert [probed(3, 0.5)[k] for k in baselines] == [first[k] for k in baselines]
    assert calls == {"bow": 3, "random": 4} and len(list((tmp_path / "shared").glob("*.json"))) == 2
    suite._BASELINES.clear()  # as another process
    assert [probed(3, 0.5)[k] for k in baselines] == [first[k] for k in baselines]
    assert calls == {"bow": 3, "random": 4}


def test_fine_tuning_has_a_random_init_baseline_fitted_once(
    debug_checkpoint: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objtrain.evaluation import finetune, suite

    # the debug encoder is built under seed 0 and records no training seed: at eval seed 0 the random-init
    # baseline is the checkpoint's own weights, fine-tuned alike to the same scores
    ckpt = load_checkpoint(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32}))
    options = EvalOptions(seed=0, probe_tasks=("sst2",), probe_data=_task_dir(tmp_path / "data"),
                          finetune=True, finetune_steps=4)  # fmt: skip
    calls: list[int] = []
    real = finetune.finetune
    monkeypatch.setattr(finetune, "finetune", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = suite._finetune(ckpt, options, 32, torch.device("cpu"))
    assert len(calls) == 2  # the checkpoint, then the same architecture at random init
    assert out["finetune_sst2_random_init_accuracy"] == out["finetune_sst2_accuracy"]
    assert out["finetune_sst2_random_init_mcc"] == out["finetune_sst2_mcc"]
    for name in ("random_init_accuracy", "random_init_mcc", "majority_accuracy"):
        assert METRICS[f"finetune_sst2_{name}"][0] == "info"
    # another arm of a comparison, same architecture and seed: its baseline is kept, not fine-tuned again
    again = suite._finetune(ckpt, options, 32, torch.device("cpu"))
    assert len(calls) == 3 and again == out
    # another eval seed draws another random init and fine-tune: fitted anew
    suite._finetune(ckpt, EvalOptions(**{**options.__dict__, "seed": 1}), 32, torch.device("cpu"))
    assert len(calls) == 5
    bare = suite._finetune(ckpt, EvalOptions(**{**options.__dict__, "probe_baselines": False}), 32,
                           torch.device("cpu"))  # fmt: skip
    assert (
        not any("random_init" in k for k in bare)
        and bare["finetune_sst2_accuracy"] == out["finetune_sst2_accuracy"]
    )


def test_later_seeds_fine_tune_at_the_rates_their_first_seed_chose(
    debug_checkpoint: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`finetune_lr_chosen` fixes the checkpoint's rate per task; `finetune_twin_seed` gives the random-init
    twin the rate the first seed's twin chose on dev (that twin fitted once, at every rate), not its own."""
    from objtrain.evaluation import finetune, suite

    ckpt = load_checkpoint(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32}))
    lrs = (1e-9, 1e-3)
    options = EvalOptions(seed=0, probe_tasks=("sst2",), probe_data=_task_dir(tmp_path / "data"),
                          finetune=True, finetune_steps=4, finetune_lrs=lrs,
                          finetune_lr_chosen={"sst2": 1e-9}, finetune_twin_seed=7)  # fmt: skip
    tried: list[tuple[float, ...]] = []
    real = finetune.finetune
    monkeypatch.setattr(finetune, "finetune", lambda *a, **k: tried.append(a[7].lrs) or real(*a, **k))
    suite._BASELINES.clear()
    out = suite._finetune(ckpt, options, 32, torch.device("cpu"))
    assert out["finetune_sst2_lr"] == 1e-9 and out["finetune_sst2_lrs_tried"] == 1.0
    # the checkpoint at its fixed rate, the first seed's twin at both, this seed's twin at the one it chose
    twin_rate = out["finetune_sst2_random_init_lr"]
    assert tried == [(1e-9,), lrs, (twin_rate,)] and twin_rate in lrs
    first_twin = [s for s in suite._BASELINES.values() if s["finetune_lrs_tried"] == 2.0]
    assert len(first_twin) == 1 and first_twin[0]["finetune_lr"] == twin_rate
    suite._BASELINES.clear()
    own = suite._finetune(ckpt, EvalOptions(**{**options.__dict__, "finetune_twin_seed": 0}), 32, "cpu")
    assert tried[-1] == lrs and own["finetune_sst2_random_init_lr"] in lrs  # its own seed: chosen itself


def test_fine_tuning_keeps_to_the_tasks_named(
    debug_checkpoint: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objtrain.errors import UserError
    from objtrain.evaluation import suite

    ckpt = load_checkpoint(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 32}))
    splits = (_sentences(32, 0), _sentences(8, 1), _sentences(8, 2))
    monkeypatch.setattr(suite, "_probe_splits", lambda options: [("sst2", *splits), ("trec", *splits)])
    options = EvalOptions(probe_tasks=("sst2", "trec"), finetune=True, finetune_steps=2,
                          probe_baselines=False, finetune_tasks=("trec",))  # fmt: skip
    out = suite._finetune(ckpt, options, 32, torch.device("cpu"))
    assert "finetune_trec_accuracy" in out and not any(k.startswith("finetune_sst2") for k in out)
    with pytest.raises(UserError, match="--finetune-task 'cola' is not one of the probe's tasks"):
        EvalOptions(probe_tasks=("sst2",), finetune=True, finetune_tasks=("cola",))
    # an experiment that fine-tunes on SST-2 still runs without named tasks: the default probe's task
    monkeypatch.setattr(suite, "_probe_splits", lambda options: [("", *splits)])
    out = suite._finetune(ckpt, dataclasses.replace(options, probe_tasks=()), 32, torch.device("cpu"))
    assert "finetune_accuracy" in out
