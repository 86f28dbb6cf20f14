"""Decoding: KV cache equals recomputation, speculative equals greedy, sampling, prompts for each mode."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from model_helpers import tiny_model

from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.models import generate as gen
from objtrain.models.decoder import Decoder
from objtrain.specials import Specials

PROMPT = [5, 17, 33, 60, 21, 8]
Result = tuple[int, str, str]


@pytest.mark.parametrize("mtp_heads", [1, 3])
@pytest.mark.parametrize(
    "sampling", [gen.Sampling(), gen.Sampling(temperature=1.0, top_k=20, top_p=0.9, seed=7)]
)
def test_kv_cache_equals_recomputation(mtp_heads: int, sampling: gen.Sampling) -> None:
    model = tiny_model("decoder", mtp_heads=mtp_heads)
    cached = list(gen.generate_decoder(model, PROMPT, 24, sampling))
    plain = list(gen.generate_decoder(model, PROMPT, 24, sampling, use_cache=False))
    assert cached == plain and len(cached) == 24
    assert len(set(cached)) > 3  # a non-degenerate sequence, so the comparison means something


def test_cached_logits_equal_full_forward() -> None:
    model = tiny_model("decoder")
    ids = torch.tensor([[*PROMPT, 40, 41, 42]])
    caches = model.new_cache(1, ids.size(1))
    parts = [model.step(ids[:, :4], torch.arange(4)[None], caches)[0]]
    for t in range(4, ids.size(1)):
        parts.append(model.step(ids[:, t : t + 1], torch.tensor([[t]]), caches)[0])
    assert torch.allclose(torch.cat(parts, dim=1), model.logits(ids), atol=1e-5)


def test_encdec_kv_cache_equals_recomputation() -> None:
    model = tiny_model("encdec")
    for sampling in (gen.Sampling(), gen.Sampling(temperature=0.8, seed=3)):
        cached = list(gen.generate_encdec(model, PROMPT, 16, sampling))
        plain = list(gen.generate_encdec(model, PROMPT, 16, sampling, use_cache=False))
        assert cached == plain and len(cached) == 16
        assert sampling.greedy or len(set(cached)) > 2


def test_stacked_heads_equal_each_head_layer() -> None:
    """The batched n-head block gives every head's hidden states, prompt chunk and single steps alike."""
    model = tiny_model("decoder", mtp_heads=3).eval()
    with torch.no_grad():
        for p in model.parameters():  # distinct norm gains per head, so a mixed-up head would show
            p.add_(0.05 * torch.randn_like(p))
    heads = model.stacked_heads()
    ids = torch.tensor([[*PROMPT, 40, 41, 42]])
    split = [(0, 4), (4, 5), (5, 9)]
    caches, stacked_caches = model.new_cache(1, 9), model.new_stacked_cache(1, 9)
    for a, b in split:
        pos = torch.arange(a, b)[None]
        each = torch.stack(model.step_hidden(ids[:, a:b], pos, caches, n_heads=3))  # (3, 1, t, D)
        together = model.step_stacked(ids[:, a:b], pos, stacked_caches, heads)
        assert together.shape == each.shape
        assert torch.allclose(together, each, atol=1e-5)
        assert not torch.allclose(each[1], each[2], atol=1e-3)  # the heads really differ


TREES = {
    "default": None,
    "chain": gen.chain_tree(3),
    "wide": ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 2)),
    "shallow": ((1,), (0,), (3,)),
}


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("tree", TREES)
def test_speculative_greedy_equals_greedy(n: int, tree: str) -> None:
    model = tiny_model("decoder", mtp_heads=n)
    paths = TREES[tree]
    if paths is not None and max(len(p) for p in paths) > n - 1:
        paths = tuple(p for p in paths if len(p) <= n - 1)
    for prompt in (PROMPT, [3], [90, 1, 2, 3, 4, 5, 6, 7, 8]):
        stats = gen.SpeculativeStats()
        fast = list(gen.generate_speculative(model, prompt, 30, stats=stats, tree=paths))
        assert fast == list(gen.generate_decoder(model, prompt, 30))
        assert stats.forwards <= 30 and 1 <= stats.tokens_per_forward <= n


def repeating_model(mtp_heads: int) -> Decoder:
    """Identity blocks (zero output projections): the model repeats its last token, so every head
    agrees with head 1 and every draft on the argmax path is right."""
    model = tiny_model("decoder", mtp_heads=mtp_heads)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("proj.weight", "w2.weight")):
                p.zero_()
    return model  # type: ignore[return-value]


