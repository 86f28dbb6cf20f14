"""Dataclass configs <-> YAML, with dotted `key=value` overrides.

Each component owns a small dataclass (an objective's `Config`, `ModelConfig`, ...); this module only
reads YAML into it, applies overrides such as `noise_density=0.3` or `train.lr=3e-4`, and checks keys and
types strictly: an unknown key or a wrong type is a `UserError`, never a silent default.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from objtrain.errors import UserError, did_you_mean

T = TypeVar("T")

CONFIGS_ENV = "OBJTRAIN_CONFIGS"


def config_dir() -> Path:
    """The YAML configs shipped inside the package (`objtrain/configs/`), or `$OBJTRAIN_CONFIGS` if set.

    The one place every reader (objective registry, model zoo, run and experiment files) finds them, so
    a wheel installed anywhere works as well as the source tree. `configs/` at the repository root is a
    symlink to the packaged directory, for users browsing the clone.
    """
    env = os.environ.get(CONFIGS_ENV)
    if env:
        return Path(env)
    packaged = importlib.resources.files("objtrain") / "configs"
    # A normal (directory) install gives a real path; a zipped package is not supported.
    return Path(str(packaged))


def packaged_config(path: Path | str, subdir: str) -> Path:
    """A user's config path, or else the shipped one of that name: `fim-tiny` or `configs/train/fim-tiny.yaml`
    find `<config_dir>/train/fim-tiny.yaml` from any directory. Returns `path` unchanged if neither exists,
    so the caller's "not found" names what the user typed."""
    path = Path(path)
    if path.is_file():
        return path
    name = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    shipped = config_dir() / subdir / name
    return shipped if shipped.is_file() else path


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, line: int) -> None:
        super().__init__(f"key {key!r} is given twice (again at line {line}): keep one")
        self.problem, self.problem_mark = str(self), None


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (PyYAML lets the last one win, silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; a missing file, bad YAML or a non-mapping is one clear error."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"config {path} is a directory, not a YAML file")
    if not path.is_file():
        raise UserError(f"config not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a YAML mapping, found {type(data).__name__}")
    return data


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["a.b=1", "c=[1, 2]"]` -> `{"a": {"b": 1}, "c": [1, 2]}`; values are parsed as YAML scalars."""
    nested: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UserError(f"override {pair!r} is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override {pair!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return nested


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; `update` wins."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass `cls` from `data`, recursing into nested dataclasses; strict on keys and types."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    if not isinstance(data, dict):
        raise UserError(f"{where or cls.__name__} must be a mapping, found {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(
            f"unknown key {unknown[0]!r} in {where or cls.__name__}{did_you_mean(unknown[0], fields)}"
            f" (known: {', '.join(sorted(fields))})"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(value, hints[name], f"{where}.{name}" if where else name)
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where or cls.__name__}: {exc}") from None
    return obj


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of dataclass `cls` by its dotted name (`optim.lr`, `seed`), nested dataclasses
    expanded, in field order."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            out += dotted_keys(hints[f.name], f"{name}.")
        else:
            out.append(name)
    return out


def key_hint(key: str, dotted: list[str], flags: dict[str, str] | None = None) -> str:
    """`"; did you mean optim.lr or --lr?"` for an override `key` that names a run setting the wrong way:
    a bare leaf (`lr`), a mistyped section (`optimizer.lr`) or a near miss of a dotted key (`optim.lrr`);
    `""` when nothing is close. `flags` maps dotted keys to the command-line flags that set them."""
    flags = flags or {}
    leaf = key.rsplit(".", 1)[-1].lower()
    same_leaf = [d for d in dotted if d.rsplit(".", 1)[-1].lower() == leaf]
    if "." in key and len(same_leaf) > 1:  # optimizer.lr: the section closest to the one typed
        same_leaf.sort(key=lambda d: -difflib.SequenceMatcher(None, key.lower(), d.lower()).ratio())
        same_leaf = same_leaf[:1]
    lowered = {d.lower(): d for d in dotted}
    leaves: dict[str, list[str]] = {}
    for d in dotted:
        leaves.setdefault(d.rsplit(".", 1)[-1].lower(), []).append(d)
    matches = (
        same_leaf
        or [lowered[m] for m in difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.75)]
        or [d for m in difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.8) for d in leaves[m]]
    )
    if not matches:
        return ""
    names: list[str] = []
    for match in matches[:3]:
        names.append(match)
        if match in flags:
            names.append(flags[match])
    return f"; did you mean {' or '.join(names)}?"


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        if isinstance(value, str):  # names match case-insensitively, with a hint for a near miss
            names = [a for a in args if isinstance(a, str)]
            folded = [a for a in names if a.lower() == value.lower()]
            if len(folded) == 1:
                return folded[0]
            hint = did_you_mean(value, names)
        else:
            hint = ""
        raise UserError(f"{where} must be one of {', '.join(map(repr, args))}, got {value!r}{hint}")
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)  # type: ignore[arg-type]
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where} must be a list, got {value!r}")
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a mapping, got {value!r}")
        val_hint = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, val_hint, f"{where}.{k}") for k, v in value.items()}
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise UserError(f"{where} must be a string, got {value!r}")
        return value
    return value
