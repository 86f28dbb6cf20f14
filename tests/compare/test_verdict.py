"""A comparison ends on its answer: the learnt table, then a verdict naming the best arm per headline metric
and every other arm's gap to it (the last thing `make demo` prints)."""

from __future__ import annotations

import io

from rich.console import Console

from objtrain.report.comparison import finding, markdown, print_tables, question_metrics, verdict
from objtrain.report.tables import verdict_cell


def _metric(mean: float) -> dict:
    return {"mean": mean, "std": None, "n": 1}


def _results() -> dict:
    arms = []
    for name, bpb, em in (("clm", 2.0, 0.0), ("fim-0.5", 2.05, 0.25)):
        arms.append({
            "name": name, "objective": "fim", "objective_overrides": {}, "model_kind": "decoder",
            "model_size": "tiny", "model_overrides": {}, "seq_len": 128, "batch_size": 16, "steps": 10,
            "cost": {k: _metric(1.0) for k in ("parameters", "tokens", "flops", "seconds", "tokens_per_s",
                                               "peak_memory_bytes")},
            "metrics": {"bits_per_byte": _metric(bpb), "infill_exact_match": _metric(em)},
            "runs": [{"run_dir": f"arms/{name}", "train": {"config": {"data": {"store": "store"}}}}],
        })  # fmt: skip
    return {
        "experiment": {"name": "fim-vs-clm", "question": "q?", "expect": "FIM for free.", "source": None},
        "budget": {"name": "default", "kind": "tokens", "value": 1000},
        "seeds": [0],
        "evaluation": {"suite": True, "data": None, "options": {}},
        "machine": {"platform": "x", "cpu_count": 2, "torch_threads": 2, "torch": "2", "python": "3"},
        "wall_seconds": 1.0,
        "arms": arms,
        "rankings": {
            "bits_per_byte": {"lower_is_better": True, "best": "clm", "within_seed_spread": [], "gaps": {}},
            "infill_exact_match": {
                "lower_is_better": False,
                "best": "fim-0.5",
                "within_seed_spread": [],
                "gaps": {},
            },
        },
    }


def test_the_verdict_names_the_best_arm_and_each_gap() -> None:
    lines = verdict(_results())
    assert lines[0] == "bits_per_byte (lower is better): clm best at 2; fim-0.5 2.05 (+2.5%)"
    assert lines[1] == "infill_exact_match (higher is better): fim-0.5 best at 0.25; clm 0 (-100.0%)"
    assert lines[2] == "the literature: FIM for free."
    assert "one seed" in lines[3]


def test_the_printed_report_ends_on_the_learnt_table_and_the_verdict() -> None:
    results = _results()
    buffer = io.StringIO()
    print_tables(results, Console(file=buffer, width=200, force_terminal=False))
    text = buffer.getvalue()
    assert text.index("what each arm cost") < text.index("what each arm learnt") < text.index("verdict")
    assert verdict(results)[-1] in text
    assert text.rstrip().endswith(
        "In short: of the 2 arms, clm scored best on bits per byte at one seed, which cannot say how much "
        "of that is noise (run --seeds 3)."
    )
    assert "**Verdict.**" in markdown(results, [])


def test_a_tie_is_said_as_no_difference() -> None:
    results = _results()
    for arm in results["arms"]:
        arm["metrics"]["infill_exact_match"] = _metric(0.0)
    assert (
        verdict(results)[1]
        == "infill_exact_match (higher is better): every arm at 0, no difference at this budget"
    )


def test_a_metric_only_some_arms_have_names_them_not_every_arm() -> None:
    results = _results()
    results["arms"].append(dict(results["arms"][0], name="mlm", metrics={"bits_per_byte": _metric(3.0)}))
    for arm in results["arms"][:2]:
        arm["metrics"]["infill_exact_match"] = _metric(0.1466)
    line = verdict(results)[1]
    assert line == (
        "infill_exact_match (higher is better) (2 of 3 arms have it): clm and fim-0.5 at 0.1466, "
        "no difference at this budget"
    )
    assert "every arm" not in line