@pytest.mark.parametrize("tree", ["default", "chain", "shallow"])
def test_speculative_accepts_every_draft_when_heads_agree(tree: str) -> None:
    model = repeating_model(4)
    prompt = [7] * 6
    greedy = list(gen.generate_decoder(model, prompt, 13))
    if len(set(greedy)) != 1:
        pytest.skip("this init does not repeat one token")
    stats = gen.SpeculativeStats()
    assert list(gen.generate_speculative(model, prompt, 13, stats=stats, tree=TREES[tree])) == greedy
    assert stats.acceptance == 1.0
    depth = 3 if tree != "shallow" else 1
    assert stats.forwards == -(-12 // (depth + 1))  # the first token comes from the prompt's forward


@pytest.mark.parametrize("max_new", [1, 2, 3, 4, 5, 9])
def test_speculative_stops_at_max_new_tokens(max_new: int) -> None:
    """Exactly max_new_tokens, even where a forward accepts more drafts than are still wanted."""
    model = repeating_model(4)
    greedy = list(gen.generate_decoder(model, [7] * 6, max_new))
    assert list(gen.generate_speculative(model, [7] * 6, max_new)) == greedy
    assert len(greedy) == max_new
    random_model = tiny_model("decoder", mtp_heads=3)
    out = list(gen.generate_speculative(random_model, PROMPT, max_new))
    assert out == list(gen.generate_decoder(random_model, PROMPT, max_new))


@pytest.mark.parametrize("accepted", ["side path", "argmax chain"])
def test_tree_step_keeps_the_accepted_path_in_the_caches(accepted: str) -> None:
    """A step leaves every cache as feeding its accepted path plainly: a path that skips tree nodes is
    moved into place, the argmax chain (laid out first) is already there."""
    model: Decoder = tiny_model("decoder", mtp_heads=3)  # type: ignore[assignment]
    true = list(gen.generate_decoder(model, PROMPT, 4))
    tree = ((0,), (1,), (0, 0), (1, 0), (1, 1))  # nodes in order: root, (0,), (0,0), (1,), (1,0), (1,1)
    spec = gen.TreeSpeculator(model, PROMPT, 16, tree)
    assert spec.token == true[0] and spec.layout.size == 6
    assert spec.layout.in_place == (True, True, True, False, False, False)
    wrong = [(t + 1) % model.config.vocab_size for t in true]
    # head 2's candidates (rank 0, 1), then head 3's: the right path is root -> (1,) -> (1, 0) when the
    # argmaxes are wrong, root -> (0,) -> (0, 0) when they are right
    if accepted == "side path":
        spec.candidates = torch.tensor([wrong[1], true[1], true[2], wrong[2]])
    else:
        spec.candidates = torch.tensor([true[1], wrong[1], true[2], wrong[2]])
    assert spec.step() == true[1:4]
    plain = model.new_stacked_cache(1, 16)
    fed = torch.tensor([[*PROMPT, *true[:3]]])
    model.step_stacked(fed, torch.arange(fed.size(1))[None], plain, model.stacked_heads())
    assert len(spec.caches) == len(plain) == model.config.n_layer
    for got, want in zip(spec.caches, plain, strict=True):
        assert got.length == want.length == len(PROMPT) + 3
        assert torch.allclose(got.k[:, :, : got.length], want.k[:, :, : want.length], atol=1e-5)
        assert torch.allclose(got.v[:, :, : got.length], want.v[:, :, : want.length], atol=1e-5)
    # and decoding goes on as greedy from there
    assert spec.token == true[3]


def test_draft_trees_are_checked() -> None:
    layout = gen.tree_layout(((0,), (1,), (1, 0)), 3, torch.device("cpu"))
    assert layout.depth.tolist() == [0, 1, 1, 2] and layout.parent.tolist() == [0, 0, 2]
    assert layout.paths.tolist() == [[0, 0, 0], [0, 1, 1], [0, 2, 2], [0, 2, 3]]
    chain_first = gen.tree_layout(((0,), (1,), (0, 0), (1, 0)), 3, torch.device("cpu"))
    assert chain_first.paths.tolist() == [[0, 0, 0], [0, 1, 1], [0, 1, 2], [0, 3, 3], [0, 3, 4]]
    for bad in [((0, 0),), ((0,), (0,)), ((0,), (0, 0), (0, 0, 0)), ((0,), (-1,)), ()]:
        with pytest.raises(UserError):
            gen.tree_layout(bad, 3, torch.device("cpu"))
    for n in (2, 3, 4, 6):
        gen.tree_layout(gen.default_tree(n), n, torch.device("cpu"))


def test_stop_tokens_end_generation() -> None:
    model = tiny_model("decoder")
    full = list(gen.generate_decoder(model, PROMPT, 20))
    stop = full[5]
    cut = list(gen.generate_decoder(model, PROMPT, 20, stop_ids=(stop,)))
    assert cut == full[: full.index(stop)]
    spec_model = tiny_model("decoder", mtp_heads=3)
    full = list(gen.generate_speculative(spec_model, PROMPT, 20))
    for stop in full:
        assert list(gen.generate_speculative(spec_model, PROMPT, 20, (stop,))) == full[: full.index(stop)]


def test_sampling_filters() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    g = torch.Generator().manual_seed(0)
    assert int(gen.choose(logits, gen.Sampling(), g)) == 1
    assert int(gen.choose(logits, gen.Sampling(temperature=1.0, top_k=1), g)) == 1
    assert int(gen.choose(logits, gen.Sampling(temperature=1.0, top_p=0.1), g)) == 1
    draws = {int(gen.choose(logits, gen.Sampling(temperature=5.0, top_k=2), g)) for _ in range(200)}
    assert draws == {1, 3}
    # top_p = 0.8: probabilities 0.64, 0.24, 0.09, 0.03 -> keep the smallest set reaching 0.8: {1, 3}
    draws = {int(gen.choose(logits, gen.Sampling(temperature=1.0, top_p=0.8), g)) for _ in range(300)}
    assert draws == {1, 3}
    with pytest.raises(Exception, match="top-p"):
        gen.Sampling(top_p=0.0)
    for bad in (-1.0, float("nan"), float("inf")):  # NaN passes `< 0` and failed later in multinomial
        with pytest.raises(UserError, match="temperature"):
            gen.Sampling(temperature=bad)


def test_same_seed_same_sample() -> None:
    model = tiny_model("decoder")
    s = gen.Sampling(temperature=1.0, seed=11)
    assert list(gen.generate_decoder(model, PROMPT, 15, s)) == list(
        gen.generate_decoder(model, PROMPT, 15, s)
    )
    other = gen.Sampling(temperature=1.0, seed=12)
    assert list(gen.generate_decoder(model, PROMPT, 15, s)) != list(
        gen.generate_decoder(model, PROMPT, 15, other)
    )


def test_fim_prompt_layouts(tokenizer: Tokenizer, specials: Specials) -> None:
    pre, suf = tokenizer.encode("def f(x):\n    "), tokenizer.encode("\n    return y\n")
    psm = gen.fim_prompt(tokenizer, "def f(x):\n    ", "\n    return y\n", "psm")
    spm = gen.fim_prompt(tokenizer, "def f(x):\n    ", "\n    return y\n", "spm")
    s = specials
    assert psm == [s.fim_prefix, *pre, s.fim_suffix, *suf, s.fim_middle]
    assert spm == [s.fim_prefix, s.fim_suffix, *suf, s.fim_middle, *pre]


def test_masks_are_inserted_by_id(tokenizer: Tokenizer, specials: Specials) -> None:
    ids, n = gen.encode_input(tokenizer, "def [MASK](x): <mask> [MASK]", fill="mask")
    assert n == 2 and ids.count(specials.mask) == 2  # the literal "<mask>" stays text
    ids, n = gen.encode_input(tokenizer, "a [MASK] b [MASK] c", fill="sentinel", append_eos=True)
    sentinels = [i for i in ids if i in (specials.sentinel(0), specials.sentinel(1))]
    assert sentinels == [specials.sentinel(0), specials.sentinel(1)] and ids[-1] == specials.eos


def test_split_spans_reads_t5_targets(specials: Specials) -> None:
    s0, s1, s2 = specials.sentinel(0), specials.sentinel(1), specials.sentinel(2)
    assert gen.split_spans([s0, 300, 301, s1, 302, s2, 303], 2, specials) == [[300, 301], [302]]
    assert gen.split_spans([s1, 305], 2, specials) == [[], [305]]


def test_fill_mask_gives_ranked_probabilities(tokenizer: Tokenizer) -> None:
    from objtrain.models import build_model, model_config

    torch.manual_seed(0)
    model = build_model(model_config("encoder", "debug", vocab_size=tokenizer.vocab_size)).eval()
    result = gen.fill_mask(model, tokenizer, "def [MASK](x):\n    return [MASK]", top_k=4)  # type: ignore[arg-type]
    assert len(result) == 2
    for candidates in result:
        probs = [c.prob for c in candidates]
        assert len(probs) == 4 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer) -> dict[str, Path]:
    """Debug-size checkpoints for every generate mode."""
    from objtrain.models import build_model, model_config
    from objtrain.models.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("generate")
    out = {}
    for kind, info in [
        ("decoder", {"objective": "fim", "fim_mode": "psm"}),
        ("encoder", {"objective": "mlm"}),
        ("encdec", {"objective": "span"}),
    ]:
        torch.manual_seed(0)
        model = build_model(model_config(kind, "debug", vocab_size=tokenizer.vocab_size))
        out[kind] = save_checkpoint(root / kind, model, tokenizer.specials, tokenizer, info)
    return out


