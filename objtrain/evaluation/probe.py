"""Linear probes on frozen features (Alain and Bengio 2016; with control baselines as Hewitt and Liang
2019 argue).

Features: the frozen model in eval mode, no gradients, one vector per example from the last layer's
normed hidden states: the mean over the example's real tokens (default; encoder-decoders: the mean of
the encoder output), the last real token (decoders: the only position that saw everything), the first,
or an encoder's pooled head (`tanh(dense(h_0))`, trained by NSP/SOP).

Classifier: multinomial logistic regression with an L2 penalty, fitted full-batch with L-BFGS in float64
on features standardised with the *train* split's mean and standard deviation. Deterministic: no
random initialisation (zeros), no minibatches.

Labelled files (`read_labelled`):
- JSONL: one object per line with `label` and a text field (`text`, `sentence` or `question`);
- TSV with a header naming a `label` column (GLUE style); without a header, the CoLA layout
  `source<TAB>label<TAB>mark<TAB>sentence`, or two columns of which one is a label;
- `LABEL<space>text` per line (SST-2 and TREC as distributed).
A few lines that are not UTF-8 are decoded with replacement characters and counted (TREC's train file has
one stray byte); a file with a NUL byte or with mostly non-UTF-8 lines is refused as not UTF-8 text, and
so are a directory, an empty file and a file without a label column, each with one clear error line.

The default probe needs no files: functions from a few standard-library packages, labelled by package.
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from objtrain.batch import Batch
from objtrain.data.sources import stdlib_root
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError, did_you_mean
from objtrain.models.zoo import build_model
from objtrain.objectives.registry import recorded_segments

TEXT_FIELDS = ("text", "sentence", "question", "sentence1")
LABEL_RE = re.compile(r"^[A-Za-z0-9_.:+-]{1,32}$")
DEFAULT_PACKAGES = ("asyncio", "email", "unittest", "xml", "multiprocessing", "logging", "json", "http")


@dataclass
class Labelled:
    texts: list[str]
    labels: list[str]
    replaced_lines: int = 0  # lines that were not UTF-8 and were decoded with replacement characters


@dataclass
class LabelledIds(Labelled):
    """Examples already in token ids (sentence pairs): `texts` are for the eye, the model reads `ids`, and
    segment 1 of example i starts at `second[i]`."""

    ids: list[list[int]] = field(default_factory=list)
    second: list[int] = field(default_factory=list)


def _is_label(value: str) -> bool:
    return bool(LABEL_RE.match(value.strip()))


def read_labelled(path: Path) -> Labelled:
    """Texts and labels from a JSONL, TSV or `LABEL text` file (see the module docstring)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"probe file {path} is a directory, not a file")
    if not path.is_file():
        raise UserError(f"probe file not found: {path}")
    data = path.read_bytes()
    raw_lines = data.splitlines()
    lines: list[str] = []
    replaced = 0
    for raw in raw_lines:
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(raw.decode("utf-8", errors="replace"))
            replaced += 1
    if lines and lines[0].startswith("\ufeff"):  # a byte-order mark (spreadsheet exports) is not text
        lines[0] = lines[0][1:]
    bad = _first_bad_byte(data)
    # Text has no NUL bytes (UTF-16 and binary files do); a stray byte is tolerated, mostly bad lines not.
    if bad and (b"\x00" in data or 2 * replaced > sum(1 for raw in raw_lines if raw.strip())):
        raise UserError(f"probe file {path} is not UTF-8 text ({bad})")
    # blank lines are skipped; each kept line keeps its number in the file for error messages
    numbered = [(n, line.rstrip("\r")) for n, line in enumerate(lines, 1) if line.strip()]
    lines = [line for _, line in numbered]
    numbers = [n for n, _ in numbered]
    if not lines:
        raise UserError(f"probe file {path} is empty")
    try:
        if path.suffix in (".jsonl", ".json") or lines[0].lstrip().startswith("{"):
            texts, labels = _read_jsonl(path, lines, numbers)
        elif "\t" in lines[0]:
            texts, labels = _read_tsv(path, lines, numbers)
        else:
            texts, labels = _read_spaced(path, lines, numbers)
    except UserError as exc:
        if not bad:
            raise
        # The bad bytes may be why the format was not recognised: name them next to the reader's complaint.
        count = f"{replaced} line is" if replaced == 1 else f"{replaced} lines are"
        raise UserError(f"{exc}; {count} not UTF-8 (first {bad})") from None
    return Labelled(texts, labels, replaced)


