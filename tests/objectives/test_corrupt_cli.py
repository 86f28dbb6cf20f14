"""`objtrain corrupt` and its library (objtrain.views.corrupt): sources, alignment, attention, stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.cli import app
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives import registry
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials
from objtrain.views import corrupt as shown

runner = CliRunner()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer, stdlib_texts: list[str]) -> dict:
    """A token store of a few stdlib modules (reusing the session tokenizer) and the files it came from."""
    root = tmp_path_factory.mktemp("corrupt")
    model = root / "tok.model"
    model.write_bytes(tokenizer.model_proto)
    files = []
    for i, text in enumerate(stdlib_texts[:4]):
        path = root / f"doc{i}.py"
        path.write_text(text[:6000], encoding="utf-8")
        files.append(path)
    store = root / "store"
    tokenize_corpus(files, store, TokenizeConfig(tokenizer=model, valid_fraction=0.0))
    return {"root": root, "model": model, "store": store, "files": files}


def invoke(*args: str, stdout_only: bool = False) -> str:
    result = runner.invoke(app, ["corrupt", *args], catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.stdout if stdout_only else result.output


def jsonl(*args: str) -> list[dict]:
    # stdout only: a packed store adds a note on stderr, which the runner's output interleaves
    out = invoke(*args, "--format", "jsonl", stdout_only=True)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# Library


def test_rows_from_documents_concatenates_with_eos_and_tracks_documents(specials: Specials) -> None:
    a, b, c, d, e, f = range(300, 306)
    tokens, docs = shown.rows_from_documents([[a, b], [c], [d, e, f]], 3, 10, specials)
    E = specials.eos
    assert tokens.tolist() == [[a, b, E], [c, E, d], [e, f, E]]
    assert docs.tolist() == [[0, 0, 0], [0, 0, 1], [0, 0, 0]]  # renumbered per row
    tokens, docs = shown.rows_from_documents([[a, b], [c]], 4, 10, specials)
    assert tokens.tolist() == [[a, b, E, c], [E, specials.pad, specials.pad, specials.pad]]
    assert docs.tolist() == [[0, 0, 0, 1], [0, -1, -1, -1]]
    tokens, _ = shown.rows_from_documents([[a]], 100, 10, specials)
    assert tokens.tolist() == [[a, E]]  # shorter than a row: one row as long as the source
    with pytest.raises(UserError):
        shown.rows_from_documents([[]][:0], 4, 2, specials)


def _batch(docs: list[int], attention: str, prefix: list[int] | None = None) -> Batch:
    d = torch.tensor([docs])
    return Batch(
        input_ids=torch.zeros_like(d),
        labels=torch.zeros_like(d),
        positions=torch.zeros_like(d),
        document_ids=d,
        attention=attention,  # type: ignore[arg-type]
        prefix_mask=None if prefix is None else torch.tensor([prefix], dtype=torch.bool),
    )


def test_attention_mask_golden_cases() -> None:
    """Hand-checked: two documents and padding, under each pattern."""
    causal = shown.attention_mask(_batch([0, 0, 1, 1, -1], "causal"))[0].int().tolist()
    assert causal == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]
    bidir = shown.attention_mask(_batch([0, 0, 1, 1, -1], "bidirectional"))[0].int().tolist()
    assert bidir == [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1],
    ]
    # document 0: prefix of 2 then 1 target; document 1: prefix of 1 then 1 target
    prefix = shown.attention_mask(_batch([0, 0, 0, 1, 1], "prefix", [1, 1, 0, 1, 0]))[0].int().tolist()
    assert prefix == [
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]


def test_downsampled_grid_is_the_share_of_allowed_pairs() -> None:
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    grid = shown.downsample_mask(causal, 4)  # blocks of 2, 3, 3, 2 positions
    assert torch.allclose(grid.diagonal(), torch.tensor([3 / 4, 6 / 9, 6 / 9, 3 / 4]))
    below = torch.ones(4, 4, dtype=torch.bool).tril(-1)
    assert (grid[below] == 1).all() and (grid[below.T] == 0).all()
    assert torch.equal(shown.downsample_mask(causal, 64), causal.float())  # small: unchanged


def test_model_builds_the_same_mask_as_inspect() -> None:
    attention = pytest.importorskip("objtrain.models.attention")
    for b in (
        _batch([0, 0, 1, 1, 1, -1, -1], "causal"),
        _batch([0, 0, 1, 1, 1, -1, -1], "bidirectional"),
        _batch([0, 0, 0, 1, 1, 1, -1], "prefix", [1, 0, 0, 1, 1, 0, 0]),
    ):
        model = attention.self_attention_mask(b.document_ids, b.attention, b.prefix_mask)[:, 0]
        assert torch.equal(model, shown.attention_mask(b))


def test_alignment_of_span_corruption_counts_what_the_objective_did(
    tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    """Every noise token shows as deleted from the original and every span as one sentinel in the input
    (difflib's alignment is heuristic: on very repetitive text it can pair tokens differently)."""
    objective = build_objective("span", tokenizer.specials, tokenizer=tokenizer)
    ids = tokenizer.encode(stdlib_texts[0])[:300]
    L = len(ids)
    raw = shown.RawRows(
        torch.tensor([ids]),
        torch.zeros(1, L, dtype=torch.long),
        torch.tensor([7]),
        tokenizer.specials,
        tokenizer,
        "test",
    )
    batch = objective(raw.tokens, raw.document_ids, raw.row_index, 0)
    view = shown.align_row(batch, 0, raw, 0)
    assert view.original == ids
    assert view.stats["deleted"] == batch.stats["noise_tokens"]
    assert view.stats["sentinel"] == batch.stats["spans"]
    kept = [c.original for c in view.cells if c.original is not None and c.original_kind == shown.KEPT]
    assert len(kept) == L - batch.stats["noise_tokens"]


def test_alignment_of_masked_lm_is_positional(tokenizer: Tokenizer) -> None:
    objective = build_objective("mlm", tokenizer.specials, tokenizer=tokenizer)
    ids = tokenizer.encode("for i in range(10):\n    print(i * i)\n" * 6)
    raw = shown.RawRows(
        torch.tensor([ids]),
        torch.zeros(1, len(ids), dtype=torch.long),
        torch.tensor([0]),
        tokenizer.specials,
        tokenizer,
        "test",
    )
    batch = objective(raw.tokens, raw.document_ids, raw.row_index, 3)
    view = shown.align_row(batch, 0, raw, 0)
    assert len(view.cells) == len(ids)
    masked = [i for i, c in enumerate(view.cells) if c.input_kind == shown.MASKED]
    assert masked == (batch.input_ids[0] == tokenizer.specials.mask).nonzero().squeeze(1).tolist()
    for c in view.cells:
        if c.input_kind in (shown.MASKED, shown.REPLACED):
            assert c.target == c.original  # the label is the original token
        if c.target is not None and c.target != IGNORE:
            assert c.original == c.target


# ---------------------------------------------------------------------------------------------------
# The command


def test_list_shows_every_objective_and_survives_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.OBJECTIVES, "ghost", "objtrain.objectives.ghost:Ghost")
    out = invoke("--list")
    for name in registry.OBJECTIVES:
        assert name in out
    ghost = next(line for line in out.splitlines() if "ghost" in line)
    assert "unavailable" in ghost
    infos = {i.name: i for i in shown.list_objectives()}
    assert not infos["ghost"].available
    assert infos["mlm"].available and infos["mlm"].model_kinds == ("encoder",)
    assert infos["mlm"].defaults["selection_rate"] == 0.15


