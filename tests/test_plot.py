"""The phase figure renders headless: a valid PNG with one panel per stage, and the CLI."""

import json
import sys

import numpy as np
import pytest

import exactformer as ef
from exactformer import cli, generate

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

from exactformer.plot import plot_phases  # noqa: E402


def small_d2():
    """Shared tokens (so a leaders phase and its collapse) in few blocks: every block is a frame
    of the animation, and drawing frames is what these tests spend their time on."""
    return generate.shared_pool(N=3, d=2, pool=4, n_max=3, m_max=2, seed=1)


def test_hardmax_panels_png_and_gif(tmp_path):
    data = small_d2()
    model = ef.compile(data)
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
    data = generate.shared_pool(N=4, d=3, pool=4, n_max=3, m_max=2, seed=1)
    model = ef.compile(data, attention=attention, exact=attention == "hardmax")
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
    model = ef.compile(data)
    model.record = None
    fig = plot_phases(model, data, tmp_path / "plain.png")
    assert len(fig.axes) == 2  # the input and "all blocks"
    last = fig.axes[-1].collections[0].get_offsets()
    assert np.isfinite(np.asarray(last)).all()


def test_cli_plot(tmp_path, capsys):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(small_d2().to_json_dict()))
    out = tmp_path / "fig.png"
    assert cli.main(["plot", str(path), "-o", str(out), "--gif", str(tmp_path / "a.gif")]) == 0
    assert "5 panels" in capsys.readouterr().out
    with Image.open(out) as im:
        im.verify()
    assert (tmp_path / "a.gif").exists()


def test_cli_plot_without_matplotlib_says_what_to_install(tmp_path, capsys, monkeypatch):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(small_d2().to_json_dict()))
    monkeypatch.delattr(ef, "plot", raising=False)
    monkeypatch.setitem(sys.modules, "exactformer.plot", None)  # import fails like a missing dep
    assert cli.main(["plot", str(path), "-o", str(tmp_path / "f.png")]) == 2
    assert "exactformer[plot]" in capsys.readouterr().err
    assert not (tmp_path / "f.png").exists()