def _first_bad_byte(data: bytes) -> str:
    """Where the first byte that cannot be in UTF-8 text is ("invalid byte at offset 17, line 2"), or ""."""
    nul = data.find(b"\x00")
    try:
        data.decode("utf-8")
        invalid = -1
    except UnicodeDecodeError as exc:
        invalid = exc.start
    if invalid < 0 and nul < 0:
        return ""
    kind, offset = ("invalid", invalid) if invalid >= 0 and (nul < 0 or invalid < nul) else ("NUL", nul)
    line = data.count(b"\n", 0, offset) + 1
    return f"{kind} byte at offset {offset}, line {line}"


def _read_jsonl(path: Path, lines: list[str], numbers: list[int]) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for number, line in zip(numbers, lines, strict=True):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        if not isinstance(record, dict) or "label" not in record:
            raise UserError(f"{path}:{number}: no 'label' field: a probe needs a label for every example")
        field = next((f for f in TEXT_FIELDS if isinstance(record.get(f), str)), None)
        if field is None:
            raise UserError(f"{path}:{number}: no text field (one of {', '.join(TEXT_FIELDS)})")
        texts.append(record[field])
        labels.append(str(record["label"]))
    return texts, labels


def _read_tsv(path: Path, lines: list[str], numbers: list[int]) -> tuple[list[str], list[str]]:
    header = [h.strip().lower() for h in lines[0].split("\t")]
    rows = [line.split("\t") for line in lines]
    if "label" in header:  # GLUE style: named columns
        li = header.index("label")
        ti = next((header.index(f) for f in TEXT_FIELDS if f in header), None)
        if ti is None:
            raise UserError(f"{path}: the header has no text column (one of {', '.join(TEXT_FIELDS)})")
        body, numbers = rows[1:], numbers[1:]
    elif any(f in header for f in TEXT_FIELDS):
        raise UserError(f"{path}: the header has no 'label' column: a probe needs a label for every example")
    else:
        width = len(rows[0])
        if width >= 4 and all(_is_label(r[1]) for r in rows if len(r) >= 4):  # CoLA
            li, ti = 1, width - 1
        elif width == 2 and all(_is_label(r[0]) for r in rows if len(r) == 2):
            li, ti = 0, 1
        elif width == 2 and all(_is_label(r[1]) for r in rows if len(r) == 2):
            li, ti = 1, 0
        else:
            raise UserError(f"{path}: no label column found (expected CoLA's 4 columns, or LABEL<TAB>text)")
        body = rows
    texts, labels = [], []
    for number, row in zip(numbers, body, strict=True):
        if len(row) <= max(li, ti) or not row[li].strip():
            raise UserError(f"{path}:{number}: missing label column")
        texts.append(row[ti])
        labels.append(row[li].strip())
    return texts, labels


def _read_spaced(path: Path, lines: list[str], numbers: list[int]) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for number, line in zip(numbers, lines, strict=True):
        label, _, text = line.partition(" ")
        if not text.strip() or not _is_label(label):
            raise UserError(
                f"{path}:{number}: no label column: expected `LABEL text`, a TSV with a label column, "
                "or JSONL with a 'label' field"
            )
        texts.append(text)
        labels.append(label)
    # Any first word looks like a label: words count as labels only when they repeat like classes do.
    distinct = set(labels)
    numeric = all(label.lstrip("-").isdigit() for label in distinct)
    if not numeric and (len(distinct) > 50 or len(distinct) > len(labels) / 2):
        raise UserError(
            f"{path}: no label column: the first words ({len(distinct)} distinct in {len(labels)} lines) "
            "do not look like class labels; expected `LABEL text`, a TSV with a label column, or JSONL"
        )
    return texts, labels