def test_the_cost_section_names_the_control_held_equal_and_the_other_spread() -> None:
    from objtrain.report.comparison import held_equal

    results = _results()
    results["arms"][0]["cost"]["flops"] = _metric(1e12)
    results["arms"][1]["cost"]["flops"] = _metric(2.4e12)
    text = held_equal(results)
    assert text.startswith("**Held equal: tokens.**")
    assert "FLOPs differ 2.40x" in text and "not at equal compute" in text
    results["budget"]["kind"] = "flops"
    results["arms"][1]["cost"]["tokens"] = _metric(0.5)
    text = held_equal(results)
    assert text.startswith("**Held equal: FLOPs.**") and "tokens differ 2.00x" in text
    assert "**Held equal: FLOPs.**" in markdown(results, [])


def test_the_terminal_shows_the_metrics_that_answer_the_question_and_ends_on_the_finding() -> None:
    results = _results()
    for i, arm in enumerate(results["arms"]):
        arm["metrics"].update({f"extra_{k}": _metric(float(k + i)) for k in range(20)})
    results["claims"] = [{
        "claim": "FIM for free", "metric": "bits_per_byte", "arms": ["fim-0.5", "clm"], "expect": "equal",
        "margin": 0.1, "verdict": "not resolved",
        "paired": {"delta": 0.05, "ci95": None, "n": 1, "std": None},
    }]  # fmt: skip
    assert question_metrics(results) == ["bits_per_byte", "infill_exact_match"]
    buffer = io.StringIO()
    print_tables(results, Console(file=buffer, width=400, force_terminal=False), "runs/demo/report.md")
    text = buffer.getvalue()
    assert "(20 more metrics in runs/demo/report.md)" in text and "extra_3" not in text
    assert max(len(line) for line in text.splitlines() if "│" in line) < 120  # tables, not the sentence
    sentence = finding(results)
    assert text.rstrip().endswith(sentence)
    assert sentence == (
        "In short: the literature says 'FIM for free'; here fim-0.5 and clm differ by 0.05 in bits per byte, "
        "within the 0.1 the claim allows, but one seed cannot say how much of that is noise (run --seeds 3)."
    )
    results["claims"][0] |= {"expect": "lower", "verdict": "disagrees"}
    results["seeds"] = [0, 1, 2]
    assert finding(results).endswith(
        "here fim-0.5 scores higher bits per byte than clm (2.05 against 2), so the published finding does "
        "not hold at this scale."
    )


def _probe_arms(random_init: float | None) -> list[dict]:
    arms = []
    for name, acc in (("mlm", 0.64), ("clm", 0.60)):
        base = {} if random_init is None else {
            "probe_sst2_random_init_accuracy": {"mean": random_init, "std": 0.01, "n": 3, "ci95": 0.02},
            "probe_sst2_bow_accuracy": {"mean": 0.70, "std": 0.0, "n": 3, "ci95": 0.0},
        }  # fmt: skip
        metric = {"mean": acc, "std": 0.01, "n": 3, "ci95": 0.02}
        arms.append({"name": name, "metrics": {"probe_sst2_accuracy": metric}, "baselines": base})
    return arms


def test_a_probe_claim_is_judged_only_beyond_the_random_init_baseline() -> None:
    from objtrain.compare.results import baseline_gate
    from objtrain.report.comparison import baseline_section

    claim = {"claim": "MLM beats CLM", "metric": "probe_sst2_accuracy", "arms": ["mlm", "clm"],
             "verdict": "agrees"}  # fmt: skip
    beaten = baseline_gate(claim, _probe_arms(0.55))
    assert beaten["verdict"] == "agrees" and beaten["baseline"].startswith("every arm beats")
    # clm's 0.60 lies within random-init's 0.59 ± 0.02: the claim is not judged, and says why.
    near = baseline_gate(claim, _probe_arms(0.59))
    assert near["verdict"] == "not judged" and near["verdict_before_baseline"] == "agrees"
    assert "clm 0.6 against random-init 0.59 ± 0.02" in near["baseline"]
    assert "not judged" in verdict_cell(near)
    unknown = baseline_gate(claim, _probe_arms(None))
    assert unknown["verdict"] == "agrees" and unknown["baseline"].startswith("no random-init baseline")
    assert baseline_gate(dict(claim, metric="bits_per_byte"), _probe_arms(0.59)) == dict(
        claim, metric="bits_per_byte"
    )
    text = "\n".join(baseline_section({"arms": _probe_arms(0.59)}))
    assert "| mlm | probe_sst2_accuracy | 0.64 ± 0.02 | 0.59 ± 0.02 | 0.7 ± 0 | — | — |" in text
    assert "random-init" in text and "bag-of-words" in text


