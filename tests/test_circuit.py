"""The circuit (docs/circuit.md) against a reference written in the test: which units and heads
a pair uses, from the test's own exact dense pass and exact ablations."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import dense_pass, token_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactformer as ef
from exactformer.circuit import circuit, trace
from exactformer.data import builtin
from exactformer.model import SA, Block, Head, ValueMatrix
from exactformer.numbers import to_fraction_array


def exact_arr(a):
    return to_fraction_array(np.asarray(a, dtype=object))


def exact_states(model, x):
    """The test's own exact pass (conftest.dense_pass in Fractions) and each block's FF
    pre-activations."""
    pre: list = []
    states = dense_pass(model, to_fraction_array(x), object, exact_arr, pre=pre)
    return states, pre


def outputs(model, data):
    return [exact_states(model, x)[0][-1] for x in data.inputs]


def units_by_block(doc, j):
    """{our block: FF units} that the circuit names for pair j (the FF's own units only)."""
    out: dict[int, set] = {}
    for hook, idx in doc["pairs"][j]["units"].items():
        info = doc["units"][hook]
        own = [u for u in idx if info["roles"][u] != "turn"]
        if own:
            out.setdefault(info["model_block"], set()).update(own)
    return out


def ablated(model, units: dict[int, set]):
    """The model with the named FF units' outputs (columns of W) set to 0."""
    blocks = []
    for b, blk in enumerate(model.blocks):
        if b in units:
            W = blk.ff.W.copy()
            W[:, sorted(units[b])] = 0
            blk = Block(replace(blk.ff, W=W), blk.sa)
        blocks.append(blk)
    return replace(model, blocks=blocks)


data_sets = st.builds(
    lambda N, d, pool, n, seed, square: builtin.shared_pool(
        N, d, max(pool, n) + N + 2, n, 2, seed=seed, m_equals_n=square),
    st.integers(1, 4), st.integers(2, 3), st.integers(2, 6), st.integers(1, 4),
    st.integers(0, 10 ** 6), st.booleans())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=data_sets, construction=st.sampled_from(["keyed", "paper"]))
def test_units_used_are_the_nonzero_activations_of_an_exact_pass(data, construction):
    model = ef.compile(data, construction=construction)
    doc = circuit(model, data)
    for j, x in enumerate(data.inputs):
        _, pre = exact_states(model, x)
        named = units_by_block(doc, j)
        for b, Z in enumerate(pre):
            if Z is None:
                continue
            active = {u for u in range(Z.shape[1]) if (Z[:, u] > 0).any()}
            assert named.get(b, set()) == active, f"pair {j}, block {b}"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=data_sets, construction=st.sampled_from(["keyed", "paper"]))
def test_ablating_units_leaves_every_pair_that_does_not_use_them(data, construction):
    """Exactly: ablating the units of no pair changes nothing; ablating pair j's changes
    pair j (it no longer interpolates) and no pair whose units are disjoint from them."""
    model = ef.compile(data, construction=construction)
    doc = circuit(model, data)
    base = outputs(model, data)
    unused: dict[int, set] = {}
    for hook, idx in doc["unused"]["units"].items():
        info = doc["units"].get(hook)
        if info is not None:
            own = {u for u in idx if u < len(info["roles"]) and info["roles"][u] != "turn"}
            if own:
                unused.setdefault(info["model_block"], set()).update(own)
    for a, b in zip(outputs(ablated(model, unused), data), base, strict=True):
        assert (a == b).all()
    j = data.N - 1
    mine = units_by_block(doc, j)
    after = outputs(ablated(model, mine), data)
    _, ys = data.padded(model.d).fractions()
    if any(v != 0 for v in ys[j].flat):  # a non-residual layer with its units off writes 0,
        assert token_set(after[j]) != token_set(ys[j])  # which an all-zero target equals
    for k in range(data.N):
        theirs = units_by_block(doc, k)
        if all(not (mine[b] & theirs.get(b, set())) for b in mine):
            assert (after[k] == base[k]).all(), f"pair {k} uses none of pair {j}'s units"


def test_heads_used_are_those_whose_output_reaches_the_pair():
    """A head named for no pair can be removed (V = 0) without changing any output."""
    data = builtin.demo()
    model = ef.compile(data, heads=2, width=8)
    doc = circuit(model, data)
    base = outputs(model, data)
    for hook, info in doc["heads"].items():
        for h in range(info["heads"]):
            users = [e["pair"] for e in doc["pairs"] if h in e["heads"].get(hook, [])]
            b = info["model_block"]
            sa = model.blocks[b].sa
            heads = [Head(x.A, ValueMatrix(0 * x.V.beta, x.V.p * 0, x.V.q)) if k == h else x
                     for k, x in enumerate(sa.heads)]
            blocks = list(model.blocks)
            blocks[b] = Block(blocks[b].ff, SA(sa.rho, heads=heads))
            after = outputs(replace(model, blocks=blocks), data)
            for k in range(data.N):
                if k not in users:
                    assert (after[k] == base[k]).all(), f"{hook} head {h}, pair {k}"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.text("abc", min_size=2, max_size=6), min_size=1, max_size=3),
       d=st.integers(2, 4))
def test_causal_positions_use_the_units_nonzero_on_their_prefix(texts, d):
    try:
        data = ef.CausalDataset.from_text(texts, d=d)
    except ef.DatasetError:  # texts that contradict each other are not data
        return
    model = ef.compile(data)
    doc = circuit(model, data)
    for e in doc["positions"]:
        j, t = e["sequence"], e["position"]
        _, pre = exact_states(model, data.inputs[j])
        named: dict[int, set] = {}
        for hook, idx in e["units"].items():
            info = doc["units"][hook]
            own = {u for u in idx if info["roles"][u] != "turn"}
            if own:
                named.setdefault(info["model_block"], set()).update(own)
        for b, Z in enumerate(pre):
            if Z is not None:
                active = {u for u in range(Z.shape[1]) if (Z[: t + 1, u] > 0).any()}
                assert named.get(b, set()) == active, f"position {j},{t}, block {b}"


