"""Learning regression check: every objective (and each shipped train config's objective) trains a
debug-size model for 16 steps on the tests' standard-library store, and its validation loss at steps 8
and 16 must match the committed reference curve (`learning_curves.json`).

A change that breaks what a model learns without breaking any shape (labels shifted by one, a mask that
hides the targets, a loss normalised by the wrong count, a learning rate schedule off by a factor) moves
these losses by tenths of a nat or more. The tolerance, 0.02 nats, is about one step of learning here
(the curves fall 0.12-0.20 nats from step 8 to 16), so a change that costs a step of progress fails;
other kernels (thread counts, CPU capabilities) reorder float sums and move these losses by far less
(the reference is written with one thread; the check passes with two threads and with
ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine).

The reference depends on the training text, the standard library of the running Python: where its
fingerprint differs from the one recorded (another Python version), the check cannot compare and says
so. Regenerate after a deliberate change to what the models learn:

    .venv/bin/python tests/training/test_learning_curves.py --update
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from objtrain.config import load_yaml
from objtrain.objectives.registry import OBJECTIVES, objective_class
from objtrain.training.loop import train

REFERENCE = Path(__file__).with_name("learning_curves.json")
STEPS, EVERY = 16, 8
TOLERANCE = 0.02  # nats; see the module docstring
TRAIN_CONFIGS = Path(__file__).resolve().parents[2] / "objtrain" / "configs" / "train"


def cases() -> dict[str, dict[str, Any]]:
    """name -> objective section: every registered objective, and each shipped train config's objective."""
    out: dict[str, dict[str, Any]] = {name: {"name": name} for name in sorted(OBJECTIVES)}
    for path in sorted(TRAIN_CONFIGS.glob("*.yaml")):
        section = load_yaml(path).get("objective") or {}
        out[f"train/{path.stem}"] = {"name": section["name"], "overrides": section.get("overrides", {})}
    return out


def fingerprint(store: Path) -> str:
    """What the curves depend on besides the code: the store's training tokens."""
    h = hashlib.sha256()
    for name in ("train.bin", "train.idx"):
        h.update((store / name).read_bytes())
    return h.hexdigest()[:16]


def curve(small_config, store: Path, objective: dict[str, Any], run_dir: Path) -> list[float]:
    kind = objective_class(objective["name"]).model_kinds[0]
    cfg = small_config(
        store,
        objective=objective,
        model={"kind": kind},
        budget={"steps": STEPS},
        validation={"every": EVERY, "rows": 8},
    )
    train(cfg, run_dir, show_progress=False)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    vals = {r["step"]: r["val_loss"] for r in records if r.get("split") == "val"}
    return [float(vals[s]) for s in range(EVERY, STEPS + 1, EVERY)]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(REFERENCE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", list(cases()))
def test_learning_curve_matches_the_reference(name, reference, small_config, train_store, tmp_path) -> None:
    if reference["fingerprint"] != fingerprint(train_store):
        pytest.skip(
            f"the tests' training text differs from the reference's (Python {reference['python']}): "
            "regenerate with --update to compare on this Python"
        )
    assert name in reference["curves"], f"no reference curve for {name}: regenerate with --update"
    got = curve(small_config, train_store, cases()[name], tmp_path / "run")
    want = reference["curves"][name]
    assert np.allclose(got, want, rtol=0, atol=TOLERANCE), f"{name}: val loss {got} against reference {want}"
    assert got[-1] < got[0] + TOLERANCE or name in ("contrastive",), f"{name} did not learn: {got}"


def _update() -> None:
    """Write learning_curves.json from this code, with the tests' own fixtures."""
    import importlib.util
    import tempfile

    from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
    from objtrain.data.tokenizer import Tokenizer, train_sentencepiece
    from objtrain.specials import Specials

    def load(path: Path, name: str) -> Any:  # the two conftest.py files, under names of their own
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    top = load(Path(__file__).parents[1] / "conftest.py", "tests_conftest")
    _small_config = load(Path(__file__).with_name("conftest.py"), "training_conftest")._small_config
    texts = [(top.STDLIB / name).read_text(encoding="utf-8") for name in top.SAMPLE_MODULES]
    lines = [line for text in texts for line in text.splitlines(keepends=True)]
    specials = Specials()
    proto = train_sentencepiece(lines, vocab_size=1200, model_type="unigram", specials=specials)
    tok = Tokenizer(proto, specials)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "corpus").mkdir()
        for i, text in enumerate(texts):
            (root / "corpus" / f"module{i}.py").write_bytes(text.encode("utf-8"))
        (root / "tok.model").write_bytes(tok.model_proto)
        config = TokenizeConfig(tokenizer=root / "tok.model", doc_split="blank-line", valid_fraction=0.1)
        tokenize_corpus([root / "corpus"], root / "store", config)
        curves = {
            name: curve(_small_config, root / "store", objective, root / name.replace("/", "-"))
            for name, objective in cases().items()
        }
        out = {"fingerprint": fingerprint(root / "store"), "python": sys.version.split()[0], "curves": curves}
    REFERENCE.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {REFERENCE}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        _update()
    else:
        print(__doc__)
