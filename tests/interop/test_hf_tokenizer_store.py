"""A store tokenized with a Hugging Face tokenizer.json (trained here with the `tokenizers` library, nothing
downloaded): objtrain's special tokens found or added and recorded, text round-trips exactly, and the store
goes through corrupt, train, eval and generate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from interop_helpers import byte_level_bpe

from objtrain.data.store import TokenStore
from objtrain.data.tokenize import TokenizeConfig, load_tokenizer, tokenize_corpus
from objtrain.specials import FIXED_PIECES, Specials

tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed: pip install 'objtrain[hf]'")

Cli = Callable[..., tuple[int, str, str]]
HARD = [
    "def f(x):\n\tif x:  # two  spaces\r\n        return 'é中文😀'\n",
    "  leading and trailing spaces  ",
    "a literal </s> and <|endoftext|> and <mask> and <extra_id_0> stay text \u2581 too",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str]) -> Path:
    root = tmp_path_factory.mktemp("hftok")
    (root / "corpus").mkdir()
    for i, text in enumerate([*stdlib_texts, *HARD]):
        (root / "corpus" / f"m{i}.txt").write_text(text, encoding="utf-8", newline="")
    byte_level_bpe(stdlib_texts, specials=("<|endoftext|>", "<pad>")).save(str(root / "tokenizer.json"))
    return root


@pytest.fixture(scope="module")
def store(corpus: Path) -> Path:
    config = TokenizeConfig(tokenizer=corpus / "tokenizer.json", doc_split="blank-line", n_sentinels=32)
    tokenize_corpus([corpus / "corpus"], corpus / "store", config)
    return corpus / "store"


def test_specials_are_found_where_the_tokenizer_has_them_and_added_after_it(store: Path) -> None:
    meta = json.loads((store / "meta.json").read_text())
    hf = tokenizers.Tokenizer.from_file(str(store / "tokenizer.json"))
    base = hf.get_vocab_size()
    table = meta["specials"]
    assert table["eos"] == hf.token_to_id("<|endoftext|>")  # a common spelling of </s>
    assert table["pad"] == hf.token_to_id("<pad>")
    added = [table[name] for name, _ in FIXED_PIECES if name not in ("eos", "pad")]
    assert added == list(range(base, base + len(added)))  # in the table's order, after the vocabulary
    assert table["first_sentinel"] == base + len(added) and table["n_sentinels"] == 32
    assert meta["vocab_size"] == base + len(added) + 32
    assert meta["tokenizer"]["file"] == "tokenizer.json" and meta["tokenizer"]["round_trip"] is True
    assert (store / "tokenizer.json").read_bytes() == (store.parent / "tokenizer.json").read_bytes()
    opened = TokenStore.open(store)
    assert opened.specials == Specials.from_dict(table)
    assert opened.tokenizer.piece(opened.specials.sentinel(0)) == "<extra_id_0>"
    assert opened.tokenizer.piece(opened.specials.mask) == "<mask>"


def test_documents_round_trip_exactly_and_bytes_add_up(store: Path, corpus: Path) -> None:
    from objtrain.objectives.fim import PieceDecoder
    from objtrain.training.accounting import token_bytes

    opened = TokenStore.open(store)
    tok, specials = opened.tokenizer, opened.specials
    docs = [
        opened.split(name).doc(i).tolist()
        for name in ("train", "valid")
        for i in range(len(opened.split(name)))
    ]
    sources = [f.read_bytes().decode("utf-8") for f in sorted((corpus / "corpus").iterdir())]
    for text in tok.decode_batch(docs):
        assert any(text in source for source in sources)  # a paragraph of its file, byte for byte
    slow = [e.ids for e in tok.tok.encode_batch(sources, add_special_tokens=False)]  # with offsets
    assert tok.encode_batch(sources) == slow
    for hard in HARD:
        ids = tok.encode(hard)
        assert tok.decode(ids) == hard
        assert not any(specials.is_special_id(i) for i in ids)  # a quoted special is text, not the token
    assert PieceDecoder(tok)(docs) == tok.decode_batch(docs)  # FIM's fast decoder agrees with the library
    table = token_bytes(tok)
    for name in ("train", "valid"):
        split = opened.split(name)
        assert (
            int(table[torch.from_numpy(split.tokens.astype("int64"))].sum())
            == opened.meta["splits"][name]["bytes"]
        )


def _objective_cases() -> list[Any]:
    from objtrain.objectives.registry import OBJECTIVES, objective_class

    return [
        pytest.param(name, kind, id=f"{name}-{kind}")
        for name in OBJECTIVES
        for kind in objective_class(name).model_kinds
    ]


@pytest.mark.parametrize(("name", "kind"), _objective_cases())
def test_every_objective_reads_the_stores_special_ids(store: Path, name: str, kind: str) -> None:
    """Each objective on rows of such a store: its inserted tokens are the table's, never objtrain's own
    fixed ids (which are ordinary text here)."""
    from objtrain.errors import UserError
    from objtrain.objectives.registry import build_objective
    from objtrain.views.corrupt import rows_from_documents

    opened = TokenStore.open(store)
    tok, specials = opened.tokenizer, opened.specials
    try:
        objective = build_objective(name, specials, tokenizer=tok, model_kind=kind)  # type: ignore[arg-type]
    except UserError as exc:  # a mixture whose default parts do not share this kind
        pytest.skip(f"{name} cannot be configured for {kind} with its defaults: {exc}")
    split = opened.split("train")
    docs = [split.doc(i).tolist() for i in range(len(split))]
    rows, document_ids = rows_from_documents(docs, objective.raw_length(64), 8, specials)
    batch = objective(rows, document_ids, torch.arange(len(rows)), 0)
    text = set(rows.flatten().tolist())
    # random replacements (any ordinary id) and FIM's re-encoded pieces bring new text ids
    new_text = name in ("mlm", "bart", "nsp", "sop", "mixture", "fim", "gpt_bert")
    for field in ("input_ids", "decoder_input_ids", "labels"):
        ids = getattr(batch, field)
        if ids is None:
            continue
        values = set(ids.flatten().tolist()) - {-100}
        assert all(0 <= i < tok.vocab_size for i in values), field
        new = values - text
        assert new_text or all(specials.is_special_id(i) for i in new), (field, sorted(new)[:5])
    if name == "mlm":  # BERT's random replacements are ordinary ids of this vocabulary, never a special
        replaced = (batch.input_ids != rows) & (batch.input_ids != specials.mask)
        assert replaced.any() and not specials.is_special(batch.input_ids[replaced]).any()


def test_t5_sentinels_are_reused_when_they_form_its_block() -> None:
    from objtrain.data.foreign_tokenizer import plan_specials

    sentinels = [f"<extra_id_{k}>" for k in reversed(range(8))]  # T5: <extra_id_0> has the highest id
    tok = byte_level_bpe(
        ["some text to learn from"] * 4, vocab_size=300, specials=("<pad>", "</s>", *sentinels)
    )
    table = plan_specials(tok, n_sentinels=8)
    assert table.sentinel(0) == tok.token_to_id("<extra_id_0>")
    assert table.sentinel(7) == tok.token_to_id("<extra_id_7>") == table.first_sentinel
    assert (table.pad, table.eos) == (tok.token_to_id("<pad>"), tok.token_to_id("</s>"))
    fewer = plan_specials(tok, n_sentinels=9)  # the tokenizer's block is too short: a new one is appended
    assert fewer.first_sentinel >= tok.get_vocab_size()


def test_a_hugging_face_store_trains_evaluates_and_generates(
    store: Path, corpus: Path, tmp_path: Path, objtrain_cli: Cli
) -> None:
    for objective in ("span", "mlm", "fim fim_rate=1"):
        code, out, err = objtrain_cli(
            "corrupt", store, "--objective", *objective.split(), "--seq-len", "64", "--n", "1"
        )
        assert code == 0, err
        assert "<extra_id_0>" in out or "<mask>" in out or "<fim_prefix>" in out or objective == "bart"
    runs = {}
    for objective in ("clm", "span"):
        runs[objective] = tmp_path / objective
        code, out, err = objtrain_cli(
            "train", store, "--objective", objective, "--model", "debug", "--seq-len", "64", "--steps", "3",
            "-o", runs[objective], "--force",
        )  # fmt: skip
        assert code == 0, err
    code, out, err = objtrain_cli(
        "eval", runs["clm"], "--skip", "probe", "--samples", "0", "--format", "json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert 0 < result["bits_per_byte"] < 16
    # every byte of the held-out text is scored once: the tokens' bytes add up to the text's
    assert result["scored_bytes"] == json.loads((store / "meta.json").read_text())["splits"]["valid"]["bytes"]
    code, out, err = objtrain_cli("generate", runs["clm"], "--prompt", "def f(", "--max-new-tokens", "4")
    assert code == 0, err
    assert out.startswith("def f(")
    code, out, err = objtrain_cli(
        "generate", runs["span"], "--text", "for i in [MASK](n):", "--max-new-tokens", "4"
    )
    assert code == 0, err


def test_reusing_the_tokenizer_of_such_a_checkpoint_keeps_its_table(store: Path, tmp_path: Path) -> None:
    from objtrain.models.checkpoint import save_checkpoint
    from objtrain.models.zoo import ModelConfig, build_model

    opened = TokenStore.open(store)
    model = build_model(
        ModelConfig(kind="decoder", vocab_size=opened.tokenizer.vocab_size, d_model=32, n_layer=1, n_head=2)
    )
    save_checkpoint(tmp_path / "ckpt", model, opened.specials, opened.tokenizer)
    tokenizer, _ = load_tokenizer(tmp_path / "ckpt", n_sentinels=4)  # the checkpoint's table wins
    assert tokenizer.specials == opened.specials and tokenizer.vocab_size == opened.tokenizer.vocab_size


@pytest.mark.parametrize(
    "content",
    [b'{"version": "1.0", "vocab": {}}', b"\x00\xff" * 64, b"not json at all", b""],
    ids=["json-without-model", "binary", "text", "empty"],
)
def test_a_tokenizer_file_that_is_not_one_is_refused(
    corpus: Path, tmp_path: Path, objtrain_cli: Cli, content: bytes
) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(content)
    for given in (bad, tmp_path):  # the file, and a directory holding it
        code, _, err = objtrain_cli(
            "tokenize", corpus / "corpus", "--tokenizer", given, "-o", tmp_path / "out"
        )
        assert code == 2
        assert len(err.strip().splitlines()) == 1 and "is not a Hugging Face tokenizer" in err, err
        assert "Traceback" not in err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["decoder", "encdec"])
def test_a_model_of_such_a_store_exports_with_its_tokenizer(store: Path, tmp_path: Path, kind: str) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="the 'hf' extra (transformers) is not installed"
    )
    from interop_helpers import tiny_checkpoint

    from objtrain.interop.export import export_checkpoint

    opened = TokenStore.open(store)
    summary = export_checkpoint(
        tiny_checkpoint(tmp_path / "ck", opened.tokenizer, kind=kind), tmp_path / "hf"
    )
    assert summary.max_logit_diff < 1e-4 and summary.greedy_tokens == 32
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    for text in HARD[:2]:  # not the literal specials: transformers matches those in text, objtrain never
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == opened.tokenizer.encode(text) and hf.decode(ids) == text
    s = opened.specials
    # with its special tokens: an encoder-decoder's input ends with </s>, as objtrain's; nothing else added
    added = [s.eos] if kind == "encdec" else []
    assert hf(HARD[0])["input_ids"] == [*opened.tokenizer.encode(HARD[0]), *added]
    assert hf.convert_tokens_to_ids(["<extra_id_0>", "<mask>", "<fim_prefix>"]) == [
        s.sentinel(0),
        s.mask,
        s.fim_prefix,
    ]
    assert (hf.eos_token_id, hf.pad_token_id) == (s.eos, s.pad)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["eos_token_id"], config["pad_token_id"], config["vocab_size"]) == (s.eos, s.pad, len(hf))
