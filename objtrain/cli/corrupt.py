"""`objtrain corrupt`: show what an objective does to real rows (library: objtrain.views.corrupt)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from objtrain import IGNORE
from objtrain.batch import MODEL_KINDS, Batch
from objtrain.cli.common import check_format, make_console, progress_bar
from objtrain.config import parse_overrides
from objtrain.errors import UserError
from objtrain.objectives.registry import build_objective, objective_class
from objtrain.views import corrupt as shown

STYLES = {
    shown.KEPT: "",
    shown.MASKED: "bold white on red",
    shown.REPLACED: "bold black on yellow",
    shown.DELETED: "red strike",
    shown.INSERTED: "green",
    shown.SENTINEL: "bold magenta",
    shown.SPECIAL: "cyan",
}
TARGET_STYLE = "bold green"
DOC_STYLES = ("blue", "green", "magenta", "yellow", "cyan", "red")
DEFAULT_SEQ_LEN = 128
FULL_GRID = 64  # rows up to this many positions get the full attention grid
SUMMARY_CELLS = 48


def run(
    args: list[str] = typer.Argument(
        None,
        metavar="SOURCE KEY=VALUE",
        help="A token store, packed store or text file, then objective overrides such as noise_density=0.3.",
        show_default=False,
    ),
    objective: str = typer.Option(None, "--objective", "-O", help="Objective name (see --list)."),
    text: str = typer.Option(
        None, "--text", help="Corrupt this text instead of a SOURCE (needs --tokenizer)."
    ),
    tokenizer: Path = typer.Option(
        None, "--tokenizer", help="Token store (or .model file) whose tokenizer encodes text."
    ),
    n: int = typer.Option(None, "--n", help="Rows to corrupt (default: 2, or 256 with --stats)."),
    seed: int = typer.Option(0, "--seed", help="Corruption seed (row i is always corrupted the same way)."),
    seq_len: int = typer.Option(
        None, "--seq-len", help="Model length (default: what a packed store's rows hold, else 128)."
    ),
    model_kind: str = typer.Option(
        None, "--model-kind", help="decoder | encoder | encdec (default: the objective's first)."
    ),
    fmt: str = typer.Option(
        "text", "--format", help="text (coloured), json (one document) or jsonl (one object per row)."
    ),
    show_attention: bool = typer.Option(False, "--show-attention", help="Draw each row's attention pattern."),
    stats: bool = typer.Option(
        False, "--stats", help="Realised rates over all rows beside the configured ones."
    ),
    list_: bool = typer.Option(False, "--list", help="List every objective and exit."),
) -> None:
    """Show the original, the model input and the target of a few rows, aligned and coloured.

    Example: objtrain corrupt runs/demo/packed --objective span noise_density=0.3 --n 2
    """
    console = make_console(highlight=False)
    if list_:
        print_list(console)
        return
    fmt = check_format(fmt)
    if objective is None:
        raise UserError("--objective is required (see `objtrain corrupt --list`)")
    if model_kind is not None and model_kind not in MODEL_KINDS:
        raise UserError(f"--model-kind must be one of {', '.join(MODEL_KINDS)}, got {model_kind!r}")
    source, overrides = split_args(args or [])
    objective_class(objective)  # unknown names fail before any source is read
    n_rows = n if n is not None else (256 if stats else 2)

    probe_tokenizer, probe_specials = _tokenizer_for(source, tokenizer, text)
    obj = build_objective(
        objective,
        probe_specials,
        tokenizer=probe_tokenizer,
        model_kind=model_kind,  # type: ignore[arg-type]
        overrides=parse_overrides(overrides),
    )
    packed_len = shown.packed_row_length(source)
    if seq_len is None:
        seq_len = shown.model_length_for(obj, packed_len) if packed_len else DEFAULT_SEQ_LEN
    if seq_len < 1:
        raise UserError(f"--seq-len must be positive, got {seq_len}")
    raw = shown.read_rows(source, obj, seq_len, n_rows, seed, tokenizer_store=tokenizer, text=text)
    if raw.source == "packed" and source is not None:  # after every check, so a refusal stays one line
        packed_note(source)
    if raw.row_sources is not None:
        mixture_note(raw)

    aggregate = shown.Aggregate()
    records: list[dict[str, Any]] = []  # --format json: one document at the end
    # Many rows (--stats --n 5000) take seconds: show how far it is (on a terminal only).
    bar = progress_bar(transient=True)
    task = bar.add_task("corrupting rows", total=int(raw.tokens.size(0)))
    with bar:
        for batch, start in shown.corrupt_rows(obj, raw, seed):
            n_batch = batch.input_ids.size(0)
            n_raw = min(raw.tokens.size(0) - start, 64)  # corrupt_rows' batch size
            per_row = max(n_batch // max(n_raw, 1), 1)  # contrastive: two views per raw row
            views = [shown.align_row(batch, b, raw, start + b // per_row) for b in range(n_batch)]
            bar.advance(task, n_raw)
            if stats:
                aggregate.add(batch, views)
                continue
            for b, view in enumerate(views):
                if fmt == "text":
                    print_row(console, view, raw)
                    if show_attention:
                        print_attention(console, batch, b)
                    continue
                record = shown.row_record(obj, view, batch, b, raw)
                if fmt == "jsonl":
                    sys.stdout.write(json.dumps(record) + "\n")
                else:
                    records.append(record)
    if stats:
        rows = aggregate.table(obj)
        if fmt == "text":
            print_stats(console, obj.name, obj.model_kind, aggregate.rows, rows)
        elif fmt == "json":  # one object of realised statistics, snake_case keys, for pipelines
            sys.stdout.write(json.dumps(shown.summary(aggregate, obj), indent=2) + "\n")
        else:
            record = {
                "objective": obj.name,
                "model_kind": obj.model_kind,
                "rows": aggregate.rows,
                "stats": {r.name: {"realised": r.realised, "configured": r.configured} for r in rows},
            }
            sys.stdout.write(json.dumps(record, indent=2 if fmt == "json" else None) + "\n")
    elif fmt == "json":
        sys.stdout.write(json.dumps(records, indent=2) + "\n")


def split_args(args: list[str]) -> tuple[Path | None, list[str]]:
    """The SOURCE (the one argument that is not key=value, or an existing path) and the overrides."""
    source: Path | None = None
    overrides = []
    for arg in args:
        if "=" in arg and not Path(arg).exists():
            overrides.append(arg)
        elif source is None:
            source = Path(arg)
        else:
            raise UserError(f"more than one SOURCE given ({source} and {arg}); overrides look like key=value")
    return source, overrides


def packed_note(source: Path) -> None:
    """One line on stderr: the rows shown are the packed rows, not the rows training cuts from them."""
    from objtrain.data.store import PackedStore

    origin = PackedStore.open(source).meta.get("token_store", {}).get("path")
    store = "the token store it was packed from" + (f" ({origin})" if origin else "")
    make_console(stderr=True, highlight=False).print(
        f"note: a packed store's rows are shown as packed; training streams its documents so rows fill "
        f"--seq-len: give {store} to see rows cut that way",
        markup=False,
    )


def mixture_note(raw: shown.RawRows) -> None:
    """One line on stderr: the mixture's sources, their weights and their share of the rows shown."""
    mixed = raw.stream
    weights = getattr(mixed, "weights", None)
    counts = np.bincount(raw.row_sources, minlength=len(raw.source_names))  # type: ignore[arg-type]
    parts = [
        f"{name} {counts[k]} row{'s' if counts[k] != 1 else ''}"
        + (f" (weight {weights[k]:.1%})" if weights is not None else "")
        for k, name in enumerate(raw.source_names)
    ]
    make_console(stderr=True, highlight=False).print(
        f"note: a mixture: each row's source is drawn as training draws it under --seed, its text read from "
        f"that store's unshuffled documents; {', '.join(parts)}",
        markup=False,
    )