def stdlib_probe(seed: int, per_class: int = 48, min_per_class: int = 16) -> tuple[Labelled, Labelled]:
    """The default probe: which standard-library package a function comes from.

    Functions (3 to 40 lines, dedented) of each package in `DEFAULT_PACKAGES` that has at least
    `min_per_class` of them; `per_class` sampled per package under `seed` (from files read in a seeded
    order until three times as many are found), three quarters to train."""
    root = stdlib_root()
    rng = np.random.default_rng(seed)
    train, valid = Labelled([], []), Labelled([], [])
    for package in DEFAULT_PACKAGES:
        found: list[str] = []
        files = sorted((root / package).rglob("*.py")) if (root / package).is_dir() else []
        files = [f for f in files if not any(p in ("test", "tests", "idle_test") for p in f.parts)]
        for j in rng.permutation(len(files)):  # files in a seeded order, until there are enough functions
            if len(found) >= 3 * per_class:
                break
            file = files[int(j)]
            try:
                text = file.read_text(encoding="utf-8")
                tree = ast.parse(text)
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
            lines = text.splitlines(keepends=True)
            for node in ast.walk(tree):
                is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                if is_function and node.end_lineno and 3 <= node.end_lineno - node.lineno + 1 <= 40:
                    found.append(textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno])))
        if len(found) < min_per_class:
            continue
        pick = rng.permutation(len(found))[:per_class]
        n_train = (3 * len(pick)) // 4
        for k, j in enumerate(pick):
            target = train if k < n_train else valid
            target.texts.append(found[int(j)])
            target.labels.append(package)
    if len({*train.labels}) < 2:
        raise UserError("the default probe needs at least two standard-library packages; pass --probe")
    return train, valid


def _trunk_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks whose outputs are candidate features: a decoder's or encoder's stack, an encoder-decoder's
    encoder (MTP heads beyond head 1 are not part of the trunk a probe reads)."""
    kind = getattr(model.config, "kind", "decoder")  # type: ignore[union-attr]
    stack = model.encoder if kind == "encdec" else model.blocks  # type: ignore[union-attr]
    return list(stack)  # type: ignore[arg-type]


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    """Each text's ids, truncated to `max_len` (an empty text: one EOS)."""
    return [(tokenizer.encode(t) or [tokenizer.specials.eos])[:max_len] for t in texts]


def padded(encoded: Sequence[list[int]], pad: int) -> tuple[Tensor, Tensor, Tensor]:
    """(ids, valid, lengths) of examples padded to the longest: (B, L), (B, L) bool, (B,)."""
    L = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), L), pad, dtype=torch.int64)
    for i, e in enumerate(encoded):
        ids[i, : len(e)] = torch.tensor(e)
    lengths = torch.tensor([len(e) for e in encoded])
    return ids, torch.arange(L)[None, :] < lengths[:, None], lengths


def pair_segment_ids(valid: Tensor, second: Tensor) -> Tensor:
    """(B, L) segment ids of padded sentence pairs: 1 from position `second[b]` of row b on, 0 before it
    and on padding."""
    positions = torch.arange(valid.size(1), device=valid.device)[None, :]
    return ((positions >= second[:, None]) & valid).long()


