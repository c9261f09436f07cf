"""Runtime proofs where an intermediate of some evaluation may overflow although the exact
values it leads to are moderate: inf − inf and 0·inf are nan, which no box contains
(docs/numerics.md#proofs-for-reduced-precision-runtimes). Each model here is proved by none
of the runtimes it would break in."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import exactformer as ef
from exactformer.data import builtin
from exactformer.model import FF, SA, Block, Head, ScoreMatrix, Transformer, ValueMatrix


def test_an_off_unit_whose_float32_sums_overflow_is_not_passed_over():
    """A residual FF's unit is far below 0 exactly (2·x − 4·x = −4·10³⁸), but its float32
    products overflow to +inf and −inf: the runtime's pre-activation is nan and relu(nan)
    reaches the output through W. The coarse 'every unit off' shortcut must not pass the row."""
    ff = FF(1.0, np.array([[2.0, -4.0]]), np.array([0.0]), np.array([[1.0], [0.0]]))
    model = Transformer(2, "hardmax", [Block(ff, None)], exact=False)
    X = [[[2e38, 2e38], [1.0, 1.0]]]
    data = ef.Dataset.from_arrays(X, X)
    with np.errstate(all="ignore"):
        z = np.float32(2e38) * np.float32(2) + np.float32(2e38) * np.float32(-4)
    assert np.isnan(z)  # what every float32 evaluation of the unit computes
    assert not ef.prove_runtime(model, data, "float32").ok



def test_a_unit_whose_sums_overflow_makes_its_whole_row_nan_whatever_w_writes():
    """The same unit with W = 0: every column is x + 0·relu(nan), and 0·nan is nan, so no
    column of the row is x + 0 (neither a column no unit writes, left out of the residual
    FF's work, nor one no unit that may be on writes). The row must be unknown."""
    ff = FF(1.0, np.array([[2.0, -4.0, 0.0]]), np.array([0.0]), np.zeros((3, 1)))
    model = Transformer(3, "hardmax", [Block(ff, None)], exact=False)
    X = [[[2e38, 2e38, 0.0], [1.0, 1.0, 0.0]]]
    data = ef.Dataset.from_arrays(X, X)
    x = np.array(X[0], dtype=np.float32)
    with np.errstate(all="ignore"):  # the test's own float32 evaluation of the dense graph
        z = x[:, :1] * np.float32(2) + x[:, 1:2] * np.float32(-4)
        y = x + np.where(np.isnan(z), z, np.maximum(z, 0)) * np.float32(0)
    assert np.isnan(y[0]).all()
    assert not ef.prove_runtime(model, data, "float32").ok

def _one_head(alpha, a, c, beta, p, q, rho=0.0):
    head = SA(rho, ScoreMatrix(alpha, np.array(a), np.array(c)),
              ValueMatrix(beta, np.array(p), np.array(q)))
    return Transformer(len(a), "hardmax", [Block(None, head)], exact=False)


def test_the_value_maps_intermediates_may_not_overflow():
    """Each layout's value map has an intermediate that θ·M does not bound: the ρ/η layout's
    V·x_l on a key of weight 0 (0·inf = nan), the torch module's q·y before p scales it
    down, a dense V entry beyond the format. None of these models may be proved."""
    # ρ/η: V·x_2 = 4·1e38 overflows, and the hardmax weight 0 of key 2 makes it nan
    rho_eta = _one_head(0.0, [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], 4.0, [0.0] * 3, [0.0] * 3)
    data = ef.Dataset.from_arrays([[[1.0, 1.0, 1.0], [1e38, 0.0, 1.0]]], [[[4.0, 4.0, 4.0]]])
    assert not ef.prove_runtime(rho_eta, data, "float32").ok
    big = 2.0 ** 30  # torch: q·y = 2^130 overflows, p·(q·y) would be 2^20
    torch_qy = _one_head(0.0, [1.0, 0.0], [1.0, 0.0], 0.0, [2.0 ** -110, 0.0], [2.0 ** 100, 0.0])
    data = ef.Dataset.from_arrays([[[big, 1.0]]], [[[2.0 ** 20, 0.0]]])
    assert not ef.prove_runtime(torch_qy, data, "float32").ok
    # float16: q·y = 2^4·8000 = 128 000 is beyond 65 504
    torch_qy = _one_head(0.0, [1.0, 0.0], [1.0, 0.0], 0.0, [2.0 ** -10, 0.0], [2.0 ** 4, 0.0])
    data = ef.Dataset.from_arrays([[[8000.0, 1.0]]], [[[125.0, 0.0]]])
    assert not ef.prove_runtime(torch_qy, data, "float16").ok
    # a dense V entry p·q = 2^200 is inf in float32 though p·(q·y) = 2^80 is not
    dense_v = _one_head(0.0, [1.0, 0.0], [1.0, 0.0], 0.0, [2.0 ** 100, 0.0], [2.0 ** 100, 0.0])
    data = ef.Dataset.from_arrays([[[2.0 ** -120, 1.0]]], [[[2.0 ** 80, 0.0]]])
    assert not ef.prove_runtime(dense_v, data, "float32").ok


def test_a_score_that_may_overflow_loses_its_row():
    """c·x = 2^130 overflows float32, so the only key's score is inf·0 = nan: torch's max of
    the row is nan and so is every weight. One candidate is not 'weight exactly 1' then."""
    model = _one_head(0.0, [0.0, 1.0], [2.0 ** 100, 0.0], 1.0, [0.0, 0.0], [0.0, 0.0])
    x = [2.0 ** 30, 0.0]
    data = ef.Dataset.from_arrays([[x]], [[x]])
    assert not ef.prove_runtime(model, data, "float32").ok
    softmax = Transformer(2, "softmax", model.blocks, exact=False)
    assert not ef.prove_runtime(softmax, data, "float32").ok


def test_the_torch_modules_gram_may_not_overflow():
    """α = −2^−100 makes every score moderate, but the torch module forms ⟨x_i, x_l⟩ before
    scaling it: ⟨x_1, x_1⟩ = 2^128 is inf in float32, α·inf = −inf, and query 1 takes key 2
    instead of key 1. (Keyed models of data at 1e20 have such heads.)"""
    model = _one_head(-2.0 ** -100, [0.0, -1.0], [2.0 ** -60, 0.0], 1.0, [0.0, 0.0],
                      [0.0, 0.0])
    x1, x2 = [2.0 ** 64, 0.0], [1.0, 2.0 ** 30]
    data = ef.Dataset.from_arrays([[x1, x2]], [[x1]])
    assert not ef.prove_runtime(model, data, "float32").ok


def test_an_underflowed_intermediate_scaled_up_is_not_exact():
    """The terms V_cj·π_l·x_lj = 2^27·9·2^−50 are normal, but the torch module's q·y =
    9·2^−150 is subnormal in float32 (rounded to 2^−147) before p = 2^127 scales it back:
    the output is 2^−20, not 9·2^−23."""
    model = _one_head(0.0, [0.0, 0.0], [0.0, 0.0], 0.0, [2.0 ** 127, 0.0], [2.0 ** -100, 0.0])
    x = [9 * 2.0 ** -50, 0.0]
    data = ef.Dataset.from_arrays([[x]], [[[9 * 2.0 ** -23, 0.0]]])
    with np.errstate(under="ignore"):
        qy = np.float32(2.0 ** -100) * np.float32(x[0])
    assert np.float32(2.0 ** 127) * qy == np.float32(2.0 ** -20)
    assert not ef.prove_runtime(model, data, "float32").ok
    # the average itself: ½·2^−149 is 0 in float32, and p = 2^100 reads it (tie of 2 keys)
    model = _one_head(0.0, [0.0, 0.0], [0.0, 0.0], 0.0, [2.0 ** 100, 0.0], [1.0, 0.0])
    X = [[2.0 ** -149, 0.0], [0.0, 2.0 ** -140]]
    data = ef.Dataset.from_arrays([X], [[[2.0 ** -50, 0.0]]])
    assert not ef.prove_runtime(model, data, "float32").ok


def test_transformer_lens_scaled_hardmax_scores_may_not_overflow():
    """TransformerLens runs hardmax as softmax of the scores times 2^k (2^k·g = 2^64): the
    scores 2^80 and 2^79 are moderate in float32, but 2^144 is inf and its softmax nan."""
    model = _one_head(1.0, [0.0, 0.0], [0.0, 0.0], 1.0, [0.0, 0.0], [0.0, 0.0])
    xa, xb = [2.0 ** 40, 0.0], [2.0 ** 39, 0.0]
    data = ef.Dataset.from_arrays([[xa, xb]], [[xa]])
    assert not ef.prove_runtime(model, data, "float32").ok


def test_transformer_lens_softmax_queries_may_not_overflow_where_the_key_is_zero():
    """TransformerLens stores a softmax head's query s·c·x_i (s = 2 or 4, its attn_scale s·τ
    then divides the scores): c·x = 1.5·10³⁸ is moderate, 4·c·x is inf, and inf times the key
    a·x = 0 is nan. The scores' size |c·x|·|a·x| is 0 there, so only the query itself tells;
    the row must be unknown. Run here with the exported TransformerLens weights."""
    from exactformer.export.transformer_lens import lens_config, lens_state_dict
    from exactformer.verification.formats import get_format
    from exactformer.verification.runtime_proof import enclose_runtime

    e0, e1 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    head = Head(ScoreMatrix(0.0, e1, e0), ValueMatrix(0.0, e1, e1))
    model = Transformer(2, "softmax", [Block(None, SA(1.0, heads=[head]))], exact=False,
                        tau=0.5)
    x = np.array([[1.5e38, 0.0], [1.0, 0.0]])
    cfg, sd = lens_config(model, "float32"), lens_state_dict(model, "float32")
    W = {n: sd[f"blocks.0.attn.{n}.weight"].numpy() for n in "qkv"}
    with np.errstate(all="ignore"):
        X = x.astype(np.float32)
        q, k = X @ W["q"].T, X @ W["k"].T
        S = (q @ k.T) / np.float32(cfg["attn_scale"])
    assert np.isinf(q).any() and np.isnan(S[0]).all()  # what TransformerLens computes
    ((m, r),) = enclose_runtime(model, [x], get_format("float32"))
    assert np.isinf(r[0]).all()
    data = ef.Dataset.from_arrays([x.tolist()], [x.tolist()])
    assert not ef.prove_runtime(model, data, "float32").ok


def test_a_layer_the_transformer_lens_layout_drops_does_not_set_its_hardmax_scale():
    """The TL layout drops an attention that changes nothing (ρ = 1, V = 0), so its hardmax
    scale 2^k comes from the other heads: α = 1 gives 2^64, and the scores 2^66 times it
    overflow (inf − inf is nan). A dropped head with α = 2^60 must not lower the scale the
    proof assumes (it once did, and the model was PROVED FAITHFUL IN float32)."""
    from exactformer.export.transformer_lens import lens_config, lens_state_dict

    zero = np.zeros(2)
    real = SA(1.0, ScoreMatrix(1.0, zero, zero), ValueMatrix(1.0, zero, zero))
    dropped = SA(1.0, ScoreMatrix(2.0 ** 60, zero, zero), ValueMatrix(0.0, zero, zero))
    model = Transformer(2, "hardmax", [Block(None, real), Block(None, dropped)], exact=False)
    x = np.array([[2.0 ** 33, 0.0], [0.0, 2.0 ** 33]])
    cfg, sd = lens_config(model, "float32"), lens_state_dict(model, "float32")
    assert cfg["n_layers"] == 1
    W = {n: sd[f"blocks.0.attn.{n}.weight"].numpy() for n in "qk"}
    with np.errstate(all="ignore"):
        X = x.astype(np.float32)
        S = ((X @ W["q"].T) @ (X @ W["k"].T).T) / np.float32(cfg["attn_scale"])
    assert np.isinf(S).any()  # what TransformerLens computes before its softmax
    data = ef.Dataset.from_arrays([x.tolist()], [(2 * x).tolist()])
    assert not ef.prove_runtime(model, data, "float32").ok


def test_an_infinite_weight_or_tolerance_is_refused_or_never_proved():
    """A model with an infinite score weight is never proved (and does not crash), and an
    infinite tolerance is refused like a nonpositive one."""
    from exactformer.verification import prove_runtime

    data = builtin.demo()
    model = ef.compile(data, exact=False)
    with pytest.raises(ValueError, match="positive and finite"):
        prove_runtime(model, data, "float32", tolerance=float("inf"))
    i = next(i for i, b in enumerate(model.blocks) if b.sa is not None and b.sa.heads)
    blk = model.blocks[i]
    head = blk.sa.heads[0]
    bad = dataclasses.replace(head, A=dataclasses.replace(head.A, alpha=float("inf")))
    blocks = list(model.blocks)
    blocks[i] = dataclasses.replace(blk, sa=dataclasses.replace(blk.sa, heads=[bad]))
    v = prove_runtime(dataclasses.replace(model, blocks=blocks), data, "float32")
    assert not v.ok


def test_a_float16_score_may_overflow_before_the_temperature_divides_it():
    """A softmax score x_1² = 90 000 at τ = 4: the divided score 22 500 is a float16, but the
    runtime stores the product first (inf in float16), and inf − inf is nan in the softmax."""
    head = SA(0.0, ScoreMatrix(0.0, np.array([1.0, 0.0]), np.array([1.0, 0.0])),
              ValueMatrix(1.0, np.zeros(2), np.zeros(2)))
    model = Transformer(2, "softmax", [Block(None, head)], exact=False, tau=4.0)
    X = [[[300.0, 1.0]]]
    data = ef.Dataset.from_arrays(X, X)
    x = np.float16(300.0)
    with np.errstate(all="ignore"):  # the test's own float16 evaluation of the one weight
        s = (x * x) / np.float16(4.0)
        weight = np.exp(s - s) / np.exp(s - s)
    assert np.isnan(weight)
    assert not ef.prove_runtime(model, data, "float16", tolerance=0.1).ok


def test_a_float16_rank_one_score_term_may_overflow_though_the_score_does_not():
    """(c·x)(a·x) = 2·200² = 80 000 is beyond float16, α⟨x, x⟩ = −40 000 brings the score
    back to 40 000: the torch module stores the product first (inf), so the score is inf and
    the softmax weight nan."""
    head = SA(0.0, ScoreMatrix(-1.0, np.array([0.0, 1.0]), np.array([0.0, 2.0])),
              ValueMatrix(1.0, np.zeros(2), np.zeros(2)))
    model = Transformer(2, "softmax", [Block(None, head)], exact=False)
    X = [[[0.0, 200.0]]]
    data = ef.Dataset.from_arrays(X, X)
    x = np.float16(200.0)
    with np.errstate(all="ignore"):  # the test's own float16 evaluation of the one weight
        s = (np.float16(2.0) * x) * x + np.float16(-1.0) * (x * x)
        weight = np.exp(s - s) / np.exp(s - s)
    assert np.isnan(weight)
    assert not ef.prove_runtime(model, data, "float16", tolerance=0.1).ok


def test_an_exact_ff_output_beyond_the_format_is_not_snapped_back():
    """4·relu(30 000) = 120 000 is exact in 11 bits (a multiple of 64 below 2^11·64), but it
    is beyond float16's 65 504: every float16 evaluation stores inf."""
    ff = FF(0.0, np.array([[1.0, 0.0]]), np.array([0.0]), np.array([[4.0], [1.0]]))
    model = Transformer(2, "hardmax", [Block(ff, None)], exact=False)
    data = ef.Dataset.from_arrays([[[30000.0, 0.0]]], [[[120000.0, 30000.0]]])
    with np.errstate(all="ignore"):  # the test's own float16 evaluation
        y = np.maximum(np.float16(30000.0) * np.float16(1.0), np.float16(0)) * np.float16(4.0)
    assert np.isinf(y)
    assert not ef.prove_runtime(model, data, "float16", tolerance=0.1).ok


def test_a_float16_product_may_overflow_before_the_bias_or_the_residual_is_added():
    """The runtime stores x·Uᵀ before it adds b, and relu(·)·Wᵀ before it adds η·x: with
    2·60 000 − 60 000 and −60 000 + 2·60 000 the sums are floats of float16, the products
    (120 000) are inf."""
    x = np.float16(60000.0)
    with np.errstate(all="ignore"):  # the test's own float16 evaluations
        assert np.isinf(x * np.float16(2.0) + np.float16(-60000.0))
        assert np.isinf(-x + np.maximum(x, np.float16(0)) * np.float16(2.0))
    cases = [(FF(1.0, np.array([[2.0, 0.0]]), np.array([-60000.0]), np.array([[0.0], [1.0]])),
              [60000.0, 0.0], [60000.0, 60000.0]),
             (FF(1.0, np.array([[-1.0, 0.0]]), np.array([0.0]), np.array([[2.0], [1.0]])),
              [-60000.0, 0.0], [60000.0, 60000.0])]
    for ff, x_in, y in cases:
        model = Transformer(2, "hardmax", [Block(ff, None)], exact=False)
        data = ef.Dataset.from_arrays([[x_in]], [[y]])
        assert not ef.prove_runtime(model, data, "float16", tolerance=0.1).ok


@pytest.mark.parametrize("layout", ["rho-eta", "numpy"])
def test_a_row_that_overflows_reaches_every_row_through_a_zero_attention_layer(layout):
    """The ρ/η layout runs an attention layer of zero weights before an FF that has none
    before it (TransformerLens too): it adds π·(0·x_l), and 0·inf is nan, so a last token
    that float16 stores as inf (a position without a target) makes the constrained
    positions before it nan although the model has no attention at all."""
    ff = FF(1.0, np.array([[1.0, 0.0]]), np.array([-100.0]), np.array([[1.0], [0.0]]))
    model = Transformer(2, "hardmax", [Block(ff, None)], exact=False, causal=True)
    x = np.array([[1.0, 0.0], [2.0, 0.0], [1e5, 0.0]])
    data = ef.CausalDataset.from_arrays([x], [[[1.0, 0.0], [2.0, 0.0], None]])
    if layout == "rho-eta":
        torch = pytest.importorskip("torch")
        from exactformer.export import to_rho_eta

        with torch.no_grad():
            out = to_rho_eta(model, torch.float16)(torch.tensor(x[None], dtype=torch.float16))
        out = out[0, :2].double().numpy()
    else:  # the test's own float16 pass of that layer: ρ·x + π·(x·W_vᵀ), W_v = 0, causal
        with np.errstate(all="ignore"):
            X = x.astype(np.float16)  # 10⁵ is inf
            V = X @ np.zeros((2, 2), dtype=np.float16)
            pi = np.tril(np.ones((3, 3), dtype=np.float16))
            pi = pi / pi.sum(axis=1, keepdims=True)
            out = (X + pi @ V)[:2].astype(float)
    assert np.isnan(out).all()  # every evaluation of the layout misses the targets
    assert not ef.prove_runtime(model, data, "float16").ok
    assert ef.prove_runtime(model, data, "float32").ok  # 10⁵ is finite there


def test_a_value_map_term_stored_on_the_way_may_overflow_where_the_output_does_not():
    """The torch module computes ρ·x + β·y + p·(q·y) storing each product: with x = y = 2^10,
    β = −32, p = 64, q = 1 the output 2^10·33 = 33 792 is a float16 number, but the stored
    p·(q·y) = 65 536 is inf there, and so is the output."""
    sa = SA(1.0, ScoreMatrix(0.0, np.zeros(2), np.zeros(2)),
            ValueMatrix(-32.0, np.array([0.0, 64.0]), np.array([0.0, 1.0])))
    model = Transformer(2, "hardmax", [Block(None, sa)], exact=False)
    data = ef.Dataset.from_arrays([[[0.0, 1024.0]]], [[[0.0, 33792.0]]])
    h = np.float16
    with np.errstate(all="ignore"):  # the test's own float16 pass of the torch module
        y = h(1024.0)  # one key: its weight is exactly 1
        out = h(h(1.0) * y) + h(-32.0) * y + (y * h(1.0)) * h(64.0)
    assert np.isinf(out)
    assert not ef.prove_runtime(model, data, "float16").ok
    assert ef.prove_runtime(model, data, "bfloat16").ok  # 65 536 is finite there