def test_plots_draw_ranked_metrics_and_probe_axes_from_chance_with_baselines() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from objtrain.report.comparison import _draw_baselines, plotted_metrics

    results = _results()
    results["arms"][0]["metrics"]["val_loss"] = _metric(3.0)  # each arm's own loss: not ranked, not drawn
    assert plotted_metrics(results) == ["bits_per_byte", "infill_exact_match"]
    arms = _probe_arms(0.55)
    for arm in arms:
        arm["baselines"]["probe_sst2_majority_accuracy"] = {"mean": 0.5, "std": 0.0, "n": 3, "ci95": 0.0}
    fig, ax = plt.subplots()
    _draw_baselines(ax, "probe_sst2_accuracy", arms)
    assert ax.get_ylim()[0] == 0.5  # from chance, not autoscaled above it
    labels = set(ax.get_legend_handles_labels()[1])
    assert labels == {"majority", "bag-of-words", "random-init"}
    plt.close(fig)


def test_a_fine_tune_claim_is_gated_by_the_random_init_fine_tune() -> None:
    from objtrain.compare.results import BASELINE, baseline_gate
    from objtrain.report.comparison import baseline_section

    arms = _probe_arms(0.59)
    for arm in arms:  # the same numbers under the fine-tune's names
        arm["metrics"] = {"finetune_sst2_accuracy": arm["metrics"]["probe_sst2_accuracy"]}
        arm["baselines"] = {
            "finetune_sst2_random_init_accuracy": arm["baselines"]["probe_sst2_random_init_accuracy"]
        }
    claim = {"claim": "MLM beats CLM after fine-tuning", "metric": "finetune_sst2_accuracy",
             "arms": ["mlm", "clm"], "verdict": "agrees"}  # fmt: skip
    near = baseline_gate(claim, arms)
    assert near["verdict"] == "not judged" and "the fine-tune does not show" in near["baseline"]
    assert "clm 0.6 against random-init 0.59 ± 0.02" in near["baseline"]
    text = "\n".join(baseline_section({"arms": arms}))
    assert "| mlm | finetune_sst2_accuracy | 0.64 ± 0.02 | 0.59 ± 0.02 | — | — | — |" in text
    assert "probed (or fine-tuned) alike" in text and "finetune_*: the whole model fine-tuned with" in text
    arms[0]["runs"] = [{"eval": {"finetune_sst2_steps": 300.0}}]
    assert "fine-tuned for 300 steps" in "\n".join(baseline_section({"arms": arms}))
    assert "peak learning rates" not in "\n".join(baseline_section({"arms": arms}))  # one rate, from before
    # Several rates: how many, and which won how often (a winner at an end says the list should widen).
    tuned = {"finetune_sst2_steps": 300.0, "finetune_sst2_lrs_tried": 4.0, "finetune_sst2_lrs_diverged": 0.0}
    arms[0]["runs"] = [{"eval": {**tuned, "finetune_sst2_lr": lr}} for lr in (1e-3, 3e-3, 1e-3)]
    text = "\n".join(baseline_section({"arms": arms}))
    assert "at each of 4 peak learning rates (the rate best on dev: 0.001 in 2 runs, 0.003 in 1 run)" in text
    assert "the fine-tune's own noise is not measured apart" in text
    # Rates chosen on the first seed only: the choices counted are the first seed's, the rest said.
    fixed = {**tuned, "finetune_sst2_lrs_tried": 1.0}
    runs = [{**tuned, "finetune_sst2_lr": 3e-3, "finetune_sst2_random_init_lr": 1e-3}]
    runs += [{**fixed, "finetune_sst2_lr": 3e-3, "finetune_sst2_random_init_lr": 1e-3}] * 2
    arms[0]["runs"] = [{"eval": e} for e in runs]
    text = "\n".join(baseline_section({"arms": arms}))
    assert (
        "at each of 4 peak learning rates on each arm's first seed (the rate best on dev: 0.003 in 1 run); "
        "the other 2 runs, and their random-init twins, at the rate their first seed's run (or twin) chose"
    ) in text
    arms[0]["runs"] = [{"eval": {**tuned, "finetune_sst2_lr": lr}} for lr in (1e-3, 3e-3, 1e-3)]
    # Its own noise measured on the first seed's checkpoint: in the own-seed-sd column, and said.
    arms[0]["baselines"]["finetune_sst2_accuracy_tune_sd"] = {
        "mean": 0.012,
        "std": None,
        "n": 1,
        "ci95": None,
    }
    arms[0]["runs"][0]["eval"]["finetune_sst2_seeds"] = 3.0
    text = "\n".join(baseline_section({"arms": arms}))
    assert "| mlm | finetune_sst2_accuracy | 0.64 ± 0.02 | 0.59 ± 0.02 | — | — | 0.012 |" in text
    assert (
        "measured apart on 1 checkpoint(s) (each arm's first seed): 3 fine-tunes at the rate chosen" in text
    )
    assert BASELINE.match("finetune_sst2_accuracy_tune_sd")
    # the fine-tune's majority class and random init sit beside it as baselines, not as arms' metrics
    assert BASELINE.match("finetune_sst2_random_init_accuracy") and BASELINE.match(
        "finetune_majority_accuracy"
    )


