"""The process pool of a parallel exact pass ends with the process that started it.

A verify stopped by SIGTERM must not leave workers running (reparented, holding the caller's
pipe open): the CLI turns SIGTERM into SystemExit, on which leaving the pool terminates its
workers, and a parent killed outright takes its workers with it (docs/verification.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

# A parallel exact pass whose chunks never finish: each worker reports its pid and sleeps.
SCRIPT = r"""
import os, sys, time
import exactformer as ef
from exactformer.data import builtin
from exactformer.evaluate import jobs
from exactformer.modelio import atomic_path

def stuck(bounds):
    os.write(1, f"worker {os.getpid()}\n".encode())  # one write: lines never interleave
    time.sleep(300)

jobs._run_chunk = stuck
jobs.PARALLEL_MIN_WORK = 0
data = builtin.shared_pool(N=6, d=3, pool=5, n_max=4, m_max=2, seed=0)
model = ef.compile(data)
if sys.argv[1] == "cli":  # SIGTERM raises SystemExit, as in every CLI command that writes
    with atomic_path(sys.argv[2]):
        ef.forward(model, data.fractions()[0], "exact", workers=2)
else:
    ef.forward(model, data.fractions()[0], "exact", workers=2)
"""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")
@pytest.mark.parametrize("mode", ["cli", "plain"])
def test_sigterm_ends_the_pool_workers(tmp_path, mode):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode, str(tmp_path / "out.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})
    lines = [proc.stdout.readline() for _ in range(2)]
    if not all(lines):
        proc.kill()
        pytest.fail(f"the pass did not start its workers: {proc.communicate()[1]}")
    assert all(len(line.split()) == 2 for line in lines), lines
    workers = [int(line.split()[1]) for line in lines]
    assert all(alive(pid) for pid in workers)
    proc.send_signal(signal.SIGTERM)
    # the pipe reaches end of file only when no worker holds it open any more
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), err
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)
    assert not list(tmp_path.iterdir())
