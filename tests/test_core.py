"""The shared core: special-token layout, tokenizer round trip, counter-based RNG, config strictness."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from objtrain.batch import positions_of
from objtrain.config import from_dict, load_yaml, parse_overrides
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.rng import RowRandom
from objtrain.specials import Specials


def test_fixed_special_ids(tokenizer: Tokenizer, specials: Specials) -> None:
    assert (specials.pad, specials.unk, specials.bos, specials.eos, specials.mask) == (0, 1, 2, 3, 4)
    assert tokenizer.piece(specials.mask) == "<mask>"
    assert tokenizer.piece(specials.fim_middle) == "<fim_middle>"
    assert tokenizer.piece(specials.sentinel(0)) == "<extra_id_0>"
    assert tokenizer.piece(specials.sentinel(5)) == "<extra_id_5>"
    assert specials.sentinel(5) == specials.sentinel(0) - 5  # counts down, as T5
    assert tokenizer.piece(specials.first_ordinary - 1) == "<extra_id_0>"


def test_round_trip_keeps_text_exactly(tokenizer: Tokenizer) -> None:
    text = "def f(x):\n\tif x:\n\t\treturn  'ünï 日本 🎉'  \n\n\n\r\n   end\t"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_control_tokens_are_never_matched_in_text(tokenizer: Tokenizer, specials: Specials) -> None:
    ids = tokenizer.encode("x = '<mask> <fim_middle> <extra_id_0> [NLU] </s>'")
    assert not any(specials.is_special(torch.tensor(ids)).tolist())


def test_rng_depends_only_on_seed_and_row() -> None:
    full = RowRandom(7, torch.arange(10)).uniform(16, "s")
    part = RowRandom(7, torch.tensor([3, 8])).uniform(16, "s")
    assert torch.equal(full[[3, 8]], part)
    assert not torch.equal(RowRandom(8, torch.arange(10)).uniform(16, "s"), full)
    assert not torch.equal(RowRandom(7, torch.arange(10)).uniform(16, "t"), full)
    u = RowRandom(0, torch.arange(200)).uniform(500, "s")
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01


def test_positions_restart_per_document() -> None:
    docs = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1]])
    assert positions_of(docs).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]


@dataclasses.dataclass
class _Cfg:
    rate: float = 0.5
    n: int = 3
    name: str = "x"


def test_config_is_strict() -> None:
    assert from_dict(_Cfg, {"rate": 1, "n": 4}) == _Cfg(rate=1.0, n=4)
    with pytest.raises(UserError, match="unknown key 'nope'"):
        from_dict(_Cfg, {"nope": 1})
    with pytest.raises(UserError, match="must be an integer"):
        from_dict(_Cfg, {"n": "three"})
    assert parse_overrides(["a.b=1", "c=[1, 2]", "d=x"]) == {"a": {"b": 1}, "c": [1, 2], "d": "x"}
    with pytest.raises(UserError):
        parse_overrides(["novalue"])


@pytest.mark.parametrize("table", [[1, 2], {"eos": 3}, {"n_sentinels": "8"}, {"n_sentinels": -1}])
def test_a_damaged_special_token_table_is_a_user_error(table: object) -> None:
    with pytest.raises(UserError, match=r"special-token table holds .*not a count of sentinels"):
        Specials.from_dict(table)  # type: ignore[arg-type]


def test_an_empty_or_foreign_tokenizer_file_names_itself(
    tmp_path: Path, tokenizer: Tokenizer, specials: Specials, capfd: pytest.CaptureFixture
) -> None:
    (tmp_path / "empty.model").write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.model is empty, not a sentencepiece model"):
        Tokenizer.from_file(tmp_path / "empty.model", specials)
    assert capfd.readouterr().err == ""  # nothing from sentencepiece's own logging
    (tmp_path / "other.model").write_bytes(tokenizer.model_proto)
    layout = Specials(n_sentinels=specials.n_sentinels + 1)  # a table this model was not made with
    with pytest.raises(UserError, match=r"other\.model: tokenizer id"):
        Tokenizer.from_file(tmp_path / "other.model", layout)


def test_a_config_path_that_is_a_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").mkdir()
    with pytest.raises(UserError, match=r"run\.yaml is a directory, not a YAML file"):
        load_yaml(tmp_path / "run.yaml")


def test_batches_go_to_a_gpu_through_pinned_memory() -> None:
    """Non-blocking copies to CUDA are pinned first (from pageable memory CUDA copies synchronously, so the
    step would wait for its input); CPU targets and blocking copies are not pinned (pinning needs CUDA)."""
    import torch

    from objtrain.batch import Batch, pins_for

    assert pins_for(torch.device("cuda"), True) and pins_for(torch.device("cuda", 1), True)
    assert not pins_for(torch.device("cuda"), False) and not pins_for(torch.device("cpu"), True)
    ids = torch.arange(12).view(2, 6)
    batch = Batch(ids, ids.clone(), ids.clone(), torch.zeros_like(ids), "causal")
    moved = batch.to("cpu", non_blocking=True)
    pairs = zip(batch.tensors().values(), moved.tensors().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    if torch.cuda.is_available():  # the copy itself, where a GPU is present
        on_gpu = batch.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert on_gpu.input_ids.is_cuda and torch.equal(on_gpu.input_ids.cpu(), ids)


def test_a_key_given_twice_in_a_yaml_is_refused(tmp_path: Path) -> None:
    from objtrain.config import load_yaml

    path = tmp_path / "run.yaml"
    path.write_text("batch:\n  seq_len: 32\nbatch:\n  batch_size: 4\n")
    with pytest.raises(UserError, match="'batch' is given twice"):
        load_yaml(path)
    path.write_text("batch:\n  seq_len: 32\n  seq_len: 64\n")
    with pytest.raises(UserError, match="'seq_len' is given twice"):
        load_yaml(path)
    path.write_text("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n")  # merge keys still work
    assert load_yaml(path) == {"a": {"b": 1}, "c": {"b": 1, "d": 2}}