def _seeded(
    values: dict[str, list[float]], metric: str = "conditional_bpb", eval_se: float | None = None
) -> dict:
    """Results of two decoder arms over seeds 0..K-1 on one metric, ranked as `build_results` ranks."""
    from objtrain.compare.results import ranking_entry
    from objtrain.stats.seeds import summarise

    results = _results()
    results["seeds"] = list(range(len(next(iter(values.values())))))
    for arm in results["arms"]:
        vals = values[arm["name"]]
        arm["metrics"] = {metric: summarise(vals).to_dict()}
        arm["runs"] = [{"seed": k, "eval": {metric: v}, "train": {}} for k, v in enumerate(vals)]
    per_seed = {name: dict(enumerate(vals)) for name, vals in values.items()}
    summaries = {name: summarise(vals) for name, vals in values.items()}
    entry = ranking_entry(metric, summaries, True, per_seed)
    assert entry is not None
    if eval_se is not None:
        for gap in entry["gaps"].values():
            gap["eval_se"] = eval_se
    results["rankings"] = {metric: entry}
    results["unranked"] = {}
    return results


def test_a_gap_the_seeds_resolve_is_a_win_and_one_they_do_not_is_not() -> None:
    resolved = _seeded({"clm": [2.00, 2.01, 2.02], "fim-0.5": [2.30, 2.31, 2.33]})
    assert finding(resolved) == (
        "In short: of the 2 arms, clm did best on conditional bpb, resolved at 3 seeds."
    )
    assert verdict(resolved)[0].startswith("conditional_bpb (lower is better): clm best at 2.01; fim-0.5")
    # clm ahead by 0.27 on average, but the per-seed gaps swing: a paired interval that includes 0
    straddling = _seeded({"clm": [2.90, 2.88], "fim-0.5": [3.10, 3.21]})
    sentence = finding(straddling)
    assert "did best" not in sentence
    assert sentence.startswith("In short: clm is ahead of fim-0.5 on conditional bpb (2.890 against 3.155)")
    assert "not resolved at 2 seeds: +0.265 ±" in sentence and "from the seeds' spread" in sentence
    line = verdict(straddling)[0]
    assert "clm ahead at 2.89" in line and "not resolved at 2 seeds" in line and "per-seed gaps vary" in line


