"""benchmarks/bench_gpu.py's steps, built and run once on CPU at the debug size.

The script's figures need a CUDA card, where each try is expensive: a step that cannot even be built (a
peer's config the installed transformers refuses, say) would waste it, so what a CPU can run is run here.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from objtrain.models.zoo import build_model, model_config

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench_gpu() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCHMARKS / "bench_gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.DEVICE = torch.device("cpu")
    yield module
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != BENCHMARKS]


def _params(step_of: object) -> list[torch.Tensor]:
    """The parameters a step closure trains (its optimizer's), read off the closure."""
    cells = [c.cell_contents for c in step_of.__closure__ or ()]  # type: ignore[attr-defined]
    optimizer = next(c for c in cells if isinstance(c, torch.optim.Optimizer))
    return [p for g in optimizer.param_groups for p in g["params"]]


def test_objtrain_step_trains_on_store_rows_with_several_documents(
    bench_gpu: ModuleType, train_store: Path
) -> None:
    batch, vocab = bench_gpu.store_batch(train_store, 2, 64, torch.device("cpu"))
    assert int(batch.document_ids.max()) > 0  # packed rows: the document mask is on
    cfg = model_config("decoder", "debug", {"attention_kernel": "sdpa"}, vocab_size=vocab)
    step = bench_gpu.objtrain_step(cfg, batch, False, torch.device("cpu"))
    before = [p.detach().clone() for p in _params(step)]
    step()
    after = _params(step)
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_hf_peer_has_the_decoders_shape_and_trains(bench_gpu: ModuleType) -> None:
    pytest.importorskip("transformers")
    cfg = model_config("decoder", "debug", {}, vocab_size=512)
    peer = bench_gpu.hf_llama(cfg, 32)
    ours = build_model(cfg)
    # The same widths: MFU and tokens/s are compared at equal parameters and FLOPs.
    assert sum(p.numel() for p in peer.parameters()) == sum(p.numel() for p in ours.parameters())
    batch = bench_gpu.random_batch(2, 32, cfg.vocab_size, torch.device("cpu"))
    step = bench_gpu.hf_step(cfg, batch, False, torch.device("cpu"))
    before = [p.detach().clone() for p in _params(step)]
    step()
    assert any(not torch.equal(a, b) for a, b in zip(_params(step), before, strict=True))


def test_plan_measures_every_variant_and_objective_once_most_telling_first(bench_gpu: ModuleType) -> None:
    args = argparse.Namespace(
        sizes=["small", "base"], objectives=bench_gpu.OBJECTIVES, only=["bare", "train", "decode"]
    )
    steps = bench_gpu.plan(args)
    # The loop against its own bare compiled step comes first: a card lent briefly still answers it.
    assert steps[:2] == [("bare", "small", [bench_gpu.STORE_ROWS]), ("train", "small", ["clm"])]
    bare = [(size, v) for what, size, items in steps if what == "bare" for v in items]
    assert sorted(bare) == sorted((s, v) for s in ("small", "base") for v in bench_gpu.BARE_VARIANTS)
    trained = [(size, o) for what, size, items in steps if what == "train" for o in items]
    assert sorted(trained) == sorted([("small", o) for o in bench_gpu.OBJECTIVES] + [("base", "clm")])
    decode = next(i for i, (what, _, _) in enumerate(steps) if what == "decode")
    mtp = next(i for i, (what, _, items) in enumerate(steps) if what == "train" and "mtp" in items)
    assert decode > mtp  # it decodes with the MTP model trained before it
    only_train = bench_gpu.plan(
        argparse.Namespace(sizes=["small"], objectives=["clm", "span"], only=["train"])
    )
    assert only_train == [("train", "small", ["clm"]), ("train", "small", ["span"])]
