"""The decoder's window lookup (exactformer.tools.decode): token by token it gives what the full
causal pass gives, on random causal models of every width, for the training sequences and for
sequences the model never saw, exact and float64 (docs/causal.md#generation)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.evaluate import forward_causal
from exactformer.tools.decode import Decoder, generate


@st.composite
def causal_case(draw):
    """A few sequences over a small pool of integer tokens in R^d with a random target per
    ordered prefix (some null), and random off-data sequences of the same tokens and of
    non-integer ones."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    d = draw(st.integers(2, 4))
    pool = np.unique(rng.integers(-3, 4, size=(4, d)), axis=0)  # distinct tokens
    seqs = [rng.integers(len(pool), size=int(rng.integers(1, 8))).tolist()
            for _ in range(draw(st.integers(1, 5)))]
    by_prefix: dict = {}
    ys = [[None if rng.random() < 0.2 else
           by_prefix.setdefault(tuple(s[:i + 1]), rng.integers(-3, 4, size=d))
           for i in range(len(s))] for s in seqs]
    data = ef.CausalDataset.from_arrays([pool[s] for s in seqs], ys)
    n = max(len(s) for s in seqs)
    others = [pool[rng.integers(len(pool), size=n)], rng.uniform(-3, 3, size=(n, d)).round(2)]
    return data, others, draw(st.sampled_from([4, 8, 16])), draw(st.booleans())


def decoded(model, xs, arithmetic):
    out = []
    for x in xs:
        dec = Decoder(model, arithmetic)
        out.append([tuple(dec.push(t)) for t in x])
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(causal_case())
def test_decoder_equals_the_full_pass_on_random_models(case):
    """For the data and for unseen sequences (which land between and across the windows): ==
    on every position in the exact pass (of rational and of float64 parameters); in a float64
    pass within 1e-9 × the scale, as the two passes group a layer's sums differently."""
    data, others, width, exact = case
    model = ef.compile(data, exact=exact, causal=True, width=width)
    xs = data.floats()[0] + others
    full = forward_causal(model, xs, "exact")
    assert decoded(model, xs, "exact") == [[tuple(r) for r in o] for o in full]
    full = forward_causal(model, xs, "float")
    for got, want in zip(decoded(model, xs, "float"), full, strict=True):
        scale = 1 + np.abs(want).max()
        assert np.abs(np.array(got, dtype=float) - want).max() <= 1e-9 * scale


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(causal_case())
def test_generation_follows_the_full_pass(case):
    """Each generated token is the exact full pass's output at the last position of the prompt
    plus the tokens generated so far (rational and float64 parameters)."""
    data, _, width, exact = case
    model = ef.compile(data, exact=exact, causal=True, width=width)
    x = data.padded(model.d).fractions()[0][0]  # outputs are model.d wide: fed back as inputs
    steps = len(x) - 1
    out = generate(model, x[:1], steps, arithmetic="exact")
    seq = list(x[:1])
    for s in range(steps):
        (full,) = forward_causal(model, [np.array(seq, dtype=object)], "exact")
        assert tuple(out[s]) == tuple(full[-1])
        seq.append(out[s])