def test_an_unresolved_gap_says_which_noise_keeps_it_open() -> None:
    """The reason given is the true one: the seeds' spread, the evaluation's own noise, or both."""
    from objtrain.report.comparison import gap_status

    seeds_agree = _seeded({"clm": [2.00, 2.01, 2.02], "fim-0.5": [2.05, 2.06, 2.07]}, eval_se=0.04)
    status = gap_status(seeds_agree["rankings"]["conditional_bpb"], "fim-0.5")
    assert status is not None and status["short"] == "the evaluation's own noise"
    both = _seeded({"clm": [2.90, 2.88], "fim-0.5": [3.10, 3.21]}, eval_se=0.2)
    status = gap_status(both["rankings"]["conditional_bpb"], "fim-0.5")
    assert status is not None and status["short"].startswith("both")
    small_se = _seeded({"clm": [2.90, 2.88], "fim-0.5": [3.10, 3.21]}, eval_se=0.01)
    status = gap_status(small_se["rankings"]["conditional_bpb"], "fim-0.5")
    assert status is not None and status["short"] == "the seeds' spread" and "is smaller" in status["why"]


def test_a_probe_at_its_random_init_baseline_is_listed_not_ranked() -> None:
    from objtrain.compare.results import screened

    results = _results()
    results["rankings"]["probe_accuracy"] = {"lower_is_better": False, "best": "clm", "tie": False,
                                             "within_seed_spread": [], "gaps": {}}  # fmt: skip
    for arm, acc, base in ((results["arms"][0], 0.4545, 0.483), (results["arms"][1], 0.43, 0.523)):
        arm["metrics"]["probe_accuracy"] = _metric(acc)
        arm["baselines"] = {"probe_random_init_accuracy": {"mean": base, "std": None, "n": 1, "ci95": None}}
    s = screened(results)
    assert "probe_accuracy" not in s["rankings"] and set(s["unranked"]["probe_accuracy"]) == {
        "clm",
        "fim-0.5",
    }
    line = next(x for x in verdict(results) if x.startswith("probe_accuracy"))
    assert "best" not in line
    assert line == (
        "probe_accuracy: not ranked: clm 0.4545 at its random-init baseline (0.483 ± 0); fim-0.5 0.43 at its "
        "random-init baseline (0.523 ± 0)"
    )


def test_a_left_to_right_score_ranks_only_the_arms_that_read_left_to_right() -> None:
    from objtrain.compare.results import screened

    results = _results()
    results["arms"][1]["model_kind"] = "encdec"
    s = screened(results)
    assert "bits_per_byte" not in s["rankings"]
    assert s["unranked"]["bits_per_byte"] == {"fim-0.5": "(an encoder-decoder does not read left to right)"}
    assert "infill_exact_match" in s["rankings"]  # every kind infills


def test_a_direction_against_the_literature_is_said_with_its_size() -> None:
    """The demo's middle_bpb: FIM's middle costs more than CLM's at one seed, many evaluation standard
    errors the other way; the verdict says so at one precision for both arms."""
    results = _results()
    results["arms"][0]["metrics"]["middle_bpb"] = _metric(2.2)
    results["arms"][1]["metrics"]["middle_bpb"] = _metric(2.3174)
    results["claims"] = [{
        "claim": "the suffix helps", "metric": "middle_bpb", "arms": ["fim-0.5", "clm"], "expect": "lower",
        "margin": 0.0, "verdict": "not resolved", "eval_se": 0.0175,
        "paired": {"delta": 0.1174, "ci95": None, "n": 1, "std": None},
    }]  # fmt: skip
    line = next(x for x in verdict(results) if x.startswith("claim:"))
    assert "fim-0.5 2.317 against clm 2.200" in line
    assert "middle_bpb: fim-0.5 − clm = +0.117 (one seed)" in line
    assert "measured the other way from the literature, 6.7 evaluation standard errors" in line