MODES = [
    ("decoder", ("--prompt", "def "), "continue"),
    ("decoder", ("--prefix", "def f(", "--suffix", "):"), "fim-psm"),
    ("encdec", ("--text", "def [MASK](x):"), "span-fill"),
    ("encdec", ("--prompt", "def f(x):"), "seq2seq"),
    ("encoder", ("--text", "def [MASK](x):"), "fill-mask"),
]


@pytest.mark.parametrize(("kind", "args", "mode"), MODES, ids=[m[2] for m in MODES])
def test_stdout_holds_only_the_result(
    checkpoints: dict[str, Path],
    objtrain_cli: Callable[..., tuple],
    kind: str,
    args: tuple[str, ...],
    mode: str,
) -> None:
    code, out, err = objtrain_cli("generate", checkpoints[kind], *args, "-n", "3")
    assert code == 0, err
    assert "tokens in" not in out and out.strip(), out  # `> out.txt` gets the text alone
    if mode != "fill-mask":
        assert "tokens in" in err, err
    code, out, err = objtrain_cli("generate", checkpoints[kind], *args, "-n", "3", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["mode"] == mode and "tokens in" not in err


def test_fill_mask_offers_text_tokens_only(tokenizer: Tokenizer) -> None:
    from objtrain.batch import ModelOutput

    first = tokenizer.specials.first_ordinary

    class SpecialLover(torch.nn.Module):
        """Puts most of its mass on reserved ids (<mask>, sentinels, EOS), then on ids by size."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(tokenizer.vocab_size, 4)

        def forward(self, batch: object) -> ModelOutput:
            logits = torch.linspace(0, 1, tokenizer.vocab_size).repeat(1, batch.input_ids.size(1), 1)  # type: ignore[attr-defined]
            logits[..., :first] = 10.0
            return ModelOutput(logits=logits)

    result = gen.fill_mask(SpecialLover(), tokenizer, "def [MASK](x):", top_k=5)  # type: ignore[arg-type]
    ids = [c.token_id for c in result[0]]
    assert all(i >= first for i in ids) and ids[0] == tokenizer.vocab_size - 1, ids
    assert all(c.text for c in result[0])


@pytest.mark.parametrize(
    "args",
    [
        ("--prompt", "a", "--prefix", "b", "--suffix", "c"),
        ("--prompt", "a", "--suffix", ""),
        ("--text", "a [MASK]", "--prompt", "b"),
    ],
)
def test_conflicting_inputs_are_refused(
    checkpoints: dict[str, Path],
    objtrain_cli: Callable[..., tuple],
    args: tuple[str, ...],
) -> None:
    code, out, err = objtrain_cli("generate", checkpoints["decoder"], *args, "-n", "2")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert "do not go together" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("kind", "args", "message"),
    [
        ("decoder", ("--prompt", "def ", "--fim-mode", "spm"), "--fim-mode sets the infill order"),
        ("encoder", ("--text", "def [MASK](x):", "--top-k", "-1"), "--top-k must be >= 0, got -1"),
        ("encdec", ("--text", "no masks here"), "--text has no [MASK] to fill"),
    ],
)
def test_options_that_would_be_ignored_or_fail_are_refused(
    checkpoints: dict[str, Path],
    objtrain_cli: Callable[..., tuple],
    kind: str,
    args: tuple[str, ...],
    message: str,
) -> None:
    code, out, err = objtrain_cli("generate", checkpoints[kind], *args, "-n", "2")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert message in err and "Traceback" not in err


def test_ctrl_c_while_generating_says_interrupted_only(
    checkpoints: dict[str, Path], objtrain_cli: Callable[..., tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    def two_tokens_then_ctrl_c(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        yield 300
        yield 301
        raise KeyboardInterrupt

    monkeypatch.setattr(gen, "generate_decoder", two_tokens_then_ctrl_c)
    code, out, err = objtrain_cli("generate", checkpoints["decoder"], "--prompt", "def ", "-n", "50")
    assert code == 130 and out.startswith("def ") and len(out) > len("def "), (out, err)
    assert err.strip().splitlines() == ["interrupted"], err  # not "nothing was written" after text