def trained_with_segments(training: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's model was trained with segment ids, from its `training` record.

    The zoo's encoders all carry a segment embedding, but only the sentence-pair objectives (NSP, SOP)
    feed it: every token they train on gets row 0 (sentence A) or 1 (B) added. Any other objective trains
    with no segment ids, so its rows stay at their random initialisation, and adding row 0 at evaluation
    would shift every input by noise the model never saw. Rule: one text is fed as sentence A (all zeros)
    to a model trained on sentence pairs, and with no segment ids to every other model. The objectives
    say which feed segments (`Objective.feeds_segments`); a mixture asks its components."""
    return recorded_segments(training)


def last_hidden(
    model: nn.Module, ids: Tensor, valid: Tensor, segments: bool = False, second: Tensor | None = None
) -> Tensor:
    """The last layer's normed hidden states (B, L, D) of single-example rows: a decoder's causal, an
    encoder's bidirectional, an encoder-decoder's encoder output. `segments`: feed an encoder segment ids,
    for models trained on sentence pairs only (see `trained_with_segments`): 0 at every token, or with
    `second` (B,) segment 1 from that position of each row on (a pair's B)."""
    kind = getattr(model.config, "kind", "decoder")  # type: ignore[union-attr]
    B, L = ids.shape
    docs = torch.where(valid, 0, -1)
    positions = torch.arange(L, device=ids.device).expand(B, L)
    if kind == "encdec":
        return model.encode(ids, positions, docs)  # type: ignore[operator]
    attention = "causal" if kind == "decoder" else "bidirectional"
    segment_ids = None
    if segments and kind == "encoder":
        segment_ids = torch.zeros_like(ids) if second is None else pair_segment_ids(valid, second)
    batch = Batch(ids, ids, positions, docs, attention, segment_ids=segment_ids)  # type: ignore[arg-type]
    return model.last_hidden(batch)  # type: ignore[operator]


@torch.no_grad()
def layer_features(
    model: nn.Module,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    max_len: int,
    pooling: str = "mean",
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    layers: str = "last",
    segments: bool = False,
) -> list[Tensor]:
    """Frozen features of `texts` (each truncated to `max_len` tokens): one (N, D) float64 tensor per layer.

    `layers="last"`: the last layer's normed hidden states only. `layers="all"`: the output of every block
    of the trunk (layer 1 .. L-1, taken by forward hooks) and the last layer as above, so a probe can
    choose its layer; a decoder's last layer is shaped to predict the next token, and mid layers often
    transfer better. `segments`: see `last_hidden`."""
    encoded = encode_texts(tokenizer, texts, max_len)
    return encoded_features(
        model, encoded, tokenizer.specials.pad, pooling, batch_size, device, layers, segments
    )


@torch.no_grad()
def encoded_features(
    model: nn.Module,
    encoded: Sequence[list[int]],
    pad: int,
    pooling: str = "mean",
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    layers: str = "last",
    segments: bool = False,
    second: Sequence[int] | None = None,
) -> list[Tensor]:
    """`layer_features` of examples already in token ids; `second`: where each example's segment 1 starts
    (sentence pairs), read by models trained with segments only."""
    # Batches of similar lengths pad little (texts of 2 to 60 tokens, batched as they come, are half
    # padding); the features are put back in the texts' order at the end.
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    blocks = _trunk_blocks(model)[:-1] if layers == "all" and pooling != "pooled" else []
    captured: list[Tensor] = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: captured.append(out)) for b in blocks]
    per_layer: list[list[Tensor]] = [[] for _ in range(len(blocks) + 1)]
    try:
        for lo in range(0, len(encoded), batch_size):
            take = order[lo : lo + batch_size]
            ids, valid, lengths = padded([encoded[i] for i in take], pad)
            ids, valid = ids.to(device), valid.to(device)
            at = None if second is None else torch.tensor([second[i] for i in take], device=device)
            captured.clear()
            hidden = last_hidden(model, ids, valid, segments, at)
            if pooling == "pooled":  # BERT's pooled head: tanh(dense(h_0)), trained by NSP/SOP
                pooler = getattr(model, "pooler", None)
                if pooler is None:
                    raise UserError(
                        "--probe-pooling pooled needs an encoder with a pooled head (n_classes > 0)"
                    )
                per_layer[-1].append(pooler.dense(hidden[:, 0]).tanh().double().cpu())
                continue
            for k, h in enumerate([*captured[: len(blocks)], hidden]):
                per_layer[k].append(_pool(h.double(), valid, lengths, pooling).cpu())
    finally:
        for hook in hooks:
            hook.remove()
    back = torch.empty(len(order), dtype=torch.int64)
    back[torch.tensor(order, dtype=torch.int64)] = torch.arange(len(order))
    return [torch.cat(chunks)[back] for chunks in per_layer]


def _pool(hidden: Tensor, valid: Tensor, lengths: Tensor, pooling: str) -> Tensor:
    if pooling == "last":
        return hidden[torch.arange(len(hidden), device=hidden.device), lengths.to(hidden.device) - 1]
    if pooling == "first":
        return hidden[:, 0]
    w = valid.to(hidden.dtype)[..., None]
    return (hidden * w).sum(dim=1) / w.sum(dim=1)


def features(
    model: nn.Module,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    max_len: int,
    pooling: str = "mean",
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    segments: bool = False,
) -> Tensor:
    """(N, D) float64 frozen features of `texts` from the last layer (see `layer_features`)."""
    return layer_features(model, tokenizer, texts, max_len, pooling, batch_size, device, "last", segments)[-1]


def fit_logistic(x: Tensor, y: Tensor, n_classes: int, l2: float = 1e-3, max_iter: int = 200) -> Tensor:
    """Multinomial logistic regression, full batch, L-BFGS in float64: weights (D + 1, C), bias last.

    Loss: mean cross-entropy + l2/2 * ||W||^2 (the bias is not penalised). Starts from zeros: the
    same data gives the same weights."""
    x = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
    w = torch.zeros(x.size(1), n_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w, y) + 0.5 * l2 * w[:-1].pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return w.detach()


def predict(w: Tensor, x: Tensor) -> Tensor:
    x = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], dim=1)
    return (x @ w).argmax(dim=1)


def mcc(pred: Tensor, gold: Tensor) -> float:
    """Matthews correlation of binary predictions; 0 when any factor of the denominator is 0."""
    tp = int(((pred == 1) & (gold == 1)).sum())
    tn = int(((pred == 0) & (gold == 0)).sum())
    fp = int(((pred == 1) & (gold == 0)).sum())
    fn = int(((pred == 0) & (gold == 1)).sum())
    den = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    return (tp * tn - fp * fn) / den**0.5 if den else 0.0


