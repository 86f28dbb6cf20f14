"""Middle bits per byte (infilling likelihood) and the layer-choosing probe."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from objtrain.batch import Batch, ModelOutput
from objtrain.evaluation import infill, middle, probe
from objtrain.evaluation.infill import InfillTask

SOURCE = "def area(w, h):\n    if w < 0:\n        raise ValueError(w)\n    s = w * h\n    return s\n"


def test_multi_line_cuts_take_whole_body_lines() -> None:
    rng = np.random.default_rng(0)
    for _ in range(30):
        t = infill.cut(SOURCE, "lines", rng, "t")
        assert t is not None and t.kind == "lines"
        assert t.prefix + t.middle + t.suffix == SOURCE
        assert 2 <= t.middle.count("\n") <= 4 and t.middle.endswith("\n") and t.prefix.endswith("\n")
        assert t.prefix.startswith("def ")


def test_ratio_standard_error_matches_the_delta_method() -> None:
    nats = np.array([2.0, 4.0, 3.0, 5.0])
    nbytes = np.array([1.0, 2.0, 2.0, 3.0])
    bpb, se = middle.ratio_se(nats, nbytes)
    r = nats.sum() / nbytes.sum()
    assert bpb == pytest.approx(r / math.log(2))
    by_hand = math.sqrt(((nats - r * nbytes) ** 2).sum() / (4 * 3)) / nbytes.mean() / math.log(2)
    assert se == pytest.approx(by_hand)
    assert math.isnan(middle.ratio_se(nats[:1], nbytes[:1])[1])


def test_fim_sequences_score_exactly_the_middle_tokens(tokenizer) -> None:
    s = tokenizer.specials
    task = InfillTask("t", "def f(x):\n", "    y = x + 1\n", "    return y\n")
    mid = tokenizer.encode(task.middle)
    for mode in ("psm", "spm"):
        seq = middle._fim_sequence(tokenizer, task, mode)
        scored = seq.ids[seq.first + 1 : seq.last + 1]  # the targets of the scored positions
        assert scored == mid
        assert (
            seq.ids[seq.first] == s.fim_middle
            if mode == "psm"
            else seq.ids[:2] == [s.fim_prefix, s.fim_suffix]
        )


def test_a_uniform_model_costs_log2_v_bits_per_token_in_every_mode(stub, tokenizer) -> None:
    V = tokenizer.vocab_size
    model = stub(torch.zeros(V, V))
    tasks = [InfillTask("t", "def f(x):\n", "    y = x + 1\n", "    return y\n", "line")]
    n_mid = len(tokenizer.encode(tasks[0].middle))
    nbytes = len(tasks[0].middle.encode())
    expect = n_mid * math.log2(V) / nbytes
    out = middle.middle_scores(model, "fim-psm", tokenizer, tokenizer.specials, {}, tasks)
    assert out["middle_bpb"] == pytest.approx(expect, rel=1e-5)
    # left to right: tokens of (prefix + middle) minus tokens of prefix, encoded whole
    n_whole = len(tokenizer.encode(tasks[0].prefix + tasks[0].middle)) - len(
        tokenizer.encode(tasks[0].prefix)
    )
    assert out["middle_bpb_prefix_only"] == pytest.approx(n_whole * math.log2(V) / nbytes, rel=1e-5)
    clm = middle.middle_scores(model, "left-to-right", tokenizer, tokenizer.specials, {}, tasks)
    assert clm["middle_bpb"] == clm["middle_bpb_prefix_only"] and "suffix_gain" not in clm
    assert middle.middle_scores(model, "none", tokenizer, tokenizer.specials, {}, tasks) == {}


def test_a_model_that_reads_the_suffix_gains_from_it(stub, tokenizer) -> None:
    """A bigram stub that puts its mass on the token after each token *of the middle*: given the FIM
    layout it predicts the middle; read left to right it does the same, so the gain is exactly the cost
    of the one position whose context differs (after <fim_middle> vs after the prefix's last token)."""
    V = tokenizer.vocab_size
    task = InfillTask("t", "def f(x):\n", "    y = x + 1\n", "    return y\n", "line")
    mid = tokenizer.encode(task.middle)
    table = torch.zeros(V, V)
    table[tokenizer.specials.fim_middle, mid[0]] = 30.0  # <MID> announces the middle's first token
    for a, b in itertools.pairwise(mid):
        table[a, b] = 30.0
    model = stub(table)
    out = middle.middle_scores(model, "fim-psm", tokenizer, tokenizer.specials, {}, [task])
    assert out["middle_bpb"] < 0.01 < out["middle_bpb_prefix_only"]
    assert out["suffix_gain"] == pytest.approx(out["middle_bpb_prefix_only"] - out["middle_bpb"])


def test_a_fim_model_trained_in_both_orders_is_scored_in_each(stub, tokenizer) -> None:
    """The bigram stub of the test above announces the middle after <fim_middle>, so it scores it alike in
    both orders; a stub that continues the prefix into the middle scores SPM (prefix and middle adjacent)
    far below PSM (the middle follows the suffix)."""
    V = tokenizer.vocab_size
    task = InfillTask("t", "def f(x):\n", "    y = x + 1\n", "    return y\n", "line")
    pre, mid = tokenizer.encode(task.prefix), tokenizer.encode(task.middle)
    table = torch.zeros(V, V)
    table[pre[-1], mid[0]] = 30.0  # the prefix's last token announces the middle's first
    for a, b in itertools.pairwise(mid):
        table[a, b] = 30.0
    model = stub(table)
    both = {"objective": "fim", "objective_config": {"fim_rate": 0.5, "spm_rate": 0.5}}
    out = middle.middle_scores(model, "fim-psm", tokenizer, tokenizer.specials, both, [task])
    assert out["middle_bpb_psm"] == out["middle_bpb"]  # its own mode
    assert out["middle_bpb_spm"] < 0.01 < out["middle_bpb_psm"]
    assert out["suffix_gain_spm"] == pytest.approx(out["middle_bpb_prefix_only"] - out["middle_bpb_spm"])
    for one_order in ({"objective": "fim", "objective_config": {"spm_rate": 0.0}}, {"objective": "clm"}, {}):
        alone = middle.middle_scores(model, "fim-psm", tokenizer, tokenizer.specials, one_order, [task])
        assert "middle_bpb_spm" not in alone and "middle_bpb_psm" not in alone
        assert alone["middle_bpb"] == out["middle_bpb"]  # the own-mode score is unchanged


class CacheModel(nn.Module):
    """Logits `c` on every token already read in the row, else 0: a model that copies from any distance
    (the mechanism a model needs to use a suffix or a far prefix), with no sense of order."""

    def __init__(self, vocab_size: int, c: float = 6.0) -> None:
        super().__init__()
        self.vocab_size, self.c = vocab_size, c
        self.embed = nn.Embedding(vocab_size, 4)

    def forward(self, batch: Batch) -> ModelOutput:
        ids = batch.input_ids
        seen = F.one_hot(ids, self.vocab_size).float().cummax(dim=1).values  # read at or before t
        return ModelOutput(logits=self.c * seen, hidden=self.embed(ids))


LONG = InfillTask(
    "t",
    "def f(total, count):\n    mean = total / count\n    x = 1\n    y = 2\n",
    "    return mean * count\n",
    "    total = mean * count\n",
    "line",
)
BOTH = {"objective": "fim", "objective_config": {"fim_rate": 0.5, "spm_rate": 0.5}}


def test_the_near_prefix_is_the_middles_line_and_the_one_before() -> None:
    assert middle.near_prefix("a\nb\nc\n") == "c\n"  # a line middle: the line before it
    assert middle.near_prefix("a\nb\nc = f(") == "b\nc = f("  # a span: its own line so far, and one more
    assert middle.near_prefix("c = f(") == "c = f(" and middle.near_prefix("c\n") == "c\n"
    assert middle.near_prefix("") == ""


def test_suffix_worth_is_what_the_suffix_text_saves_in_the_models_own_format(stub, tokenizer) -> None:
    """A bigram model reads only the last token: the suffix's text is worth exactly 0 to it in either
    order, though `suffix_gain` is not 0 (it also counts the format's own cost). A model that copies from
    anywhere in its context gains from a suffix that holds the middle's words, in both orders."""
    bigram = stub(
        torch.randn(tokenizer.vocab_size, tokenizer.vocab_size, generator=torch.Generator().manual_seed(0))
    )
    out = middle.middle_scores(bigram, "fim-psm", tokenizer, tokenizer.specials, BOTH, [LONG])
    assert out["suffix_worth"] == out["suffix_worth_psm"] == 0.0 and out["suffix_worth_spm"] == 0.0
    assert out["suffix_gain"] != 0.0
    assert out["far_prefix_worth"] == 0.0  # the middle's tokens follow the same last tokens either way
    cache = middle.middle_scores(
        CacheModel(tokenizer.vocab_size), "fim-psm", tokenizer, tokenizer.specials, BOTH, [LONG]
    )
    assert cache["suffix_worth_psm"] > 0.1 and cache["suffix_worth_spm"] > 0.1
    assert cache["far_prefix_worth"] > 0.1  # "mean" and "total" come from two lines before the middle's


def test_a_span_models_suffix_worth_is_its_suffix_gain(stub, tokenizer) -> None:
    model = stub(
        torch.randn(tokenizer.vocab_size, tokenizer.vocab_size, generator=torch.Generator().manual_seed(1))
    )
    out = middle.middle_scores(
        model, "sentinel", tokenizer, tokenizer.specials, {"objective": "span"}, [LONG]
    )
    assert out["suffix_worth"] == pytest.approx(out["suffix_gain"]) and "far_prefix_worth" not in out


def test_the_probe_chooses_the_informative_layer_on_dev_and_reports_test() -> None:
    g = torch.Generator().manual_seed(0)

    def split(n: int) -> tuple[list[torch.Tensor], list[str]]:
        y = torch.randint(0, 2, (n,), generator=g)
        noise = torch.randn(n, 8, generator=g, dtype=torch.float64)
        signal = noise.clone()
        signal[:, 0] += 4.0 * y  # layer 2 separates the classes, layers 1 and 3 do not
        other = torch.randn(n, 8, generator=g, dtype=torch.float64)
        return [noise, signal, other], [str(int(v)) for v in y]

    (tx, ty), (dx, dy), (sx, sy) = split(300), split(100), split(200)
    out = probe.select_and_score(tx, ty, dx, dy, sx, sy)
    assert out["probe_layer"] == 2 and out["probe_layers"] == 3
    assert (
        out["probe_accuracy"] > 0.9 and out["probe_test_examples"] == 200 and out["probe_dev_examples"] == 100
    )
    assert 0 < out["probe_accuracy_se"] < 0.05


def test_split_off_holds_out_a_share_under_the_seed() -> None:
    data = probe.Labelled([f"t{i}" for i in range(50)], ["a", "b"] * 25)
    rest, held = probe.split_off(data, 0.2, 3)
    assert len(held.texts) == 10 and len(rest.texts) == 40
    assert sorted(rest.texts + held.texts) == sorted(data.texts)
    assert probe.split_off(data, 0.2, 3)[1].texts == held.texts


def test_an_unknown_probe_task_is_one_line(tmp_path) -> None:
    from objtrain.errors import UserError

    with pytest.raises(UserError, match="did you mean 'sst2'"):
        probe.task_files("sst", tmp_path)


def test_fim_at_rate_zero_infills_left_to_right() -> None:
    assert infill.infill_mode("decoder", {"objective": "fim", "objective_config": {"fim_rate": 0.0}}) == (
        "left-to-right"
    )
    assert (
        infill.infill_mode("decoder", {"objective": "fim", "objective_config": {"fim_rate": 0.5}})
        == "fim-psm"
    )


def test_units_are_the_scores_the_metrics_sum(debug_checkpoint, stdlib_texts, tmp_path) -> None:
    """With `units`, each document's and each middle task's nats and bytes come back: they sum to the
    reported bits per byte (what compare pairs arm against arm); without, nothing extra is returned."""
    from objtrain.evaluation.suite import EvalOptions, evaluate

    held = tmp_path / "held.txt"
    held.write_text("\n\n".join(stdlib_texts[:2]), encoding="utf-8")
    skip = ("corrupted", "probe", "samples")
    ckpt = debug_checkpoint("decoder")
    out = evaluate(ckpt, held, EvalOptions(units=True, skip=skip, middle_tasks=20, infill_tasks=2))
    for metric, key in (("bits_per_byte", "bits_per_byte"), ("middle_bpb", "middle_bpb")):
        u = out["units"][metric]
        assert len(u["nats"]) == len(u["bytes"]) >= 1
        assert sum(u["nats"]) / (math.log(2) * sum(u["bytes"])) == pytest.approx(out[key], rel=1e-4)
    assert len(out["units"]["middle_bpb"]["nats"]) == out["middle_tasks"]
    plain = evaluate(ckpt, held, EvalOptions(skip=skip, middle_tasks=20, infill_tasks=2))
    assert "units" not in plain