def test_causal_positions_use_prefixes_and_the_readout_is_the_data():
    data = ef.CausalDataset.from_text(["cat sat.", "dog sit."], d=4)
    model = ef.compile(data)
    doc = circuit(model, data)
    assert len(doc["positions"]) == data.constrained
    by_seq: dict = {}
    for e in doc["positions"]:  # a later position uses everything an earlier one does
        prev = by_seq.get(e["sequence"])
        if prev is not None:
            for hook, idx in prev["units"].items():
                assert set(idx) <= set(e["units"].get(hook, []))
        by_seq[e["sequence"]] = e
    assert doc["readout"]["logits"] == [0, 4]
    assert doc["readout"]["zero_logits"] == [4, model.d]


def test_explain_names_a_leader_and_moves_to_the_targets():
    data = builtin.demo()
    model = ef.compile(data)
    doc = ef.explain(model, data, pair=3)
    assert doc["exact"]
    leaders = doc["keyed"]["leaders"]
    assert set(leaders) == {str(i) for i in range(len(data.inputs[3]))}
    moves = doc["keyed"]["moves"]
    assert {i for m in moves for i in m["tokens"]} == set(range(len(data.inputs[3])))
    for m in moves:  # after the collapse a move acts on one leader's tokens
        assert len({tuple(leaders[str(i)]) for i in m["tokens"]}) == 1
    hooks = {s["hook"] for p in doc["phases"] for s in p["steps"]}
    assert all(h.startswith("blocks.") for h in hooks)
    with pytest.raises(ValueError, match="pair 12"):
        ef.explain(model, data, pair=12)


def test_softmax_traces_in_mpmath_and_says_so():
    """Softmax models (no finite arithmetic evaluates them exactly) trace in mpmath, and the
    circuit names its arithmetic."""
    data = builtin.shared_pool(3, 2, 4, 3, 2, seed=1)
    model = ef.compile(data, attention="softmax")
    assert circuit(model, data)["arithmetic"] == "mp50"
    tr = trace(model, data)
    assert tr.arithmetic == "mp"


def test_explain_command_prints_hooks_and_writes_json(tmp_path, capsys):
    import json

    from exactformer import cli
    data = builtin.demo()
    (tmp_path / "d.json").write_text(json.dumps(data.to_json_dict()))
    ef.save_model(ef.compile(data), tmp_path / "m.json")
    args = ["explain", str(tmp_path / "m.json"), str(tmp_path / "d.json")]
    assert cli.main(args + ["--pair", "2", "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    assert "blocks." in out and "EXACT" in out and "NOT EXACT" not in out
    assert json.loads((tmp_path / "e.json").read_text())["pair"] == 2
    assert cli.main(args + ["--pair", "12", "--json", str(tmp_path / "x.json")]) == 2
    assert "pair 12" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()  # an error writes nothing
    assert cli.main(args + ["--position", "0,1"]) == 2  # set data take --pair


def test_circuit_figure_marks_exactly_the_used_units_and_heads(tmp_path):
    pytest.importorskip("matplotlib")
    from exactformer.tools.circuit_plot import circuit_grids, plot_circuit
    data = builtin.demo()
    model = ef.compile(data, width=8, heads=2)
    doc = circuit(model, data)
    units, heads = circuit_grids(model, data, 4)
    named = {(int(h.split(".")[1]), u) for h, us in doc["pairs"][4]["units"].items() for u in us}
    assert {(int(b), int(u)) for u, b in zip(*np.nonzero(np.isfinite(units)), strict=True)} \
        == named
    named = {(int(k.split(".")[1]), h) for k, hs in doc["pairs"][4]["heads"].items() for h in hs}
    assert {(int(b), int(h)) for h, b in zip(*np.nonzero(heads), strict=True)} == named
    plot_circuit(model, data, tmp_path / "c.png", pair=4)
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="pair 12"):
        plot_circuit(model, data, tmp_path / "x.png", pair=12)
    assert not (tmp_path / "x.png").exists()


def test_explain_judges_float_data_exactly_and_softmax_not_at_all():
    """Float targets are compared with the exact outputs as the exact values they are; a
    softmax model's mp pass decides no equality (``exact`` None) and reports the gap."""
    fl = ef.Dataset.from_arrays([np.array([[0.1, 0.2], [0.3, -0.7]]),
                                 np.array([[0.5, 0.25], [0.1, 0.9]])],
                                [np.array([[0.3, 0.1]]), np.array([[1.1, 0.2], [0.0, 0.1]])])
    model = ef.compile(fl)
    for j in range(2):
        doc = ef.explain(model, fl, pair=j)
        assert doc["exact"] is True and doc["error"] == "0"
        assert doc["targets"][0][0] in ("0.3", "1.1")
    broken = replace(model, blocks=model.blocks[:-1])
    assert ef.explain(broken, fl, pair=1)["exact"] is False
    data = builtin.shared_pool(3, 2, 5, 3, 2, seed=1)
    doc = ef.explain(ef.compile(data, attention="softmax"), data, pair=0)
    assert doc["exact"] is None and doc["arithmetic"] == "mp"


def test_data_of_the_other_kind_are_refused():
    data = builtin.demo()
    causal = ef.CausalDataset.from_text(["abcab"], d=3)
    with pytest.raises(ValueError, match="causal"):
        circuit(ef.compile(data), causal)
    with pytest.raises(ValueError, match="causal"):
        ef.explain(ef.compile(causal), data, pair=0)