def run_probe(
    train_x: Tensor,
    train_labels: Sequence[str],
    valid_x: Tensor,
    valid_labels: Sequence[str],
    l2: float = 1e-3,
) -> dict[str, float]:
    """Standardise on train, fit, and score on valid: accuracy, majority baseline, MCC for two classes."""
    classes = sorted(set(train_labels))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(valid_labels) - set(classes))
    if unknown:
        raise UserError(f"probe validation labels {unknown[:3]} never occur in the training file")
    if len(classes) < 2:
        raise UserError("the probe's training file has a single label: a classifier needs two or more")
    y = torch.tensor([index[c] for c in train_labels])
    yv = torch.tensor([index[c] for c in valid_labels])
    mean, std = train_x.mean(dim=0), train_x.std(dim=0).clamp(min=1e-8)
    xs, xv = (train_x - mean) / std, (valid_x - mean) / std
    w = fit_logistic(xs, y, len(classes), l2)
    pred = predict(w, xv)
    majority = int(torch.bincount(y, minlength=len(classes)).argmax())
    out = {
        "probe_accuracy": float((pred == yv).double().mean()),
        "probe_train_accuracy": float((predict(w, xs) == y).double().mean()),
        "probe_majority_accuracy": float((yv == majority).double().mean()),
        "probe_classes": float(len(classes)),
        "probe_train_examples": float(len(y)),
        "probe_valid_examples": float(len(yv)),
        "probe_feature_dim": float(train_x.size(1)),
    }
    if len(classes) == 2:
        out["probe_mcc"] = mcc(pred, yv)
    return out


L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)  # the probe's penalty, chosen on the selection split with the layer


def select_and_score(
    train_x: Sequence[Tensor],
    train_labels: Sequence[str],
    dev_x: Sequence[Tensor],
    dev_labels: Sequence[str],
    test_x: Sequence[Tensor],
    test_labels: Sequence[str],
    l2_grid: Sequence[float] = L2_GRID,
) -> dict[str, float]:
    """Fit a probe per (layer, l2) on train, choose the pair with the best dev score (MCC for two classes,
    else accuracy; ties go to the earlier pair), and report that probe on test: the layer and penalty are
    never chosen on the split that is reported (Hewitt and Liang 2019)."""
    best: tuple[float, int, float] | None = None
    for layer in range(len(train_x)):
        for l2 in l2_grid:
            scores = run_probe(train_x[layer], train_labels, dev_x[layer], dev_labels, l2)
            key = scores.get("probe_mcc", scores["probe_accuracy"])
            if best is None or key > best[0]:
                best = (key, layer, l2)
    assert best is not None
    _, layer, l2 = best
    dev = run_probe(train_x[layer], train_labels, dev_x[layer], dev_labels, l2)
    out = run_probe(train_x[layer], train_labels, test_x[layer], test_labels, l2)
    acc, n = out["probe_accuracy"], out["probe_valid_examples"]
    out["probe_accuracy_se"] = (acc * (1 - acc) / n) ** 0.5 if n else float("nan")
    out["probe_dev_accuracy"] = dev["probe_accuracy"]
    out["probe_layer"] = float(layer + 1)
    out["probe_layers"] = float(len(train_x))
    out["probe_l2"] = l2
    out["probe_test_examples"] = out.pop("probe_valid_examples")
    out["probe_dev_examples"] = dev["probe_valid_examples"]
    return out


def split_off(data: Labelled, share: float, seed: int) -> tuple[Labelled, Labelled]:
    """(rest, held) with `share` of the examples held out under `seed`."""
    order = np.random.default_rng(seed).permutation(len(data.texts))
    cut = max(int(len(order) * share), 1)
    held, kept = order[:cut], order[cut:]
    pick = lambda idx: Labelled([data.texts[i] for i in idx], [data.labels[i] for i in idx])  # noqa: E731
    rest = pick(kept)
    rest.replaced_lines = data.replaced_lines
    return rest, pick(held)


# Named probe tasks as the shared corpora lay them out: (train, dev or None, test), relative to a data
# directory. Without a dev file a fifth of train is held out to choose the layer; CoLA's in-domain dev
# split is its public test set (GLUE's test labels are not public).
TASKS: dict[str, tuple[str, str | None, str]] = {
    "sst2": ("sst2/stsa.binary.train", "sst2/stsa.binary.dev", "sst2/stsa.binary.test"),
    "trec": ("trec/TREC.train.all", None, "trec/TREC.test.all"),
    "cola": ("cola/in_domain_train.tsv", None, "cola/in_domain_dev.tsv"),
}