def test_text_view_shows_original_input_and_target(corpus: dict) -> None:
    out = invoke(str(corpus["store"]), "--objective", "mlm", "--n", "2", "--seq-len", "48")
    assert out.count("row ") == 2
    assert "original" in out and "input" in out and "target" in out
    assert "<mask>" in out


def test_jsonl_rows_are_complete_reproducible_and_keyed_by_row(corpus: dict) -> None:
    rows = jsonl(str(corpus["store"]), "--objective", "span", "--n", "3", "--seq-len", "64", "--seed", "5")
    assert len(rows) == 3
    keys = {"objective", "original", "input", "target", "input_pieces", "target_pieces", "labels"}
    for row in rows:
        assert keys | {"attention", "stats"} <= row.keys()
        assert row["objective"] == "span"
        assert len(row["input_pieces"]) == len(row["input"])
        assert row["target"] == [t for t in row["labels"] if t != IGNORE]
    assert [r["row_index"] for r in rows] == [0, 1, 2]
    again = jsonl(str(corpus["store"]), "--objective", "span", "--n", "3", "--seq-len", "64", "--seed", "5")
    assert again == rows
    first = jsonl(str(corpus["store"]), "--objective", "span", "--n", "1", "--seq-len", "64", "--seed", "5")
    assert first[0] == rows[0]  # row 0 does not depend on how many rows were read
    other = jsonl(str(corpus["store"]), "--objective", "span", "--n", "3", "--seq-len", "64", "--seed", "6")
    assert [r["input"] for r in other] != [r["input"] for r in rows]
    assert [r["original"] for r in other] == [r["original"] for r in rows]


