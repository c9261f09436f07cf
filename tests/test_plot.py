"""The phase figure renders headless: a valid PNG with one panel per stage, and the CLI; causal
models get one panel per phase too, tokens coloured by position."""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import paper
from hypothesis import HealthCheck, example, given, settings
from test_causal import causal_data

import exactformer as ef
import exactformer.tools
from exactformer import cli
from exactformer.data import builtin

mpl = pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

from matplotlib.collections import PathCollection  # noqa: E402

from exactformer.tools.plot import POSITION_CMAP, panels, plot_phases  # noqa: E402


def small_d2():
    """Shared tokens (so a leaders phase and its collapse) in few blocks: every block is a frame
    of the animation, and drawing frames is what these tests spend their time on."""
    return builtin.shared_pool(N=3, d=2, pool=4, n_max=3, m_max=2, seed=1)


def test_hardmax_panels_png_and_gif(tmp_path):
    data = small_d2()
    model = paper(data)
    fig = plot_phases(model, data, tmp_path / "fig.png", animate=True)
    # input + one panel per phase, and the collapse ending the leaders phase has its own
    assert list(model.meta["phases"]) == ["separation", "leaders", "interpolation"]
    assert len(fig.axes) == len(model.meta["phases"]) + 2
    expected = ["input", "after separation", "after leaders", "after the collapse",
                "after interpolation"]
    for ax, title in zip(fig.axes, expected, strict=True):
        assert ax.get_title().startswith(title)
    with Image.open(tmp_path / "fig.png") as im:
        assert im.format == "PNG" and im.size[0] > 600
    with Image.open(tmp_path / "fig.gif") as im:
        assert im.format == "GIF" and im.n_frames >= 2


@pytest.mark.parametrize("attention, phases", [
    ("hardmax", ["separation", "leaders", "interpolation"]),
    ("softmax", ["separation", "leaders", "projection", "snap"]),
])
def test_softmax_and_projected_panels(tmp_path, attention, phases):
    """Both attentions build (d = 3: panels are 2-D projections) and plot one panel per phase,
    plus the input and the collapse that ends the leaders phase."""
    data = builtin.shared_pool(N=4, d=3, pool=4, n_max=3, m_max=2, seed=1)
    model = paper(data, attention=attention, exact=attention == "hardmax")
    assert list(model.meta["phases"]) == phases
    fig = plot_phases(model, data, tmp_path / f"{attention}.png")
    expected = ["input", "after separation", "after leaders", "after the collapse"] + [
        f"after {p}" for p in phases[2:]]
    assert len(fig.axes) == len(expected)
    for ax, title in zip(fig.axes, expected, strict=True):
        assert ax.get_title().startswith(title)
    assert "principal directions" in fig.get_suptitle()
    with Image.open(tmp_path / f"{attention}.png") as im:
        im.verify()


def test_model_without_phases_gets_one_panel_per_phase(tmp_path):
    data = small_d2()
    model = paper(data)
    model.record = None
    fig = plot_phases(model, data, tmp_path / "plain.png")
    assert len(fig.axes) == 2  # the input and "all blocks"
    last = fig.axes[-1].collections[0].get_offsets()
    assert np.isfinite(np.asarray(last)).all()


def test_cli_plot(tmp_path, capsys):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(small_d2().to_json_dict()))
    out = tmp_path / "fig.png"
    assert cli.main(["plot", str(path), "-o", str(out), "--gif", str(tmp_path / "a.gif"),
                     "--construction", "paper"]) == 0
    assert "5 panels" in capsys.readouterr().out
    with Image.open(out) as im:
        im.verify()
    assert (tmp_path / "a.gif").exists()


def test_cli_plot_without_matplotlib_says_what_to_install(tmp_path, capsys, monkeypatch):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(small_d2().to_json_dict()))
    monkeypatch.delattr(exactformer.tools, "plot", raising=False)
    # the import fails as with a missing dependency
    monkeypatch.setitem(sys.modules, "exactformer.tools.plot", None)
    assert cli.main(["plot", str(path), "-o", str(tmp_path / "f.png")]) == 2
    assert "exactformer[plot]" in capsys.readouterr().err
    assert not (tmp_path / "f.png").exists()


# ------------------------------------------------------------------------------ causal models
def causal_shared():
    """Three sequences in R^2 whose contexts at one point need different targets, so the
    separation phase has blocks (R_c > 0)."""
    return ef.CausalDataset.from_arrays(
        inputs=[[[1, 0], [0, 1], [1, 0], [2, 2]], [[2, 2], [0, 1], [1, 0]],
                [[0, 1], [0, 1], [1, 0]]],
        targets=[[[0, 1], [1, 0], [0, 1], [1, 1]], [[0, 1], [2, 2], [1, 1]],
                 [[0, 1], [2, 0], None]])


def dots(ax):
    """The token scatter of a causal panel (the other collections: lines, target crosses)."""
    (sc,) = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_array()
             is not None]
    return sc