def task_files(name: str, root: Path) -> tuple[Labelled, Labelled | None, Labelled]:
    if name not in TASKS:
        raise UserError(f"unknown probe task {name!r}{did_you_mean(name, TASKS)} (tasks: {', '.join(TASKS)})")
    train, dev, test = TASKS[name]
    read = lambda rel: read_labelled(Path(root) / rel)  # noqa: E731
    return read(train), (read(dev) if dev else None), read(test)


# Baselines and noise beside every probe (Hewitt and Liang 2019, control tasks): what the same probe
# reaches from token counts alone, and from the same architecture before any training; and how much the
# probe itself moves when its training examples are redrawn. A claim about features is worth something only
# beyond these.

BOW_FEATURES = 2048  # the most frequent tokens of the probe's training split that the bag of words counts
PROBE_SEEDS = 5  # probe refits for the probe-seed standard deviation
PROBE_SEED_SHARE = 0.8  # share of each class's training examples each refit draws


def bow_features(
    encoded: Sequence[Sequence[list[int]]], vocab_size: int, n_features: int = BOW_FEATURES
) -> list[Tensor]:
    """Bag-of-words features of several splits of token ids, the first being the probe's training split:
    log(1 + count) of each of the `n_features` tokens that occur in the most training examples (ties to the
    lower id), one (N, n_features) float64 tensor per split. The vocabulary is chosen on the training split
    alone, so nothing is learnt from the split that is scored."""

    def counts(split: Sequence[list[int]]) -> Tensor:
        rows = torch.repeat_interleave(torch.arange(len(split)), torch.tensor([len(e) for e in split]))
        ids = torch.tensor([t for e in split for t in e], dtype=torch.int64)
        out = torch.zeros(len(split), vocab_size, dtype=torch.float64)
        out.index_put_((rows, ids), torch.ones(len(ids), dtype=torch.float64), accumulate=True)
        return out

    train = counts(encoded[0])
    df = (train > 0).sum(dim=0)
    # stable sort: among tokens in as many examples, the lower id first (deterministic)
    keep = torch.sort(-df, stable=True).indices[: min(n_features, vocab_size)]
    keep = keep[df[keep] > 0]  # every training example has a token (an empty text is one EOS)
    return [c[:, keep].log1p() for c in (train, *(counts(s) for s in encoded[1:]))]


def random_init_like(model: nn.Module, seed: int) -> nn.Module:
    """The same architecture as `model`, freshly initialised under `seed` (the global RNG is left as it
    was), on the model's device, in eval mode: the random-init baseline."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = build_model(model.config)  # type: ignore[arg-type]
    return fresh.to(device).eval()


def stratified_subsample(labels: Sequence[str], share: float, seed: int) -> np.ndarray:
    """Sorted indices of `share` of each class's examples (at least one each), drawn under `seed`."""
    rng = np.random.default_rng(seed)
    labels_arr = np.asarray(labels)
    picked = []
    for c in sorted(set(labels)):
        members = np.flatnonzero(labels_arr == c)
        k = max(1, round(share * len(members)))
        picked.append(rng.permutation(members)[:k])
    return np.sort(np.concatenate(picked))


def probe_seed_sd(
    protocol: Callable[[Sequence[Tensor], Sequence[str]], dict[str, float]],
    train_x: Sequence[Tensor],
    train_labels: Sequence[str],
    seed: int,
    seeds: int = PROBE_SEEDS,
) -> float:
    """Sample standard deviation of the probe's test accuracy over `seeds` refits, each on a stratified
    `PROBE_SEED_SHARE` of the training examples drawn under its own probe seed; `protocol(xs, labels)`
    fits and scores one probe on the rows `xs` (one tensor per layer) of those examples. The fit is
    deterministic given its examples, so the examples are what a probe seed changes."""
    accs = []
    for k in range(seeds):
        idx = stratified_subsample(train_labels, PROBE_SEED_SHARE, seed * 1000 + k)
        at = torch.from_numpy(idx)
        accs.append(protocol([x[at] for x in train_x], [train_labels[i] for i in idx])["probe_accuracy"])
    return float(np.std(accs, ddof=1)) if len(accs) > 1 else float("nan")
