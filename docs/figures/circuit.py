"""Draw docs/figures/circuit.png: the circuit of one pair of the demo data over the
TransformerLens blocks, with ``exactformer.tools.circuit_plot`` (``plot --explain``). Run from
the repository root:

    .venv/bin/python docs/figures/circuit.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
import exactformer as ef  # noqa: E402
from exactformer.data import builtin  # noqa: E402
from exactformer.tools.circuit_plot import plot_circuit  # noqa: E402

if __name__ == "__main__":
    data = builtin.demo()
    plot_circuit(ef.compile(data), data, Path(__file__).with_suffix(".png"), pair=3)