def _tokenizer_for(source: Path | None, tokenizer: Path | None, text: str | None) -> tuple[Any, Any]:
    """Tokenizer and specials to configure the objective with (some need word or sentence boundaries)."""
    if text is None and shown.mixture_file(source):
        mixture = shown.open_mixture(source)  # type: ignore[arg-type]
        return mixture.tokenizer, mixture.specials
    if text is not None or (source is not None and source.is_file()):
        if tokenizer is None:
            raise UserError("text needs a tokenizer: pass --tokenizer TOKEN_STORE (or a .model file)")
        tok = shown.load_text_tokenizer(tokenizer)
        return tok, tok.specials
    if source is None:
        raise UserError("give a SOURCE (token store, packed store or text file) or --text")
    if not source.exists():
        raise UserError(f"source not found: {source}")
    if shown.packed_row_length(source) is not None:
        from objtrain.data.store import PackedStore

        store = PackedStore.open(source)
    else:
        store = shown.open_token_store(source)
    return store.tokenizer, store.specials


# ---------------------------------------------------------------------------------------------------
# Rendering


def print_list(console: Console) -> None:
    table = Table(title="objectives", title_justify="left")
    for col in ("name", "model kinds", "attention", "key parameters (configs/objectives/<name>.yaml)"):
        table.add_column(col)
    infos = shown.list_objectives()
    for info in infos:
        if not info.available:
            table.add_row(info.name, "[dim]unavailable[/]", "", f"[dim]{info.reason}[/]")
            continue
        table.add_row(
            info.name,
            ", ".join(info.model_kinds),
            info.attention,
            shown.describe_defaults(info.defaults) or f"[dim]{info.reason}[/]",
        )
    console.print(table)
    missing = [info.name for info in infos if not info.available]
    if missing:
        console.print(f"[dim]unavailable (module does not import): {', '.join(missing)}[/]")


def _legend() -> Text:
    legend = Text("legend: ")
    for kind, style in STYLES.items():
        if style:
            legend.append(kind, style=style)
            legend.append(" ")
    legend.append("target", style=TARGET_STYLE)
    return legend


