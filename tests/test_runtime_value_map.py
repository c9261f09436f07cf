"""The attention's value map in the runtime proofs (docs/numerics.md#proofs-for-reduced-
precision-runtimes) as each layout computes it, checked by evaluations of the test's own.

* The ρ/η and TransformerLens exports store the dense V = β·I + p·qᵀ formed from the model's
  own parameters and converted once, which need not be β·I + p·qᵀ of the stored factors that
  the torch module reads: a proof may not call the value exact on the factors alone."""

from __future__ import annotations

import numpy as np
import pytest

import exactformer as ef
from exactformer.model import SA, Block, ScoreMatrix, Transformer, ValueMatrix
from exactformer.verification import prove_runtime

TOL = 1e-5


def _one_head(p, q) -> Transformer:
    """d = 2, one hardmax head with equal scores (every key a candidate), ρ = β = 0,
    V = p·qᵀ: the output is V times the keys' average."""
    sa = SA(0.0, ScoreMatrix(0.0, np.zeros(2), np.zeros(2)),
            ValueMatrix(0.0, np.asarray(p, dtype=float), np.asarray(q, dtype=float)))
    return Transformer(2, "hardmax", [Block(None, sa)], exact=False)


def _error(out: np.ndarray, target: np.ndarray) -> float:
    """Largest distance of an output row from the one target row, over the target's scale."""
    return float(np.abs(out - target).max() / np.abs(target).max())


def test_dense_value_matrix_of_the_exports_is_not_the_product_of_stored_factors():
    torch = pytest.importorskip("torch")
    from exactformer.export.rho_eta import to_rho_eta

    # p stores in bfloat16 as 1 (its offset is below half a unit), q = 1.75 exactly: the
    # torch module computes 1·1.75 = 1.75, but the exports' V = p·q = 1.7558… rounds up to
    # 1.7578125, one bfloat16 unit above
    p0 = 1 + 2.0 ** -8 - 2.0 ** -12
    model = _one_head([p0, 0.0], [1.75, 0.0])
    x, y = np.array([[1.0, 0.0]]), np.array([[1.75, 0.0]])
    data = ef.Dataset.from_arrays([x], [y])
    stored_v = float(torch.tensor(p0 * 1.75, dtype=torch.float64).to(torch.bfloat16).float())
    assert stored_v == 1.7578125
    module = to_rho_eta(model, dtype=torch.bfloat16)
    with torch.no_grad():
        out = module(torch.tensor(x[None], dtype=torch.bfloat16))[0].double().numpy()
    assert _error(out, y) > TOL  # the exported layout misses the tolerance
    assert not prove_runtime(model, data, "bfloat16").ok
