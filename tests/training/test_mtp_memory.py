"""MTP's sequential backward: a step's peak memory does not grow with the number of heads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# One training step's peak resident memory over the resident size before it (VmHWM, reset through
# clear_refs), at a vocabulary where the (B, T, V) logits dominate: 2 x 512 x 32000 floats = 125 MiB.
SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from objtrain.models.zoo import build_model, model_config
    from objtrain.objectives.registry import build_objective
    from objtrain.specials import Specials
    from objtrain.training.loop import forward_backward

    heads = int(sys.argv[1])
    torch.manual_seed(0)
    specials = Specials()
    objective = build_objective("mtp", specials, None, "decoder", {"n": heads})
    model = build_model(model_config("decoder", "debug", {"mtp_heads": heads}, vocab_size=32000)).train()
    rows = torch.randint(specials.first_ordinary, 32000, (2, 513))
    batch = objective(rows, torch.zeros_like(rows), torch.arange(2), 0)

    def kib(field):
        return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1])

    def step():
        scale = 1 / float(batch.n_targets)
        forward_backward(model, objective, batch, scale, torch.device("cpu"), "fp32", None)
        model.zero_grad(set_to_none=True)

    step()
    before = kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    step()
    print(kib("VmHWM") - before)
    """
)


def _step_peak_kib(heads: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(heads)], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc peak-RSS reset")
def test_four_heads_step_peak_is_one_heads() -> None:
    one, four = _step_peak_kib(1), _step_peak_kib(4)  # 1 head: the plain joint path; 4: the sequential one
    assert one > 250 * 1024  # logits, log-softmax and their gradients: the measurement sees them
    assert four <= 1.1 * one  # no head holds its logits through its backward (1.35x when one did)
