"""The model card (README.md) of an export: what the Hugging Face hub shows for a model.

Everything in it is read from the checkpoint and its run, nothing is asked for: the objective and its
settings, the data (the token store's name, its sources' file names and sizes; no local paths, which a
published card would leak), the budget (steps, tokens, time, precision), the run's last metrics at or
before the checkpoint's step (`metrics.jsonl`), the export's own load-back check, and how to load it.
The card opens with the YAML metadata the hub reads (`library_name`, `pipeline_tag`, `tags`, and the
`license` and `datasets` the hub's card check asks for: left as `unknown` and `[]` for the user to fill,
with a note, since only the user knows under what terms the data and the weights may be published).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from objtrain.models.checkpoint import Checkpoint

KINDS = {"decoder": "decoder", "encoder": "encoder", "encdec": "encoder-decoder"}
PIPELINES = {"decoder": "text-generation", "encoder": "fill-mask", "encdec": "text2text-generation"}
LIMITS = ("loss", "val_loss", "val_bpb")  # the metrics shown first; the rest follow in name order


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object, or {} where the file is missing or unreadable (the card says less, it never fails)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def run_directory(checkpoint: Path) -> Path | None:
    """RUN of RUN/checkpoints/NAME or RUN/checkpoint, where metrics.jsonl lives."""
    checkpoint = Path(checkpoint)
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent
    if checkpoint.name == "checkpoint":
        return checkpoint.parent
    return None


def last_metrics(run: Path | None, step: int | None) -> tuple[dict[str, float], dict[str, float]]:
    """(last training record's numbers, last validation record's numbers) at or before `step`."""
    train: dict[str, Any] = {}
    valid: dict[str, Any] = {}
    path = run / "metrics.jsonl" if run is not None else None
    if path is None or not path.is_file():
        return {}, {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}, {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill: the records before it still stand
        if not isinstance(record, dict) or "event" in record or not isinstance(record.get("step"), int):
            continue
        if step is not None and record["step"] > step:
            continue
        if record.get("split") == "val":
            valid = record
        elif "loss" in record:
            train = record
    keep = ("step", "tokens", "rows", "tokens_per_s", "mfu", "lr", "grad_norm", "wall_time", "elapsed")
    keep += ("time", "raw_tokens_fed", "raw_tokens_unused", "target_tokens", "peak_mem_bytes", "split")
    keep += ("data_wait_frac",)

    def numbers(record: dict[str, Any]) -> dict[str, float]:
        return {
            k: float(v)
            for k, v in record.items()
            if k not in keep and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }

    return numbers(train), numbers(valid)


def _ordered(metrics: dict[str, float]) -> list[tuple[str, float]]:
    first = [(k, metrics[k]) for k in LIMITS if k in metrics]
    return first + sorted((k, v) for k, v in metrics.items() if k not in LIMITS)


def _data_lines(state: dict[str, Any]) -> list[str]:
    data = (state.get("config") or {}).get("data") or {}
    store = data.get("store") if isinstance(data, dict) else None
    if not store:
        return ["- data: not recorded in the checkpoint"]
    meta = _read_json(Path(store) / "meta.json")
    lines = [f"- token store: `{Path(store).name}`"]
    if meta:
        options = meta.get("options") or {}
        tokenizer = meta.get("tokenizer") or {}
        if options.get("corpus"):
            lines.append(f"- corpus: objtrain's built-in `{options['corpus']}`")
        sources = [s for s in meta.get("sources") or [] if isinstance(s, dict)]
        if sources:
            shown = ", ".join(
                f"`{Path(str(s.get('path', '?'))).name}` ({int(s.get('bytes', 0)):,} bytes)"
                for s in sources[:5]
            )
            more = f" and {len(sources) - 5} more" if len(sources) > 5 else ""
            lines.append(f"- sources: {shown}{more}")
        splits = meta.get("splits") or {}
        train = splits.get("train") or {}
        if train:
            lines.append(
                f"- training split: {int(train.get('documents', 0)):,} documents, "
                f"{int(train.get('tokens', 0)):,} tokens"
                + (f" (documents cut by {options['doc_split']})" if options.get("doc_split") else "")
            )
        if tokenizer:
            lines.append(
                f"- tokenizer: {tokenizer.get('kind', '?')} {tokenizer.get('model_type') or ''}".rstrip()
                + f", vocabulary {tokenizer.get('vocab_size', '?')}"
            )
    return lines


def _budget_lines(ckpt: Checkpoint, state: dict[str, Any], dtype: str) -> list[str]:
    info = ckpt.training
    config = state.get("config") or {}
    budget = config.get("budget") or {}
    lines = []
    step = info.get("step", state.get("step"))
    if isinstance(step, int):
        lines.append(f"- steps: {step:,}")
    tokens = info.get("tokens", state.get("tokens"))
    if isinstance(tokens, int):
        lines.append(f"- tokens seen: {tokens:,}")
    planned = [f"{k} {v}" for k, v in budget.items() if v is not None]
    if planned:
        lines.append(f"- budget asked for: {', '.join(planned)}")
    batch = config.get("batch") or {}
    if batch:
        seq_len = info.get("seq_len", batch.get("seq_len", "?"))
        lines.append(f"- batch: {batch.get('batch_size', '?')} rows of {seq_len} tokens")
    seconds = state.get("seconds")  # the training steps' wall time (without start-up)
    if isinstance(seconds, int | float):
        device = state.get("accelerator") or state.get("processor") or "?"
        world = state.get("world_size", 1)
        lines.append(f"- training time: {seconds:,.1f} s on {world} x {device}")
    trained = state.get("dtype")
    lines.append(f"- precision: trained in {trained or 'an unrecorded precision'}, weights here in {dtype}")
    if info.get("init_from"):
        lines.append(f"- started from: `{Path(str(info['init_from'])).name}` (`--init-from`)")
    lines.append(f"- seed: {info.get('seed', config.get('seed', '?'))}")
    return lines


def _load_snippet(kind: str, name: str) -> list[str]:
    if kind == "decoder":
        return [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{name}")',
            f'tok = AutoTokenizer.from_pretrained("{name}")',
            'ids = tok("def parse(", return_tensors="pt")["input_ids"]',
            "print(tok.decode(model.generate(ids, max_new_tokens=32)[0]))  # greedy; stops at </s>",
            "```",
        ]
    if kind == "encoder":
        return [
            "```python",
            "from transformers import pipeline",
            "",
            f'fill = pipeline("fill-mask", model="{name}")',
            'print(fill("def <mask>(self):", top_k=3))',
            "```",
        ]
    return [
        "The model runs the code written beside its weights (`modeling_objtrain.py`; read it first). The",
        "tokenizer ends every input with `</s>`, as the model was trained; decoding starts from `<pad>`.",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        f'model = AutoModelForSeq2SeqLM.from_pretrained("{name}", trust_remote_code=True)',
        f'tok = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)',
        'ids = tok("for i in <extra_id_0>(n):", return_tensors="pt")["input_ids"]',
        "print(tok.decode(model.generate(ids, max_new_tokens=16)[0]))",
        "```",
    ]


def model_card(
    ckpt: Checkpoint, checkpoint: Path, name: str, architecture: str, dtype: str, check: list[str]
) -> str:
    """The README.md text for an export named `name` (its directory's name) of the checkpoint at
    `checkpoint`; `check` are the load-back check's lines."""
    info, cfg = ckpt.training, ckpt.config
    state = _read_json(Path(checkpoint) / "state.json")
    objective = str(info.get("objective") or "unknown")
    settings = info.get("objective_config") or {}
    train, valid = last_metrics(run_directory(checkpoint), info.get("step"))
    tags = ["objtrain", objective, cfg.kind]
    lines = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {PIPELINES[cfg.kind]}",
        "tags:",
        *[f"- {tag}" for tag in tags],
        "license: unknown  # objtrain cannot know it: the license of the weights and of their data",
        "datasets: []  # objtrain cannot know it: the Hub names of the datasets tokenized, if any",
        "---",
        "",
        f"# {name}",
        "",
        "Before publishing, fill in `license` and `datasets` in the metadata above: objtrain cannot know "
        "them.",
        "",
        f"A {cfg.n_layer}-layer {KINDS[cfg.kind]} "
        f"language model pre-trained by objtrain with the `{objective}` objective, "
        f"exported as `{architecture}`.",
        "",
        "## Objective",
        "",
        f"- `{objective}`" + (f": `{json.dumps(settings, sort_keys=True)}`" if settings else ""),
        "",
        "## Model",
        "",
        f"- width {cfg.d_model}, {cfg.n_layer} layer{'s' if cfg.n_layer != 1 else ''}"
        + (f" (decoder {cfg.decoder_layers})" if cfg.kind == "encdec" else "")
        + f", {cfg.n_head} heads ({cfg.kv_heads} key/value), feed-forward {cfg.ffn_dim}",
        f"- vocabulary {cfg.vocab_size}, trained on rows of {info.get('seq_len', '?')} tokens (rotary "
        "positions: longer inputs run, the tokenizer sets no `model_max_length`)",
        f"- RoPE base {cfg.rope_base:g}, output layer {'tied to' if cfg.tie_embeddings else 'apart from'} "
        "the embedding",
        "",
        "## Data",
        "",
        *_data_lines(state),
        "",
        "## Budget",
        "",
        *_budget_lines(ckpt, state, dtype),
        "",
        "## Metrics",
        "",
    ]
    if train or valid:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| train {k} | {v:.4g} |" for k, v in _ordered(train)]
        lines += [f"| {k} | {v:.4g} |" for k, v in _ordered(valid)]
        lines.append("")
        lines.append(
            f"Last records at or before step {info.get('step', '?')} in the run's `metrics.jsonl` "
            "(validation on the store's held-out split)."
        )
    else:
        lines.append("The run's `metrics.jsonl` was not found beside the checkpoint.")
    lines += ["", "## How to load it", "", *_load_snippet(cfg.kind, name), "", "## Export check", ""]
    lines += [f"- {line}" for line in check]
    return "\n".join(lines) + "\n"
