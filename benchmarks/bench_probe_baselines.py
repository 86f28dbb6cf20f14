"""Probe baselines shared across a comparison's arms: a second arm's probe against the first's.

Every probe reports two baselines beside the model: a bag-of-words logistic regression on the same
examples and the same architecture at random init. Neither follows from the model's weights, so the arms
of a comparison (one tokenizer; one architecture and training seed per seed) share them, and `objtrain
eval` fits each once a process (`evaluation.suite._BASELINES`). Here two tiny encoders with the same
architecture and training seed but different weights (two "arms") are probed on SST-2 from
`../shared/data` (skipped with a message when absent), round by round: the first with no baselines kept
(what every arm paid before), the second reusing them. The second arm's baselines must equal a fresh fit's.

    .venv/bin/python benchmarks/bench_probe_baselines.py
    .venv/bin/python benchmarks/bench_probe_baselines.py --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from objtrain.__main__ import openmp_defaults, other_work

openmp_defaults(others=other_work())  # as `objtrain eval` waits, chosen before torch loads OpenMP

import torch  # noqa: E402

from objtrain.data.default import default_store  # noqa: E402
from objtrain.data.store import TokenStore  # noqa: E402
from objtrain.evaluation import suite  # noqa: E402
from objtrain.models import build_model, model_config  # noqa: E402
from objtrain.models.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
BASELINES = ("probe_sst2_bow_accuracy", "probe_sst2_random_init_accuracy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data", type=Path, default=SHARED, help="folder with sst2/ (the shared corpora)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.data / "sst2").is_dir():
        print(f"skipped: no SST-2 under {args.data} (the shared corpora are not beside this checkout)")
        return 0
    store = TokenStore.open(default_store())
    tokenizer = store.tokenizer
    options = suite.EvalOptions(seed=0, probe_tasks=("sst2",), probe_data=args.data)
    with tempfile.TemporaryDirectory() as tmp:
        arms = []
        for k in range(2):
            torch.manual_seed(k)  # other weights; the recorded training seed is the same
            model = build_model(model_config("encoder", "tiny", vocab_size=tokenizer.vocab_size))
            path = save_checkpoint(Path(tmp) / f"arm{k}", model, tokenizer.specials, tokenizer,
                                   training={"objective": "mlm", "seq_len": 128, "seed": 0})  # fmt: skip
            arms.append(load_checkpoint(path))
        for ckpt in arms:
            ckpt.model.eval()

        def probed(k: int) -> tuple[float, dict]:
            t0 = time.perf_counter()
            out = suite._probe(arms[k], options, 128, torch.device("cpu"))
            return time.perf_counter() - t0, out

        first, second = [], []
        for _ in range(args.rounds):
            suite._BASELINES.clear()
            took, _ = probed(0)
            first.append(took)
            took, shared = probed(1)
            second.append(took)
        suite._BASELINES.clear()
        _, alone = probed(1)
        same = all(shared[k] == alone[k] for k in BASELINES)
    a, b = statistics.median(first), statistics.median(second)
    threads = torch.get_num_threads()
    print(f"SST-2 probe of a tiny encoder, {args.rounds} round(s), medians on {threads} thread(s)")
    print(f"  first arm (fits its baselines):   {a:7.1f} s")
    print(f"  second arm (baselines kept):      {b:7.1f} s   x{a / b:.2f} faster")
    print(f"  second arm's baselines equal a fresh fit's: {same}")
    if args.json:
        args.json.write_text(json.dumps({"first_s": a, "second_s": b, "speedup": a / b, "equal": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