def test_sentence_pair_rows_show_one_label_per_pair(corpus: dict) -> None:
    """NSP rows pack several pairs: JSONL lists their labels in row order, one per [CLS], and the text view
    names them in the row's heading."""
    rows = jsonl(str(corpus["store"]), "--objective", "nsp", "--n", "3", "--seq-len", "128")
    for row in rows:
        cls = [i for i, piece in enumerate(row["input_pieces"]) if piece == "<cls>"]
        assert len(row["seq_labels"]) == len(cls) >= 2 and set(row["seq_labels"]) <= {0, 1}
        assert [row["attention"]["document_ids"][i] for i in cls] == list(range(len(cls)))
    out = invoke(str(corpus["store"]), "--objective", "sop", "--n", "1", "--seq-len", "128")
    assert "pair labels" in out


def test_overrides_reach_the_objective(corpus: dict) -> None:
    none = jsonl(str(corpus["store"]), "--objective", "mlm", "selection_rate=0.0", "--seq-len", "64")
    assert all(r["target"] == [] for r in none)
    dense = jsonl(str(corpus["store"]), "--objective", "mlm", "selection_rate=0.5", "--seq-len", "64")
    assert all(len(r["target"]) > 20 for r in dense)


def test_text_and_text_files_need_a_tokenizer(corpus: dict, tokenizer: Tokenizer) -> None:
    text = "def f(x):\n    return x + 1\n"
    (row,) = jsonl("--text", text, "--tokenizer", str(corpus["model"]), "--objective", "clm")
    assert row["original"] == [*tokenizer.encode(text), tokenizer.specials.eos]
    assert row["input"] == row["original"][:-1] and row["target"] == row["original"][1:]
    (via_store,) = jsonl("--text", text, "--tokenizer", str(corpus["store"]), "--objective", "clm")
    assert via_store == row
    rows = jsonl(str(corpus["files"][0]), "--tokenizer", str(corpus["model"]), "--objective", "clm")
    assert len(rows) == 2
    with pytest.raises(UserError, match="tokenizer"):
        invoke("--text", text, "--objective", "clm")


def test_show_attention_draws_full_grids_and_summaries(corpus: dict) -> None:
    out = invoke(
        str(corpus["store"]), "--objective", "clm", "--n", "1", "--seq-len", "12", "--show-attention"
    )
    cells = set("█·")
    grid = [w[1] for line in out.splitlines() if len(w := line.split()) == 2 and set(w[1]) <= cells]
    assert len(grid) == 12
    assert grid[0] == "█" + "·" * 11 and grid[11] == "█" * 12  # causal, one document
    out = invoke(
        str(corpus["store"]), "--objective", "mlm", "--n", "1", "--seq-len", "300", "--show-attention"
    )
    assert "downsampled" in out and "bidirectional" in out


