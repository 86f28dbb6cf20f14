"""lm-evaluation-harness runs on an exported decoder, on a local task (a YAML over a local JSONL file,
nothing from a hub), and its score equals one computed with the objtrain model on the same items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from interop_helpers import tiny_checkpoint

from objtrain.data.tokenizer import Tokenizer

pytest.importorskip("transformers", reason="the 'hf' extra (transformers) is not installed")
pytest.importorskip("accelerate", reason="the 'lmeval' extra (lm_eval[hf]) is not installed")
lm_eval = pytest.importorskip("lm_eval", reason="the 'lmeval' extra (lm_eval[hf]) is not installed")

ITEMS = [
    {"question": "def add(a, b):\n    return a", "choices": [" + b\n", " - b\n", " * b\n"], "answer": 0},
    {"question": "import", "choices": [" os\n", " sys\n"], "answer": 1},
    {"question": "for i in range(", "choices": ["n):\n", "10):\n", "len(x)):\n"], "answer": 2},
    {"question": "class Point:\n    def", "choices": [" __init__(self", " __repr__(self"], "answer": 0},
    {"question": "if x is None:\n   ", "choices": [" return\n", " raise ValueError\n"], "answer": 1},
]


def objtrain_loglikelihood(
    model: torch.nn.Module, tokenizer: Tokenizer, context: str, continuation: str
) -> float:
    """log p(continuation | context) with objtrain's model and tokenizer, split the way the harness splits:
    trailing whitespace of the context moves to the continuation, context + continuation is encoded whole,
    and the continuation is what follows the context's own encoding."""
    from objtrain.batch import Batch

    stripped = context.rstrip()
    context, continuation = stripped, context[len(stripped) :] + continuation

    whole = tokenizer.encode(context + continuation)
    n_ctx = len(tokenizer.encode(context))
    ids = torch.tensor([whole])
    T = ids.size(1)
    batch = Batch(ids, ids, torch.arange(T)[None], torch.zeros_like(ids), "causal")
    with torch.no_grad():
        logp = model(batch).logits.float().log_softmax(-1)[0]
    return float(sum(logp[t - 1, whole[t]] for t in range(n_ctx, T)))


def test_lm_eval_local_task_matches_objtrain(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no cache of the user's is read or written
    from objtrain.interop.export import export_checkpoint
    from objtrain.models.checkpoint import load_checkpoint

    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, qk_scale=2.0)
    export_checkpoint(ckpt, tmp_path / "hf")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    # target_delimiter "": the choices carry their own leading space (the default " " would add a second)
    (tasks / "objtrain_local.yaml").write_text(
        "task: objtrain_local\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: answer\n"
        "target_delimiter: ''\n"
        "metric_list:\n  - metric: acc\n"
        "metadata:\n  version: 1.0\n"
    )
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(
        model="hf",
        model_args=f"pretrained={tmp_path / 'hf'},dtype=float32",
        tasks=["objtrain_local"],
        task_manager=TaskManager(include_path=str(tasks)),
        device="cpu",
        batch_size=2,
        log_samples=True,
    )
    assert results is not None
    model = load_checkpoint(ckpt).model.float().eval()
    samples = sorted(results["samples"]["objtrain_local"], key=lambda s: s["doc_id"])
    correct = 0
    for sample, item in zip(samples, ITEMS, strict=True):
        theirs = [float(r[0][0]) if isinstance(r[0], (list, tuple)) else float(r[0]) for r in sample["resps"]]
        ours = [objtrain_loglikelihood(model, tokenizer, item["question"], c) for c in item["choices"]]
        assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-3, (ours, theirs)
        correct += int(max(range(len(ours)), key=ours.__getitem__) == item["answer"])
    assert results["results"]["objtrain_local"]["acc,none"] == pytest.approx(correct / len(ITEMS))
