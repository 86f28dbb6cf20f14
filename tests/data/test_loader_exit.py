"""A process that drops a loader with workers still running (an error mid-iteration, the iterator kept
alive by its traceback) still exits: its workers ignore SIGTERM, which multiprocessing's exit handler sends
them before joining them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

_LEAVE_A_WORKER_RUNNING = """
import numpy as np
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials
from objtrain.data.loader import CorruptedRows, RowSampler, make_loader, received
from objtrain.data.stream import Documents, DocumentStream, Position

sp = Specials()
ids = (np.arange(20_000) % 200 + sp.first_ordinary).astype(np.int64)
stream = DocumentStream(Documents(ids, np.array([0, 10_000, 20_000])), sp.eos, sp.pad, seed=0)
clm = build_objective("clm", sp, None, "decoder")
sampler = RowSampler(clm, 63, 0, 2, 2, 0, 1, Position(0, (0,)), 0, 50, stream=stream)
batches = received(iter(make_loader(CorruptedRows(stream, clm, 63, 0), sampler, workers=1)))
next(batches)
KEPT = batches  # alive until exit, its worker with it
print("read one batch", flush=True)
"""


def test_a_process_with_a_loader_worker_left_running_exits() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEAVE_A_WORKER_RUNNING],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the process did not exit: it waits on its loader worker")
    assert proc.returncode == 0 and b"read one batch" in out, err.decode()[-800:]
