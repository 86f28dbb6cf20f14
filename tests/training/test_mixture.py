"""Data mixtures (`data.sources`): which source a row reads is a pure function of (seed, row), so rows do
not depend on the process or micro-batch layout, resume is exact mid-epoch of one source, shares follow
the weights, and stores of other tokenizers are refused."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from objtrain.data.loader import CorruptedRows, RowSampler
from objtrain.data.mixture import StoreMixture
from objtrain.data.stream import MixedStream, Position, layout, row_needs
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer, train_sentencepiece
from objtrain.errors import UserError
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials
from objtrain.training.config import TrainConfig, build_config, config_dict
from objtrain.training.loop import prepare, train

STDLIB = Path(sysconfig.get_paths()["stdlib"])

# Small standard-library modules: a store of them runs out within a few steps.
STDLIB_SMALL = [(STDLIB / name).read_text(encoding="utf-8") for name in ("colorsys.py", "glob.py")]


def _store(root: Path, texts: list[str], tokenizer_model: Path) -> Path:
    (root / "corpus").mkdir(parents=True)
    for i, text in enumerate(texts):
        (root / "corpus" / f"m{i}.py").write_text(text, encoding="utf-8")
    config = TokenizeConfig(tokenizer=tokenizer_model, doc_split="blank-line", valid_fraction=0.2)
    tokenize_corpus([root / "corpus"], root / "store", config)
    return root / "store"


@pytest.fixture(scope="session")
def small_store(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer) -> Path:
    """A store of the training tokenizer a few hundred rows long: it runs out within a short run."""
    root = tmp_path_factory.mktemp("small")
    (root / "tok.model").write_bytes(tokenizer.model_proto)
    return _store(root, STDLIB_SMALL, root / "tok.model")


@pytest.fixture(scope="session")
def foreign_store(tmp_path_factory: pytest.TempPathFactory, specials: Specials) -> Path:
    """A store tokenized with another tokenizer."""
    root = tmp_path_factory.mktemp("foreign")
    lines = [line for text in STDLIB_SMALL for line in text.splitlines(keepends=True)]
    proto = train_sentencepiece(lines, vocab_size=700, model_type="unigram", specials=specials)
    (root / "tok.model").write_bytes(proto)
    return _store(root, STDLIB_SMALL, root / "tok.model")


def _mixed(a: Path, b: Path, weights: tuple[float, float] = (0.5, 0.5), seed: int = 0) -> MixedStream:
    stream = StoreMixture([a, b], list(weights), ["big", "small"]).stream("train", seed)
    assert isinstance(stream, MixedStream)
    return stream


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_a_rows_source_is_a_pure_function_of_seed_and_row(train_store: Path, small_store: Path) -> None:
    mixed = _mixed(train_store, small_store, seed=3)
    rows = np.arange(5000, dtype=np.int64)
    whole = mixed.source_of(rows)
    pieces = np.concatenate([mixed.source_of(rows[lo : lo + 7]) for lo in range(0, 5000, 7)])
    assert np.array_equal(whole, pieces)
    shuffled = np.random.default_rng(0).permutation(rows)
    assert np.array_equal(mixed.source_of(shuffled), whole[shuffled])
    assert not np.array_equal(_mixed(train_store, small_store, seed=4).source_of(rows), whole)


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.95, 0.05), (1.0, 3.0)])
def test_source_shares_follow_the_weights_within_binomial_tolerance(
    weights: tuple[float, float], train_store: Path, small_store: Path
) -> None:
    mixed = _mixed(train_store, small_store, weights)
    n = 200_000
    counts = np.bincount(mixed.source_of(np.arange(n)), minlength=2)
    for k, w in enumerate(weights):
        p = w / sum(weights)
        assert abs(counts[k] - n * p) <= 5 * math.sqrt(n * p * (1 - p)), (counts, weights)
    # also over a short prefix, as a short run sees it
    head = np.bincount(mixed.source_of(np.arange(2000)), minlength=2)
    p = weights[1] / sum(weights)
    assert abs(head[1] - 2000 * p) <= 5 * math.sqrt(2000 * p * (1 - p))


def _rows_of(mixed: MixedStream, specials: Specials, tokenizer: Tokenizer, world: int, micro: int) -> dict:
    objective = build_objective("mlm", specials, tokenizer, "encoder")
    dataset = CorruptedRows(mixed, objective, 64, 5)
    seen: dict[int, tuple] = {}
    for rank in range(world):
        sampler = RowSampler(objective, 64, 5, 16, micro, rank, world, Position(), 0, 6, stream=mixed)
        for item in sampler:
            _, batch = dataset[item]
            assert item.sources is not None
            for b, g in enumerate(item.rows.tolist()):
                assert g not in seen, f"row {g} read twice"
                seen[g] = (
                    int(item.sources[b]),
                    int(item.offsets[b]),
                    int(item.lengths[b]),
                    batch.input_ids[b].tolist(),
                )
    return seen


def test_each_row_reads_the_same_source_and_text_whatever_the_layout(
    train_store: Path, small_store: Path
) -> None:
    sources = StoreMixture([train_store, small_store], [0.6, 0.4])
    mixed = sources.stream("train", 5)
    assert isinstance(mixed, MixedStream)
    single = _rows_of(mixed, sources.specials, sources.tokenizer, world=1, micro=16)
    assert sorted(single) == list(range(96))  # six steps of 16 rows, none skipped
    for world, micro in ((2, 8), (2, 2), (4, 1), (1, 4)):
        assert _rows_of(mixed, sources.specials, sources.tokenizer, world, micro) == single
    # Within each source the rows lie back to back in its stream: no text skipped, none read twice.
    for k in (0, 1):
        mine = [single[g] for g in sorted(single) if single[g][0] == k]
        assert mine, "a source gave no row"
        assert mine[0][1] == 0
        for (_, off, n, _), (_, nxt, _, _) in itertools.pairwise(mine):
            assert off + n == nxt


def test_a_mixture_row_holds_its_own_sources_text(train_store: Path, small_store: Path) -> None:
    sources = StoreMixture([train_store, small_store], [0.5, 0.5])
    mixed = sources.stream("train", 1)
    assert isinstance(mixed, MixedStream)
    clm = build_objective("clm", sources.specials, sources.tokenizer, "decoder")
    rows = np.arange(40, dtype=np.int64)
    needs = row_needs(clm, 32, rows, 1)
    which, offsets, after = layout(rows, needs, Position(offsets=(0, 0)), mixed)
    tokens, _ = mixed.rows(which, offsets, needs, 33)
    for k, stream in enumerate(mixed.streams):
        sel = which == k
        own, _ = stream.rows(offsets[sel], needs[sel], 33)
        assert torch.equal(tokens[torch.from_numpy(sel)], own)
    assert after.source_rows == (int((which == 0).sum()), int((which == 1).sum()))
    assert after.offsets == tuple(int(needs[which == k].sum()) for k in (0, 1))


def test_one_source_in_sources_trains_as_the_store_itself(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    plain = train(small_config(train_store, budget={"steps": 3}), tmp_path / "a", show_progress=False)
    cfg = small_config(train_store, budget={"steps": 3})
    cfg.data.store, cfg.data.sources = (
        None,
        build_config({"data": {"sources": [{"store": str(train_store)}]}}).data.sources,
    )
    listed = train(cfg, tmp_path / "b", show_progress=False)
    a = load_file(plain.checkpoint / "model.safetensors")  # type: ignore[operator]
    b = load_file(listed.checkpoint / "model.safetensors")  # type: ignore[operator]
    assert all(torch.equal(a[k], b[k]) for k in a)


def _mixture_config(small_config, big: Path, small: Path, **sections: Any) -> TrainConfig:
    cfg = small_config(big, **sections)
    data = {
        "sources": [{"store": str(big), "weight": 0.5}, {"store": str(small), "weight": 0.5, "name": "tiny"}]
    }
    cfg.data = build_config({"data": data}).data
    return cfg


def test_resume_is_exact_mid_epoch_of_one_source(
    train_store: Path, small_store: Path, tmp_path: Path, small_config
) -> None:
    def cfg() -> TrainConfig:
        return _mixture_config(
            small_config,
            train_store,
            small_store,
            budget={"steps": 12},
            checkpoint={"every": 4, "keep": 10},
            batch={"batch_size": 16, "micro_batch_size": 8},
            model={"overrides": {"dropout": 0.1}},
        )

    full = train(cfg(), tmp_path / "full", show_progress=False)
    recs = records(tmp_path / "full")
    steps = [r for r in recs if "loss" in r]
    # the small store runs out during the run, after the step-4 checkpoint: the resume starts mid-epoch
    assert 0 < steps[3]["source/tiny/epochs"] < 1 < steps[-1]["source/tiny/epochs"]
    events = [r for r in recs if r.get("event") == "epoch"]
    assert events and events[0]["source"] == "tiny" and events[0]["epoch"] == 1 and events[0]["step"] > 4
    assert all(r["source/tiny/rows"] + r[f"source/{train_store.name}/rows"] == r["rows"] for r in steps)
    state = json.loads((tmp_path / "full" / "checkpoints" / "step-00000004" / "state.json").read_text())
    assert set(state["position"]) == {"rows", "offsets", "source_rows"}

    shutil.copytree(tmp_path / "full", tmp_path / "half")
    for step in (8, 12):
        shutil.rmtree(tmp_path / "half" / "checkpoints" / f"step-{step:08d}")
    (tmp_path / "half" / "checkpoints" / "latest").unlink()
    resumed = train(cfg(), tmp_path / "half", resume=True, show_progress=False)
    assert resumed.step == 12
    a = load_file(full.checkpoint / "model.safetensors")  # type: ignore[operator]
    b = load_file(resumed.checkpoint / "model.safetensors")  # type: ignore[operator]
    assert all(torch.equal(a[k], b[k]) for k in a)
    again = [r for r in records(tmp_path / "half") if "loss" in r]
    assert [r["loss"] for r in again[-8:]] == [r["loss"] for r in steps[-8:]]
    assert again[-1]["source/tiny/epochs"] == steps[-1]["source/tiny/epochs"]


def test_micro_batches_do_not_change_a_mixture_run(
    train_store: Path, small_store: Path, tmp_path: Path, small_config
) -> None:
    losses = []
    for micro in (8, 2):
        cfg = _mixture_config(
            small_config,
            train_store,
            small_store,
            budget={"steps": 4},
            batch={"batch_size": 8, "micro_batch_size": micro},
        )
        train(cfg, tmp_path / f"m{micro}", show_progress=False)
        losses.append([r["loss"] for r in records(tmp_path / f"m{micro}") if "loss" in r])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_a_mixture_validates_on_every_sources_valid_split(
    train_store: Path, small_store: Path, tmp_path: Path, small_config
) -> None:
    cfg = _mixture_config(small_config, train_store, small_store, validation={"every": 0, "rows": 8})
    plan = prepare(cfg, tmp_path / "run")
    from objtrain.training.loop import ValidationSets

    sets = ValidationSets.build(plan)
    valid = plan.source.stream("valid", 0, shuffle=False)
    assert isinstance(valid, MixedStream)
    which = valid.source_of(np.arange(8))
    assert set(which.tolist()) == {0, 1}  # both stores' valid rows (seed 0 draws both in 8 rows)
    assert sum(b.input_ids.size(0) for b in sets.batches) == 8


def test_the_saved_config_has_one_form_of_data(train_store: Path, small_store: Path, small_config) -> None:
    cfg = _mixture_config(small_config, train_store, small_store)
    data = config_dict(cfg)["data"]
    assert "store" not in data and [s["weight"] for s in data["sources"]] == [0.5, 0.5]
    assert build_config(config_dict(cfg)).data == cfg.data
    single = config_dict(small_config(train_store))["data"]
    assert "sources" not in single  # as single-store runs always saved it: their resumes still match


def test_stores_of_other_tokenizers_are_refused(train_store: Path, foreign_store: Path) -> None:
    with pytest.raises(UserError, match=r"another tokenizer .* a mixture trains one vocabulary"):
        StoreMixture([train_store, foreign_store])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"store": "x", "sources": [{"store": "y"}]}, "give data.store or data.sources, not both"),
        ({"sources": []}, "data.sources is empty"),
        ({"sources": [{"store": "y", "weight": 0}]}, "weight must be a positive number"),
        ({"sources": [{"store": "y", "weight": float("nan")}]}, "weight must be a positive number"),
        ({"sources": [{"store": "y", "name": "a"}, {"store": "z", "name": "a"}]}, "two sources share a name"),
        ({"sources": [{"store": "y", "name": "a/b"}]}, "hold no '/'"),
        ({"sources": [{"weight": 1}]}, "store"),
        ({"sources": [{"store": "y", "wieght": 1}]}, "unknown key 'wieght'"),
    ],
)
def test_bad_sources_are_refused_in_one_line(data: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as err:
        build_config({"data": data})
    assert "\n" not in str(err.value)


def test_the_cli_refuses_a_foreign_tokenizer_with_exit_2(
    train_store: Path, foreign_store: Path, tmp_path: Path, objtrain_cli
) -> None:
    config = tmp_path / "mix.yaml"
    config.write_text(
        json.dumps({"data": {"sources": [{"store": str(train_store)}, {"store": str(foreign_store)}]}})
    )
    code, _, err = objtrain_cli("train", "--config", config, "--objective", "clm", "-o", tmp_path / "run")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "another tokenizer" in err
    assert not (tmp_path / "run").exists()


def test_a_missing_valid_split_names_the_store_that_lacks_it(
    train_store: Path, small_store: Path, tmp_path: Path, small_config
) -> None:
    lacking = tmp_path / "lacking"
    shutil.copytree(small_store, lacking)
    meta = json.loads((lacking / "meta.json").read_text())
    del meta["splits"]["valid"]
    (lacking / "meta.json").write_text(json.dumps(meta))
    cfg = _mixture_config(small_config, train_store, lacking, validation={"every": 0})
    with pytest.raises(UserError, match=rf"{lacking} has no 'valid' split"):
        prepare(cfg, tmp_path / "run")


def test_dry_run_and_corrupt_show_the_mixture_as_training_reads_it(
    train_store: Path, small_store: Path, tmp_path: Path, objtrain_cli
) -> None:
    config = tmp_path / "mix.yaml"
    sources = [
        {"store": str(train_store), "weight": 3},
        {"store": str(small_store), "weight": 1, "name": "tiny"},
    ]
    config.write_text(json.dumps({"data": {"sources": sources}, "seed": 2, "batch": {"seq_len": 32}}))
    code, out, err = objtrain_cli(
        "train", "--config", config, "--objective", "clm", "--model", "debug", "--steps", "5", "--dry-run",
        "-o", tmp_path / "run",
    )  # fmt: skip
    assert code == 0, err
    assert "weight 75.0%" in out and "tiny" in out and "passes over 5 steps" in out
    code, out, err = objtrain_cli(
        "corrupt",
        config,
        "--objective",
        "clm",
        "--seq-len",
        "32",
        "--n",
        "12",
        "--seed",
        "2",
        "--format",
        "jsonl",
    )
    assert code == 0, err
    shown = [json.loads(line)["source"] for line in out.splitlines()]
    drawn = StoreMixture([train_store, small_store], [3, 1], [None, "tiny"]).stream("train", 2)
    assert isinstance(drawn, MixedStream)
    assert shown == [drawn.names[k] for k in drawn.source_of(np.arange(12))]
    assert "a mixture" in err
