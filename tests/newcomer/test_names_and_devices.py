"""Config directory, case-insensitive names with "did you mean", and `--device` resolution."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import pytest
import torch

import objtrain
from objtrain.config import config_dir, from_dict, packaged_config
from objtrain.devices import resolve_device
from objtrain.errors import UserError, did_you_mean, pick_name
from objtrain.models.zoo import model_config
from objtrain.objectives.registry import objective_class, objective_config


def test_configs_ship_inside_the_package() -> None:
    root = config_dir()
    assert root == Path(objtrain.__file__).parent / "configs"
    for sub in ("objectives", "models"):
        assert sorted(root.glob(f"{sub}/*.yaml")), f"no YAML in {root / sub}"
    # The top-level configs/ of a clone is the same directory, not a copy that can drift.
    top = Path(objtrain.__file__).parents[1] / "configs"
    if top.exists():
        assert top.resolve() == root.resolve()


def test_configs_env_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.yaml").write_text("decoder: {d_model: 64, n_layer: 1, n_head: 2}\n")
    monkeypatch.setenv("OBJTRAIN_CONFIGS", str(tmp_path))
    assert config_dir() == tmp_path
    assert model_config("decoder", "mine").d_model == 64
    with pytest.raises(UserError, match="unknown model size 'tiny'"):
        model_config("decoder", "tiny")


def test_packaged_config_finds_shipped_files_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # far from the clone: only the packaged copy can answer
    shipped = next(config_dir().glob("train/*.yaml"))
    assert packaged_config(shipped.stem, "train") == shipped
    assert packaged_config(f"configs/train/{shipped.name}", "train") == shipped
    assert packaged_config("no-such-run", "train") == Path("no-such-run")
    mine = tmp_path / f"{shipped.name}"
    mine.write_text("{}\n")
    assert packaged_config(mine, "train") == mine  # the user's own file wins


def test_names_match_case_insensitively() -> None:
    assert objective_class("SPAN") is objective_class("span")
    assert objective_config("Fim").__class__ is objective_config("fim").__class__
    assert model_config("DECODER", "Debug").kind == "decoder"
    assert pick_name("cpu", ["cpu", "cuda"], "device") == "cpu"


@pytest.mark.parametrize(
    ("call", "unknown", "suggested"),
    [
        (lambda: objective_class("fmi"), "objective 'fmi'", "fim"),
        (lambda: objective_class("spam"), "objective 'spam'", "span"),
        (lambda: model_config("decodr", "tiny"), "model kind 'decodr'", "decoder"),
        (lambda: model_config("decoder", "tinny"), "model size 'tinny'", "tiny"),
        (lambda: objective_config("mlm", {"mask_rate": 0.2}), "key 'mask_rate'", "mask_prob"),
    ],
)
def test_unknown_names_suggest_the_closest(call, unknown: str, suggested: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert f"unknown {unknown}" in message
    assert f"did you mean {suggested!r}?" in message
    assert "known:" in message and "\n" not in message


def test_no_suggestion_when_nothing_is_close() -> None:
    assert did_you_mean("zzzzzz", ["span", "fim"]) == ""
    with pytest.raises(UserError) as info:
        objective_class("zzzzzz")
    assert "did you mean" not in str(info.value)


@dataclasses.dataclass
class _Run:
    steps: int = 1
    order: Literal["psm", "spm"] = "psm"


def test_from_dict_hints_keys_and_choices() -> None:
    with pytest.raises(UserError, match=r"unknown key 'step' in run; did you mean 'steps'\?"):
        from_dict(_Run, {"step": 3}, where="run")
    with pytest.raises(UserError, match=r"did you mean 'spm'\?"):
        from_dict(_Run, {"order": "smp"}, where="run")
    assert from_dict(_Run, {"order": "SPM"}).order == "spm"


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("CPU") == torch.device("cpu")
    expected = (
        "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    )
    assert resolve_device("auto").type == expected
    with pytest.raises(UserError, match=r"unknown --device 'tpu'.*known: auto, cpu, cuda, mps"):
        resolve_device("tpu")
    with pytest.raises(UserError, match="did you mean 'cuda'"):
        resolve_device("cdua")
    with pytest.raises(UserError, match="only cuda takes an index"):
        resolve_device("cpu:0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^--device cuda: .*use --device cpu"):
        resolve_device("cuda")
    with pytest.raises(UserError, match="--device cuda"):
        resolve_device("cuda:1")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the refusal where MPS is absent")
def test_mps_unavailable_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^--device mps: .* not available"):
        resolve_device("mps")