def test_the_validation_plots_draw_every_arm_and_say_which_lack_a_left_to_right_loss() -> None:
    from objtrain.report.comparison import val_series

    def records(loss: float, bpb: float | None) -> list[dict]:
        return [{"tokens": t, "wall_time": t / 10, "val_loss": loss - t / 1e3} | ({} if bpb is None else
                {"val_bpb": bpb - t / 1e3}) for t in (100, 200)]  # fmt: skip

    data = {"clm": [records(5.0, 3.0), records(5.1, 3.1)], "span": [records(4.0, None), records(4.2, None)]}
    keys, series, missing = val_series(data, _results(), "tokens")
    assert keys == ["val_loss", "val_bpb"]
    assert (
        set(series["val_loss"]) == {"clm", "span"} and len(series["val_loss"]["span"]) == 2
    )  # a line a seed
    assert set(series["val_bpb"]) == {"clm"} and missing == {"val_loss": [], "val_bpb": ["span"]}


def test_the_metric_plot_clips_each_interval_to_the_metric_range() -> None:
    from objtrain.report.comparison import metric_bars, metric_limits, metric_range

    results = _results()
    results["arms"][0]["metrics"]["infill_parse_rate"] = {"mean": 0.25, "std": 0.35, "n": 2, "ci95": 3.2}
    results["arms"][0]["runs"] = [{"eval": {"infill_parse_rate": v}, "train": {}} for v in (0.0, 0.5)]
    results["arms"][1]["metrics"]["perplexity"] = {"mean": 3.0, "std": 1.0, "n": 2, "ci95": 9.0}
    assert metric_range("infill_parse_rate") == (0.0, 1.0) and metric_range("suffix_gain")[0] < -1e300
    (bar,) = metric_bars(results, "infill_parse_rate")
    assert (bar["low"], bar["high"]) == (0.0, 1.0) and bar["seeds"] == [0.0, 0.5]
    (bar,) = metric_bars(results, "perplexity")
    assert bar["low"] == 0.0 and bar["high"] == 12.0
    # two arms 0.6% apart with no interval do not fill the panel: the axis is a tenth of the value wide
    bars = [{"arm": "a", "mean": 2.0, "low": 2.0, "high": 2.0, "seeds": []},
            {"arm": "b", "mean": 2.012, "low": 2.012, "high": 2.012, "seeds": []}]  # fmt: skip
    lo, hi = metric_limits("bits_per_byte", bars, [])
    assert hi - lo > 0.2 and lo >= 0.0


def test_a_withdrawn_claim_is_named_with_its_reason_in_the_report_and_on_the_screen() -> None:
    results = _results()
    results["experiment"]["withdrawn"] = [
        {"claim": "CLM continues a document better", "reason": "the measure scored a layout it never saw"}
    ]
    text = markdown(results, [])
    assert "## Claims withdrawn" in text
    assert "- **CLM continues a document better**: the measure scored a layout it never saw" in text
    buffer = io.StringIO()
    print_tables(results, Console(file=buffer, width=200, force_terminal=False))
    assert "withdrawn (1, reasons in report.md): CLM continues a document better" in buffer.getvalue()
    del results["experiment"]["withdrawn"]
    assert "withdrawn" not in markdown(results, []).lower()


def test_a_conditional_score_in_a_layout_never_trained_on_is_not_ranked_beside_the_others() -> None:
    from objtrain.evaluation.conditional import MODE_NOTES

    results = _results()
    for arm, mode, bpb in zip(results["arms"], ("causal", "sentinel"), (2.4, 3.5), strict=True):
        arm["metrics"] = {"conditional_bpb": _metric(bpb)}
        arm["runs"][0]["eval"] = {"conditional_mode": MODE_NOTES[mode], "conditional_bpb": bpb}
    results["rankings"] = {
        "conditional_bpb": {"lower_is_better": True, "best": "clm", "within_seed_spread": [], "gaps": {}}
    }
    line = verdict(results)[0]
    assert (
        "not ranked: fim-0.5 3.5 (scored as one long span, a layout its objective never trained on)" in line
    )
    both = _results()  # every arm in the same layout: compared with each other as before
    for arm, bpb in zip(both["arms"], (2.4, 3.5), strict=True):
        arm["metrics"] = {"conditional_bpb": _metric(bpb)}
        arm["runs"][0]["eval"] = {"conditional_mode": MODE_NOTES["sentinel"], "conditional_bpb": bpb}
    both["rankings"] = results["rankings"]
    assert "not ranked" not in verdict(both)[0] and "fim-0.5 3.5" in verdict(both)[0]
