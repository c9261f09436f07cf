"""A Hub folder and a TransformerLens folder share config.json and model.safetensors, and each
keeps files that describe its weights (the card and model.json; runtime_proofs.json). Exporting
the paper's demo model to TransformerLens in float32 into the keyed demo model's Hub folder
replaced the weights and left the card saying "PROVED FAITHFUL IN float32" and "It reproduces
its dataset", while a float32 pass of the paper model (plain NumPy, test_info_claims) misses
the data by 1.9e-4 × scale. Either export now refuses the other's folder, changing nothing."""

from __future__ import annotations

import json

import pytest
from test_info_claims import relative_error

pytest.importorskip("torch")
pytest.importorskip("transformer_lens")

import exactformer as ef  # noqa: E402
from exactformer import cli  # noqa: E402
from exactformer import export as et  # noqa: E402
from exactformer.data import builtin  # noqa: E402


def snapshot(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_exports_refuse_each_others_folders(tmp_path, capsys):
    data = builtin.demo()
    keyed, paper = ef.compile(data), ef.compile(data, construction="paper")
    assert relative_error(paper, data) > 1e-5  # 1.9e-4: its float32 copy misses the data
    hub = tmp_path / "hub"
    et.to_torch(keyed).save_pretrained(hub, data=data, report=ef.verify(keyed, data))
    assert "PROVED FAITHFUL IN float32" in (hub / "README.md").read_text()
    before = snapshot(hub)
    ef.save_model(paper, tmp_path / "paper.json")
    status = cli.main(["export", str(tmp_path / "paper.json"), "-o", str(hub), "--layout",
                       "transformer-lens", "--dtype", "float32"])
    assert status == 2 and "holds a Hub folder" in capsys.readouterr().err
    assert snapshot(hub) == before

    lens = tmp_path / "lens"
    et.save_lens(keyed, lens, "float32", data=data)
    assert (lens / "runtime_proofs.json").is_file()
    before = snapshot(lens)
    with pytest.raises(ValueError, match="holds a TransformerLens export"):
        et.to_torch(paper).save_pretrained(lens)
    assert snapshot(lens) == before
    et.save_lens(paper, lens, "float32")  # the same kind may be rewritten (and cleans up)
    assert not (lens / "runtime_proofs.json").exists()


def test_a_native_export_refuses_an_export_folders_weights(tmp_path, capsys):
    """`exactformer export paper.json -o HUB/model.safetensors --dtype float32` replaced the
    Hub folder's weights under its card (PROVED FAITHFUL IN float32 for the keyed model's),
    and the same into a TransformerLens folder under its runtime_proofs.json."""
    data = builtin.demo()
    keyed, paper = ef.compile(data), ef.compile(data, construction="paper")
    assert relative_error(paper, data) > 1e-5
    ef.save_model(paper, tmp_path / "paper.json")
    hub, lens = tmp_path / "hub", tmp_path / "lens"
    et.to_torch(keyed).save_pretrained(hub, data=data, report=ef.verify(keyed, data))
    et.save_lens(keyed, lens, "float32", data=data)
    for folder in (hub, lens):
        before = snapshot(folder)
        status = cli.main(["export", str(tmp_path / "paper.json"), "-o",
                           str(folder / "model.safetensors"), "--dtype", "float32"])
        assert status == 2 and "weights file of an export folder" in capsys.readouterr().err
        assert snapshot(folder) == before


def test_a_model_file_is_not_written_into_a_hub_folder(tmp_path, capsys):
    """`exactformer build DATA -o HUB/model.json` replaced the Hub folder's model.json under
    its card (PROVED EXACT for the keyed model, and the card tells readers to verify
    model.json); `save_model` and every command that writes a model now refuse the folder."""
    data = builtin.demo()
    keyed, paper = ef.compile(data), ef.compile(data, construction="paper")
    hub = tmp_path / "hub"
    et.to_torch(keyed).save_pretrained(hub, data=data, report=ef.verify(keyed, data))
    before = snapshot(hub)
    (tmp_path / "data.json").write_text(json.dumps({"inputs": [[[0, 1], [2, 3]], [[2, 3]]],
                                                    "targets": [[[1, 1]], [[7, 7]]]}))
    for args in (["build", str(tmp_path / "data.json"), "-o", str(hub / "model.json"),
                  "--construction", "paper"],
                 ["demo", "-o", str(hub / "other.json")]):
        status = cli.main(args)
        assert status == 2 and "is a Hub folder" in capsys.readouterr().err
        assert snapshot(hub) == before
    with pytest.raises(ValueError, match="is a Hub folder"):
        ef.save_model(paper, hub / "model.npz")
    assert snapshot(hub) == before
    ef.save_model(paper, tmp_path / "elsewhere.json")  # any other folder is fine