def print_row(console: Console, view: shown.RowView, raw: shown.RawRows) -> None:
    specials, tok = raw.specials, raw.tokenizer
    head = (
        f"[bold]row {view.row_index}[/]  original {len(view.original)} · input {len(view.input)} · "
        f"targets {len(view.targets)}"
    )
    source = raw.source_of(view.row_index)
    if source is not None:  # a mixture: the store this row was drawn from
        head += f" · source {escape(source)}"
    if view.seq_labels is not None:
        head += f" · pair labels {' '.join(map(str, view.seq_labels)) or 'none'}"
    if console.is_terminal:
        console.rule(head, align="left")
    else:  # piped: a plain heading, not a rule as wide as the unwrapped console
        console.print(f"── {head}")
    label_w = 9
    width = max(console.width - label_w, 20)
    lines: list[tuple[Text, Text, Text]] = []
    cur = (Text(), Text(), Text())
    used = 0
    for cell in view.cells:
        o = shown.piece_text(cell.original, specials, tok) if cell.original is not None else ""
        i = shown.piece_text(cell.input, specials, tok) if cell.input is not None else ""
        has_target = cell.target is not None and cell.target != IGNORE
        t = shown.piece_text(cell.target, specials, tok) if has_target else ""  # type: ignore[arg-type]
        w = max(len(o), len(i), len(t), 1) + 1
        if used + w > width and used:
            lines.append(cur)
            cur, used = (Text(), Text(), Text()), 0
        cur[0].append(o.ljust(w), style=STYLES.get(cell.original_kind, ""))
        cur[1].append(i.ljust(w), style=STYLES.get(cell.input_kind, ""))
        cur[2].append(
            t.ljust(w) if has_target else ("·" if cell.input is not None else "").ljust(w),
            style=TARGET_STYLE if has_target else "dim",
        )
        used += w
    if used:
        lines.append(cur)
    if not view.aligned:
        original = Text("original ", style="dim")
        original.append(" ".join(shown.piece_text(t, specials, tok) for t in view.original))
        console.print(original)
        console.print(Text("(rearranged: input and target below)", style="dim"))
    for o_line, i_line, t_line in lines:
        if view.aligned:
            console.print(Text("original ", style="dim") + o_line, soft_wrap=True)
        console.print(Text("input    ", style="dim") + i_line, soft_wrap=True)
        if not view.encdec:
            console.print(Text("target   ", style="dim") + t_line, soft_wrap=True)
    if view.encdec:
        target = Text("target   ", style="dim")
        for token in view.targets:
            kind = shown.token_kind(token, specials)
            target.append(
                shown.piece_text(token, specials, tok) + " ", style=STYLES.get(kind) or TARGET_STYLE
            )
        console.print(target)
    console.print(_legend(), style="dim")


def print_attention(console: Console, batch: Batch, b: int) -> None:
    """The row's self-attention as a grid: full when short, else per-document blocks and a coarse grid."""
    mask = shown.attention_mask(batch)[b]
    docs = batch.document_ids[b]
    T = mask.size(0)
    title = f"attention ({batch.attention}), {T} positions: row = query, column = key"
    console.print(Text(title, style="bold"))
    summary = shown.attention_summary(batch, b)
    table = Table(show_edge=False, box=None)
    for col in ("document", "positions", "length", "pattern"):
        table.add_column(col)
    for entry in summary:
        pattern = entry["pattern"]
        if "prefix_length" in entry:
            pattern += f" (bidirectional prefix {entry['prefix_length']})"
        name = "pad" if entry["document"] < 0 else str(entry["document"])
        table.add_row(name, f"{entry['start']}..{entry['end'] - 1}", str(entry["length"]), pattern)
    console.print(table)
    if T <= FULL_GRID:
        for i in range(T):
            line = Text(f"{i:>4} ")
            d = int(docs[i])
            style = "dim" if d < 0 else DOC_STYLES[d % len(DOC_STYLES)]
            for j in range(T):
                line.append("█" if mask[i, j] else "·", style=style if mask[i, j] else "dim")
            console.print(line, soft_wrap=True)
    else:
        shades = " ░▒▓█"
        grid = shown.downsample_mask(mask, SUMMARY_CELLS)
        c = grid.size(0)
        console.print(Text(f"downsampled to {c}x{c} cells (shade = share of allowed pairs)", style="dim"))
        for i in range(c):
            line = Text("     ")
            for j in range(c):
                v = float(grid[i, j])
                line.append(shades[0 if v == 0 else min(4, 1 + int(v * 3.999))])
            console.print(line, soft_wrap=True)
    if batch.is_encdec:
        dec = shown.cross_attention_mask(batch)[b]
        console.print(
            Text(
                f"decoder: causal inside its documents; cross-attention to {int(dec.any(0).sum())} of "
                f"{T} encoder positions",
                style="dim",
            )
        )


def print_stats(console: Console, name: str, kind: str, rows: int, stats: list[shown.StatRow]) -> None:
    table = Table(title=f"{name} ({kind}): realised over {rows} rows", title_justify="left")
    table.add_column("statistic")
    table.add_column("realised", justify="right")
    table.add_column("configured", justify="right")
    for row in stats:
        configured = "" if row.configured is None else f"{row.configured:.4g}"
        table.add_row(row.name, f"{row.realised:.4g}", configured)
    console.print(table)