@pytest.mark.parametrize("attention", ["hardmax", "softmax"])
def test_causal_panels_follow_the_record_and_colour_by_position(tmp_path, attention):
    data = causal_shared()
    model = paper(data, attention=attention)
    phases = list(model.meta["phases"])
    assert model.record.R > 0 and phases[0] == "separation"
    fig = plot_phases(model, data, tmp_path / "causal.png")
    shown = panels(fig)
    assert len(shown) == len(phases) + 1 and len(fig.axes) == len(shown) + 1  # + colour bar
    for ax, title in zip(shown, ["input + stored positions"] + [f"after {p}" for p in phases],
                         strict=True):
        assert ax.get_title().startswith(title)
    where = np.concatenate([np.arange(n) for n in data.lengths])
    colours = mpl.colormaps[POSITION_CMAP](where / where.max())
    for ax in shown:
        np.testing.assert_array_equal(dots(ax).get_array(), where)
        np.testing.assert_allclose(dots(ax).get_facecolors(), colours)
    first = np.asarray(dots(shown[0]).get_offsets())
    np.testing.assert_allclose(first, np.concatenate(data.floats()[0]) +
                               model.positions.astype(float)[where])
    with Image.open(tmp_path / "causal.png") as im:
        assert im.format == "PNG" and im.size[0] > 600


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=causal_data())
@example(data=ef.CausalDataset.from_arrays([[[0, 0]]], [[None]]))  # nothing constrained
def test_causal_final_panel_puts_constrained_positions_on_their_targets(data):
    """Random causal data (repeats, shared and permuted prefixes, nulls): the last panel shows
    every constrained position's output on its target cross (in the panel's projection)."""
    model = paper(data)
    with tempfile.TemporaryDirectory() as tmp:
        fig = plot_phases(model, data, Path(tmp) / "f.png")
    last = panels(fig)[-1]
    assert len(panels(fig)) == len(model.meta["phases"]) + 1
    out = np.asarray(dots(last).get_offsets())[np.concatenate(data.known)]
    (crosses,) = [c for c in last.collections if isinstance(c, PathCollection) and
                  c.get_array() is None]
    scale = float(np.abs(out).max(initial=1.0))
    np.testing.assert_allclose(out, np.asarray(crosses.get_offsets()), atol=1e-9 * scale)


def test_causal_model_needs_causal_data(tmp_path):
    model = paper(causal_shared())
    with pytest.raises(ValueError, match="causal model is plotted with causal data"):
        plot_phases(model, small_d2(), tmp_path / "f.png")
    with pytest.raises(ValueError, match="set-to-set model is plotted with set-to-set data"):
        plot_phases(paper(small_d2()), causal_shared(), tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()


def test_cli_plot_causal(tmp_path, capsys):
    marked = tmp_path / "causal.json"
    marked.write_text(json.dumps(causal_shared().to_json_dict()))
    out = tmp_path / "fig.png"
    assert cli.main(["plot", str(marked), "-o", str(out), "--gif", str(tmp_path / "a.gif"),
                     "--construction", "paper"]) == 0
    assert "3 panels (causal hardmax" in capsys.readouterr().out
    with Image.open(out) as im:
        im.verify()
    with Image.open(tmp_path / "a.gif") as im:
        assert im.n_frames >= 3
    doc = causal_shared().to_json_dict()
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"inputs": doc["inputs"], "targets": doc["targets"]}))
    assert cli.main(["plot", str(plain), "-o", str(out), "--float"]) == 2  # read as set data
    assert cli.main(["plot", str(plain), "-o", str(out), "--float", "--causal",
                     "--construction", "paper"]) == 0
    assert "causal hardmax" in capsys.readouterr().out


def test_keyed_panels_name_the_collapse_block(tmp_path):
    """A keyed model's collapse phase ends in a block whose FF clears heights (softmax: also
    resets the data) before its ρ = 0 head: one panel before that head, one after."""
    data = small_d2()
    model = ef.compile(data, attention="softmax", keys=True)
    fig = plot_phases(model, data, tmp_path / "fig.png")
    expected = ["input", "after tagging", "after separation", "before the collapse",
                "after the collapse", "after interpolation"]
    assert len(fig.axes) == len(expected)
    for ax, title in zip(fig.axes, expected, strict=True):
        assert ax.get_title().startswith(title)


def _discs(ax) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first scatter of a panel: its points, sizes and colours."""
    (dots, *_) = [c for c in ax.collections if isinstance(c, PathCollection)]
    return dots.get_offsets(), dots.get_sizes(), dots.get_facecolors()


def test_twenty_sequences_get_twenty_colours_and_a_legend(tmp_path):
    data = builtin.shared_pool(N=20, d=2, pool=6, n_max=3, m_max=2, seed=2)
    fig = plot_phases(ef.compile(data), data, tmp_path / "f.png")
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [f"sequence {j}" for j in range(20)]
    colours = {tuple(np.round(h.get_color(), 6)) for h in legend.legend_handles}
    assert len(colours) == 20


def test_a_shared_point_has_one_disc_per_sequence_not_per_token(tmp_path):
    """Where tokens of one sequence coincide (m < n: they end on fewer targets), the discs
    at a point count the sequences holding it, not their tokens."""
    data = builtin.shared_pool(N=4, d=2, pool=5, n_max=3, m_max=1, seed=3)
    model = ef.compile(data)
    fig = plot_phases(model, data, tmp_path / "f.png")
    split, stage_list = exactformer.tools.plot.stages(model)
    snaps = exactformer.tools.plot.snapshots(split, data.floats()[0],
                                             [s.index for s in stage_list])
    merged = 0
    for ax, stage in zip(panels(fig), stage_list, strict=True):
        held = {}  # an independent count: point -> the sequences with a token there
        for j, p in enumerate(snaps[stage.index]):
            for row in np.round(p, 12).tolist():
                held.setdefault(tuple(row), set()).add(j)
        xy, _, _ = _discs(ax)
        assert len(xy) == sum(len(s) for s in held.values())
        merged += len(xy) < data.total_n
    assert merged  # some panel had tokens of one sequence on one point
