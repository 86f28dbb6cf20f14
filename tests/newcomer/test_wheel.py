"""A wheel installed apart from the source tree runs `corrupt` and `generate` from another directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from objtrain.data.tokenizer import Tokenizer
from objtrain.models.checkpoint import save_checkpoint
from objtrain.models.zoo import build_model, model_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_runs_from_anywhere(tmp_path: Path, small_store: Path, tokenizer: Tokenizer) -> None:
    wheels, site, elsewhere = tmp_path / "wheel", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(ROOT), "-w", str(wheels)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr
    wheel = next(wheels.glob("objtrain-*.whl"))
    done = subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (site / "objtrain" / "configs" / "objectives" / "span.yaml").is_file()

    torch.manual_seed(0)
    model = build_model(model_config("decoder", "debug", vocab_size=tokenizer.vocab_size))
    ckpt = save_checkpoint(tmp_path / "ckpt", model, tokenizer.specials, tokenizer, {"objective": "clm"})
    # Only the installed copy is importable: the source tree is neither the cwd nor on the path.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OBJTRAIN_CONFIGS")}
    env["PYTHONPATH"] = str(site)
    runs = {
        "where": ["-c", "import objtrain; print(objtrain.__file__)"],
        "list": ["-m", "objtrain", "corrupt", "--list"],
        "corrupt": ["-m", "objtrain", "corrupt", "--text", "def f(x):\n    return x + 1\n", "--tokenizer",
                    str(small_store), "--objective", "span", "--n", "1"],
        "generate": ["-m", "objtrain", "generate", str(ckpt), "--prompt", "def ", "-n", "4",
                     "--format", "json"],
    }  # fmt: skip
    out = {}
    for name, args in runs.items():
        # -I would drop PYTHONPATH; -P keeps the cwd off sys.path where available (3.11+).
        flags = ["-P"] if sys.version_info >= (3, 11) else []
        done = subprocess.run([sys.executable, *flags, *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, (name, done.stderr)
        out[name] = done.stdout
    assert out["where"].strip().startswith(str(site))
    assert "config not found" not in out["list"] and "span" in out["list"]
    assert '"mode": "continue"' in out["generate"]
