"""Infilling on held-out code (Bavarian et al. 2022, "Efficient Training of Language Models to Fill in the
Middle"; Fried et al. 2022, InCoder).

Tasks: Python functions found with `ast` in held-out documents; one line (a whole body line, its newline
included, as InCoder's single-line tasks) or one random character span of the body is cut out. Or tasks
read from a HumanEval-Infilling JSONL (`prompt` = prefix, `suffix`, `canonical_solution` = middle).

Each model infills with its own mode:
- `fim-psm` / `fim-spm`: a FIM-trained decoder, prompt `<PRE> prefix <SUF> suffix <MID>` (or SPM), greedy
  until EOT (EOS here) or `<fim_pad>`;
- `sentinel`: span models; the input is `prefix <extra_id_0> suffix </s>` (behind the mode token for UL2)
  and the fill is what the model writes after `<extra_id_0>`, up to the next sentinel or EOS. A decoder-only
  span model reads that input as its bidirectional prefix, then continues from `<extra_id_0>`;
- `left-to-right`: any other decoder continues the prefix alone, cut after its first newline; line tasks
  only (the baseline the FIM paper compares against).

Metrics: exact match (strict, and after stripping trailing whitespace per line), the share of filled
functions that still parse with `ast` (prefix + middle + suffix), and the share of fills that ended with
the model's own stop token.
"""

from __future__ import annotations

import ast
import gzip
import json
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.models import generate as gen
from objtrain.objectives.base import Objective
from objtrain.objectives.registry import recorded_class
from objtrain.specials import Specials

TaskKind = Literal["line", "lines", "span"]


@dataclass
class InfillTask:
    task_id: str
    prefix: str
    middle: str
    suffix: str
    kind: str = "line"


@dataclass
class InfillResult:
    task: InfillTask
    output: str
    stopped: bool  # ended on the model's own stop token, not the token limit

    @property
    def exact(self) -> bool:
        return self.output == self.task.middle

    @property
    def exact_norm(self) -> bool:
        return normalise(self.output) == normalise(self.task.middle)

    @property
    def parses(self) -> bool:
        return parses(self.task.prefix + self.output + self.task.suffix)


def normalise(code: str) -> str:
    """Trailing whitespace stripped per line and trailing newlines dropped (normalised exact match)."""
    return "\n".join(line.rstrip() for line in code.split("\n")).rstrip("\n")


def parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def functions(text: str, max_lines: int = 40, max_chars: int = 2000) -> list[str]:
    """Source of every function in `text` (dedented, decorators left out) that parses on its own and has
    at least one body line besides its signature."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
            continue
        n = node.end_lineno - node.lineno + 1
        if not 3 <= n <= max_lines:
            continue
        source = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
        if not source.endswith("\n"):
            source += "\n"
        if len(source) <= max_chars and parses(source):
            out.append(source)
    return out


def cut(source: str, kind: TaskKind, rng: np.random.Generator, task_id: str) -> InfillTask | None:
    """Cut one body line, a block of 2..6 whole body lines (InCoder's multi-line tasks), or one random
    character span (1..64 characters) out of a function."""
    tree = ast.parse(source)
    node = tree.body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    lines = source.splitlines(keepends=True)
    first_body = node.body[0].lineno - 1  # 0-based line index of the first body statement
    if kind == "line":
        candidates = [i for i in range(first_body, len(lines)) if lines[i].strip()]
        if not candidates:
            return None
        i = int(candidates[int(rng.integers(len(candidates)))])
        return InfillTask(task_id, "".join(lines[:i]), lines[i], "".join(lines[i + 1 :]), "line")
    if kind == "lines":
        body_lines = len(lines) - first_body
        if body_lines < 2:
            return None
        n = int(rng.integers(2, min(6, body_lines) + 1))
        starts = [i for i in range(first_body, len(lines) - n + 1) if lines[i].strip()]
        if not starts:
            return None
        i = int(starts[int(rng.integers(len(starts)))])
        return InfillTask(
            task_id, "".join(lines[:i]), "".join(lines[i : i + n]), "".join(lines[i + n :]), "lines"
        )
    start = sum(len(line) for line in lines[:first_body])
    body = len(source) - start
    if body < 2:
        return None
    length = int(rng.integers(1, min(64, body - 1) + 1))
    lo = start + int(rng.integers(body - length + 1))
    return InfillTask(task_id, source[:lo], source[lo : lo + length], source[lo + length :], "span")


def code_tasks(
    texts: Iterable[str], n: int, kinds: Sequence[TaskKind], seed: int, fits: Any = None
) -> list[InfillTask]:
    """Up to `n` tasks from the functions of `texts`, sampled under `seed`, kinds taken in turn.
    `fits(source) -> bool` can refuse functions too long for the model's context."""
    sources = [f for text in texts for f in functions(text)]
    if fits is not None:
        sources = [s for s in sources if fits(s)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(sources))
    tasks: list[InfillTask] = []
    for j in order:
        if len(tasks) >= n:
            break
        kind = kinds[len(tasks) % len(kinds)]
        task = cut(sources[int(j)], kind, rng, f"held-out/{int(j)}/{kind}")
        if task is not None:
            tasks.append(task)
    return tasks


def read_infill_file(path: Path) -> list[InfillTask]:
    """HumanEval-Infilling JSONL (optionally gzipped): one task per line with `prompt`, `suffix` and
    `canonical_solution`; bad input is one clear line."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--infill file {path} is a directory, not a file")
    if not path.is_file():
        raise UserError(f"--infill file not found: {path}")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise UserError(f"{path} is not a readable gzip file ({exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path} is not UTF-8 (byte {exc.start}): HumanEval-Infilling files are UTF-8"
        ) from None
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number}: not a JSON object")
        missing = [
            k for k in ("prompt", "suffix", "canonical_solution") if not isinstance(record.get(k), str)
        ]
        if missing:
            raise UserError(
                f"{path}:{number}: no {', '.join(repr(m) for m in missing)} field: a HumanEval-Infilling "
                "task has prompt (prefix), suffix and canonical_solution (middle)"
            )
        tasks.append(
            InfillTask(
                str(record.get("task_id", f"{path.name}/{number}")),
                record["prompt"],
                record["canonical_solution"],
                record["suffix"],
                "file",
            )
        )
    if not tasks:
        raise UserError(f"{path} holds no infilling tasks")
    return tasks


def infill_mode(kind: str, training: dict[str, Any]) -> str:
    """How this model infills: fim-psm, fim-spm, sentinel, left-to-right or none (the recorded objective's
    `Objective.infill_form`; an encoder-decoder whose record names no objective is a span model)."""
    if kind == "encdec" and training.get("objective") is None:
        return "sentinel"
    return (recorded_class(training) or Objective).infill_form(kind, training)


def span_lead(training: dict[str, Any], specials: Specials) -> list[int]:
    """The mode token a model reads first in a span layout (UL2's [NLU]; `Objective.mode_token`)."""
    cls = recorded_class(training)
    settings = training.get("objective_config")
    name = cls.mode_token(settings if isinstance(settings, dict) else {}, "span") if cls is not None else None
    return [int(getattr(specials, name))] if name else []


@torch.no_grad()
def _greedy_prefix(
    model: nn.Module, prompt: list[int], n_prefix: int, max_new: int, stops: tuple[int, ...]
) -> tuple[list[int], bool]:
    """Greedy continuation with the first `n_prefix` prompt tokens as a bidirectional prefix (prefix-LM
    attention; no KV cache: the prefix changes what every later position sees)."""
    device = model.embed.weight.device  # type: ignore[union-attr]
    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_new):
        x = torch.tensor([ids], device=device)
        T = x.size(1)
        prefix = torch.zeros_like(x, dtype=torch.bool)
        prefix[:, :n_prefix] = True
        batch = Batch(
            x, x, torch.arange(T, device=device)[None], torch.zeros_like(x), "prefix", prefix_mask=prefix
        )
        token = int(model(batch).logits[0, -1].argmax())
        if token in stops:
            return out, True
        out.append(token)
        ids.append(token)
    return out, False


def _collect(stream: Iterable[int], max_new: int) -> tuple[list[int], bool]:
    out = list(stream)
    return out, len(out) < max_new


def infill_one(
    model: nn.Module,
    mode: str,
    tokenizer: Tokenizer,
    specials: Specials,
    training: dict[str, Any],
    task: InfillTask,
    max_new: int,
) -> InfillResult:
    s = specials
    lead = span_lead(training, s)
    if mode.startswith("fim-"):
        prompt = gen.fim_prompt(tokenizer, task.prefix, task.suffix, mode[4:])  # type: ignore[arg-type]
        ids, stopped = _collect(
            gen.generate_decoder(model, prompt, max_new, stop_ids=(s.eos, s.fim_pad)), max_new
        )  # type: ignore[arg-type]
        return InfillResult(task, tokenizer.decode(ids), stopped)
    if mode == "left-to-right":
        prompt = tokenizer.encode(task.prefix) or [s.eos]
        ids, stopped = _collect(gen.generate_decoder(model, prompt, max_new, stop_ids=(s.eos,)), max_new)  # type: ignore[arg-type]
        text = tokenizer.decode(ids)
        if "\n" in text:
            text, stopped = text[: text.index("\n") + 1], True
        return InfillResult(task, text, stopped)
    if mode == "sentinel":
        pre = tokenizer.encode(task.prefix) if task.prefix else []
        suf = tokenizer.encode(task.suffix) if task.suffix else []
        inputs = [*lead, *pre, s.sentinel(0), *suf, s.eos]
        stops = (s.eos, s.sentinel(1))
        if getattr(model.config, "kind", "") == "encdec":  # type: ignore[union-attr]
            start = int(training.get("decoder_start_id", s.pad))
            stream = gen.generate_encdec(model, inputs, max_new + 1, stop_ids=stops, start_id=start)  # type: ignore[arg-type]
            ids, stopped = _collect(stream, max_new + 1)
        else:
            ids, stopped = _greedy_prefix(model, [*inputs, s.sentinel(0)], len(inputs), max_new, stops)
            ids = [s.sentinel(0), *ids]
        fill = (
            gen.split_spans(ids, 1, s)[0]
            if ids and ids[0] == s.sentinel(0)
            else [i for i in ids if not s.is_special_id(i)]
        )
        return InfillResult(task, tokenizer.decode(fill), stopped)
    raise UserError(f"this model has no infilling mode ({mode})")


def infill_tasks(
    model: nn.Module,
    mode: str,
    tokenizer: Tokenizer,
    specials: Specials,
    training: dict[str, Any],
    tasks: Sequence[InfillTask],
    max_new_line: int = 64,
    max_new_span: int = 128,
) -> list[InfillResult]:
    return [
        infill_one(
            model, mode, tokenizer, specials, training, t, max_new_line if t.kind == "line" else max_new_span
        )
        for t in tasks
    ]


def infill_metrics(results: Sequence[InfillResult]) -> dict[str, float]:
    n = len(results)
    if not n:
        return {}
    return {
        "infill_exact_match": sum(r.exact for r in results) / n,
        "infill_exact_match_norm": sum(r.exact_norm for r in results) / n,
        "infill_parse_rate": sum(r.parses for r in results) / n,
        "infill_stop_rate": sum(r.stopped for r in results) / n,
        "infill_tasks": float(n),
    }