def test_stats_compare_realised_with_configured_rates(corpus: dict) -> None:
    args = (str(corpus["store"]), "--objective", "mlm", "--stats", "--n", "32", "--seq-len", "128")
    (record,) = jsonl(*args)
    stats = record["stats"]
    rate = next(v for k, v in stats.items() if k.startswith("selection_rate"))
    assert rate["configured"] == 0.15
    assert abs(rate["realised"] - 0.15) < 0.01  # exact counts per row
    mask = next(v for k, v in stats.items() if k.startswith("mask_prob"))
    assert abs(mask["realised"] - 0.8) < 0.08
    assert "realised over 32 rows" in invoke(*args)
    (ul2,) = jsonl(str(corpus["store"]), "--objective", "ul2", "--stats", "--n", "16", "--seq-len", "64")
    shares = {k: v for k, v in ul2["stats"].items() if k.startswith("share/")}
    assert len(shares) == 7
    assert abs(sum(v["realised"] for v in shares.values()) - 1.0) < 1e-9
    assert abs(sum(v["configured"] for v in shares.values()) - 1.0) < 1e-9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing-dir", "--objective", "clm"], "not found"),
        (["STORE", "--objective", "nope"], "unknown objective"),
        (["STORE", "--objective", "clm", "--model-kind", "encoder"], "cannot train"),
        (["STORE", "--objective", "mlm", "nonsense=1"], "unknown key"),
        (["STORE", "--objective", "mlm", "--format", "xml"], "--format"),
        (["STORE", "--objective", "span", "--seq-len", "0"], "seq"),
        (["STORE"], "--objective"),
    ],
)
def test_bad_input_is_one_user_error(corpus: dict, args: list[str], message: str) -> None:
    args = [str(corpus["store"]) if a == "STORE" else a for a in args]
    with pytest.raises(UserError, match=message):
        invoke(*args)


def test_entry_point_exits_2_with_one_line(corpus: dict) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "objtrain", "corrupt", str(corpus["store"]), "--objective", "clm", "bogus=1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "bogus" in proc.stderr


def test_packed_store_rows_are_read_as_packed(corpus: dict, tmp_path: Path) -> None:
    pack = pytest.importorskip("objtrain.data.pack", reason="objtrain.data.pack is not available")
    packed = tmp_path / "packed"
    pack.pack_store(corpus["store"], packed, pack.PackConfig(seq_len=65))
    assert shown.packed_row_length(packed) == 65
    rows = jsonl(str(packed), "--objective", "clm", "--n", "2")  # --seq-len from the rows: 64
    assert len(rows) == 2
    assert all(len(r["input"]) <= 64 for r in rows)
    assert len(rows[0]["input"]) == 64  # the first best-fit row is full
    with pytest.raises(UserError, match="re-pack"):
        invoke(str(packed), "--objective", "clm", "--seq-len", "100")


def test_a_packed_store_notes_on_stderr_that_training_streams_its_documents(
    corpus: dict, tmp_path: Path, objtrain_cli
) -> None:
    pack = pytest.importorskip("objtrain.data.pack", reason="objtrain.data.pack is not available")
    packed = tmp_path / "packed"
    pack.pack_store(corpus["store"], packed, pack.PackConfig(seq_len=65))
    for fmt in ("text", "jsonl"):
        code, out, err = objtrain_cli("corrupt", packed, "--objective", "clm", "--n", "2", "--format", fmt)
        assert code == 0, err
        (note,) = err.strip().splitlines()
        assert note.startswith("note: ") and "shown as packed" in note and "fill --seq-len" in note
        assert str(corpus["store"]) in note  # the token store it was packed from, to see training's rows
        assert "note" not in out
    rows = [json.loads(line) for line in out.splitlines()]  # stdout stays pure JSON lines
    assert len(rows) == 2
    code, out, err = objtrain_cli(
        "corrupt", corpus["store"], "--objective", "clm", "--n", "2", "--seq-len", "64"
    )
    assert code == 0 and err == ""
