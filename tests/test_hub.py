"""The Hub-style folder of the native module (docs/numerics.md#the-hub-folder): what it holds,
that reading it back gives identical outputs, and its model card."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import exactformer as ef  # noqa: E402
from exactformer import export as et  # noqa: E402
from exactformer.data import CausalDataset, builtin  # noqa: E402


def outputs(module, data):
    return et.apply(module, data.floats()[0])


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10 ** 6), N=st.integers(1, 6), d=st.integers(2, 4),
       attention=st.sampled_from(["hardmax", "softmax"]),
       dtype=st.sampled_from([torch.float64, torch.float32]),
       ff=st.sampled_from(et.FF_FORMS))
def test_from_pretrained_gives_identical_outputs(tmp_path_factory, seed, N, d, attention,
                                                 dtype, ff):
    data = builtin.shared_pool(N=N, d=d, pool=N + 2, n_max=4, m_max=2, seed=seed)
    module = et.to_torch(ef.compile(data, attention=attention, seed=seed), dtype, ff=ff)
    folder = tmp_path_factory.mktemp("hub")
    module.save_pretrained(folder)
    back = et.NativeTransformer.from_pretrained(folder)
    assert back.ff == ff and next(back.parameters()).dtype == dtype
    for a, b in zip(outputs(module, data), outputs(back, data), strict=True):
        assert np.array_equal(a, b)


def test_the_folder_holds_config_weights_card_and_the_exact_model(tmp_path):
    data = builtin.demo()
    model = ef.compile(data, width=8)
    report = ef.verify(model, data)
    et.to_torch(model).save_pretrained(tmp_path, data=data, report=report)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["README.md", "circuit.json", "config.json", "model.json",
                     "model.safetensors"]  # circuit.json: with data (docs/circuit.md)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["layout"] == "native" and config["d"] == model.d > data.d  # keyed: wider
    card = (tmp_path / "README.md").read_text()
    assert data.sha256() in card and f"| sequences N | {data.N} |" in card
    assert f"| blocks | {model.n_blocks} |" in card and "PROVED EXACT" in card
    again = ef.verify(ef.load_model(tmp_path / "model.json"), data)
    assert again.proved  # the exact model re-proves from the folder alone


def test_data_hash_names_the_data():
    a, b = builtin.demo(), builtin.shared_pool(N=3, d=2, pool=4, n_max=3, m_max=2, seed=0)
    assert a.sha256() == builtin.demo().sha256() != b.sha256()


def test_causal_folder_and_card(tmp_path):
    data = CausalDataset.from_arrays([[[1, 0], [0, 1]], [[0, 1], [1, 1]]],
                                     [[[2, 2], None], [[1, 0], [3, 0]]])
    module = et.to_torch(ef.compile(data))
    module.save_pretrained(tmp_path, data=data)
    back = et.NativeTransformer.from_pretrained(tmp_path)
    assert back.causal and torch.equal(back.positions, module.positions)
    assert "| constrained positions | 3 |" in (tmp_path / "README.md").read_text()
    assert all(np.array_equal(a, b) for a, b in
               zip(outputs(module, data), outputs(back, data), strict=True))


def test_from_pretrained_refuses_a_folder_it_did_not_write(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        et.NativeTransformer.from_pretrained(tmp_path)
    et.save_lens(ef.compile(builtin.demo()), tmp_path)  # a transformer-lens folder
    with pytest.raises(ValueError, match="layout"):
        et.NativeTransformer.from_pretrained(tmp_path)


def card_blocks(card: str, language: str) -> list[str]:
    """The fenced blocks of one language in a Markdown text."""
    return [b.split("\n", 1)[1] for b in card.split("```")[1::2] if b.startswith(language)]


def run_snippet(card: str, folder) -> tuple[str, np.ndarray]:
    """The card's Python snippet, and the outputs it computes run as written in ``folder``."""
    (snippet,) = card_blocks(card, "python")
    keep = "\nnp.save('out.npy', apply(module, [x])[0])\n"
    done = subprocess.run([sys.executable, "-c", snippet + keep], cwd=folder,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return snippet, np.load(folder / "out.npy")


@pytest.mark.parametrize("causal", [False, True])
def test_the_card_is_one_to_publish(tmp_path, capsys, causal):
    """Version, licence, citation, the verdict and its arithmetic, the float32 verdict, the
    out-of-data warning, the sha256 recipe, no placeholder and no link; the model table is
    `info`'s, and the snippet runs as written in the folder."""
    from exactformer.cli import main
    from exactformer.summary import model_summary
    data = CausalDataset.from_text("a rose is a rose", d=3) if causal else builtin.demo()
    model = ef.compile(data)
    report = ef.verify(model, data)
    et.to_torch(model).save_pretrained(tmp_path, data=data, report=report)
    card = (tmp_path / "README.md").read_text()
    assert f"exactformer {ef.__version__}" in card and "license: mit" in card
    assert "arXiv:2502.02270" in card and "Alcalde" in card and "Zuazua" in card
    assert f"**{report.verdict()}** (`verify`, {report.arithmetic} arithmetic)" in card
    assert "## In float32" in card and "float32 verdict" in card
    assert "Outside its data the model means nothing" in card
    assert "little-endian float64 bytes" in card and data.sha256() in card
    assert "FOLDER" not in card and "](" not in card and "docs/" not in card
    rows = [line for line in card.splitlines() if line.startswith("| ")]
    for label, value in model_summary(model):
        assert f"| {label} | {value.replace('|', chr(92) + '|')} |" in rows
    (tmp_path / "apart").mkdir()  # a model file is not written into a Hub folder
    ef.save_model(model, tmp_path / "apart" / "m.json")
    assert main(["info", str(tmp_path / "apart" / "m.json")]) == 0
    info = capsys.readouterr().out.splitlines()
    assert len(info) == len(model_summary(model))
    for line, (label, value) in zip(info, model_summary(model), strict=True):
        assert line.startswith(label) and line.endswith(value)
    out = run_snippet(card, tmp_path)[1][:, :data.d]
    targets = data.floats()[1][0]
    if causal:  # the first tokens' predictions are the next characters
        known = data.known[0][: len(out)]
        assert np.abs(out[known] - targets[: len(out)][known]).max() < 1e-9
    else:
        assert {tuple(np.round(r, 9)) for r in out} == {tuple(np.round(r, 9)) for r in targets}


# ------------------------------------------------------------------------------ altered folders
from safetensors.torch import load_file, save_file  # noqa: E402

from exactformer.export.hub import FolderError  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder of an exact keyed model (many FF and SA tensors), its data and its outputs."""
    data = builtin.shared_pool(N=5, d=2, pool=6, n_max=3, m_max=2, seed=3)
    module = et.to_torch(ef.compile(data, keys=True), torch.float32)
    folder = tmp_path_factory.mktemp("hub")
    module.save_pretrained(folder, data=data)
    return folder, data, outputs(module, data)


def copy_of(saved, tmp_path):
    for p in saved[0].iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    return tmp_path


def refused(folder, *words) -> str:
    """from_pretrained raises one FolderError (a ValueError) naming ``words``; its message."""
    with pytest.raises(FolderError) as e:
        et.NativeTransformer.from_pretrained(folder)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


def test_an_intact_folder_runs_the_model_that_verify_checks(saved, tmp_path):
    folder, data, outs = saved
    back = et.NativeTransformer.from_pretrained(folder)
    assert all(np.array_equal(a, b) for a, b in zip(outs, outputs(back, data), strict=True))
    assert back.model.exact and ef.verify(back.model, data).proved  # model.json's own model


@pytest.mark.parametrize("part", ["eval.blocks.*.ff.", "eval.blocks.*.sa.", "blocks.*.ff.U",
                                  "blocks.*.sa.alpha"])
def test_a_scaled_running_or_stored_tensor_is_refused(saved, tmp_path, part):
    """Scaling the tensors the module runs (eval.*) or the stored parameters by 1.5: the folder
    no longer holds what model.json implies, so loading refuses it, naming the tensor."""
    folder = copy_of(saved, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    head, tail = part.split("*")
    keys = [k for k in tensors if k.startswith(head) and tail in k and
            torch.count_nonzero(tensors[k]) > 0]
    assert keys, part
    key = keys[len(keys) // 2]
    tensors[key] = tensors[key] * 1.5
    save_file(tensors, str(folder / "model.safetensors"))
    refused(folder, str(folder / "model.safetensors"), key)


def test_a_float64_model_saved_in_float32_reloads_bit_for_bit(tmp_path):
    data = builtin.shared_pool(N=4, d=3, pool=5, n_max=3, m_max=2, seed=1)
    module = et.to_torch(ef.compile(data, exact=False, attention="softmax"), torch.float32)
    module.save_pretrained(tmp_path)
    back = et.NativeTransformer.from_pretrained(tmp_path)
    assert not back.model.exact and next(back.parameters()).dtype == torch.float32
    assert all(np.array_equal(a, b) for a, b in
               zip(outputs(module, data), outputs(back, data), strict=True))


CONFIG_FAULTS = {  # field: bad value (None: the field removed)
    "tau": [-1, 0, "nan", 1e-320, True], "attention": ["max", None], "d": ["2", 0, None],
    "dtype": ["float8", None], "ff": ["sparse"], "causal": ["yes"], "positions": [-1],
    "blocks": [{}, [5], [{"ff": {"width": "4"}, "sa": True}], [{"ff": None, "sa": {"heads": 1}}]],
    "format": ["exactformer.torch/9", None],
}


@pytest.mark.parametrize("field, value", [(f, v) for f, vs in CONFIG_FAULTS.items() for v in vs])
def test_a_config_value_outside_its_rules_is_refused(saved, tmp_path, field, value):
    folder = copy_of(saved, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    if value is None:
        config.pop(field)
    else:
        config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    refused(folder, str(folder / "config.json"), f'"{field}')


def test_softmax_config_values_are_checked_against_the_stored_model(tmp_path):
    data = builtin.demo()
    et.to_torch(ef.compile(data, attention="softmax")).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for field, value in (("tau", 2.0), ("attention", "hardmax"), ("causal", True)):
        bad = {**config, field: value} | ({"tau": None} if value == "hardmax" else {})
        (tmp_path / "config.json").write_text(json.dumps(bad))
        refused(tmp_path, str(tmp_path / "config.json"), f'"{field}"')


BROKEN_FILES = {  # file: content that is not what save_pretrained writes
    "config.json": [b"{", b"[" * 100_000, b"\xff\xfe", b"[]", b"null"],
    "model.safetensors": [b"", b"garbage", b"\x08\x00\x00\x00\x00\x00\x00\x00{}"],
    "model.json": [b"{", b'{"format": "exactformer.model/1"}', b"[" * 100_000],
}


@pytest.mark.parametrize("name, content",
                         [(n, c) for n, cs in BROKEN_FILES.items() for c in cs])
def test_a_broken_file_is_one_folder_error_naming_it(saved, tmp_path, name, content):
    """Never a KeyError, TypeError, JSONDecodeError, RecursionError or SafetensorError."""
    folder = copy_of(saved, tmp_path)
    (folder / name).write_bytes(content)
    refused(folder, str(folder / name))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_parameter_of_a_float64_folder_is_named(tmp_path, bad):
    module = et.to_torch(ef.compile(builtin.demo(), exact=False))
    module.save_pretrained(tmp_path)  # no model.json: the native tensors are the model
    tensors = load_file(str(tmp_path / "model.safetensors"))
    key = next(k for k in tensors if k.endswith("ff.U"))
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = bad
    save_file(tensors, str(tmp_path / "model.safetensors"))
    refused(tmp_path, key, "nan or an inf")


def test_a_tensor_missing_or_extra_is_named(saved, tmp_path):
    folder = copy_of(saved, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    key = next(k for k in tensors if k.startswith("eval."))
    save_file({k: v for k, v in tensors.items() if k != key}, str(folder / "model.safetensors"))
    refused(folder, key, "missing")
    save_file({**tensors, "eval.extra": torch.zeros(2)}, str(folder / "model.safetensors"))
    refused(folder, "eval.extra")


@pytest.mark.parametrize("case", ["paper", "keyed", "paper-dense"])
def test_the_card_says_when_the_module_as_saved_misses_its_data(tmp_path, case):
    """A folder runs as stored: in bfloat16 the paper model's hats do not survive, nor in
    float32 evaluated densely (ff="dense") on a wider paper model. Its card showed only the
    float32 verdict of the profile form ("still interpolates") and a snippet whose comment
    called the outputs the target set; the snippet, run as written, says otherwise. The card
    must say what the stored module gives (the keyed model's reproduces)."""
    data = builtin.vocabulary(20, 12, 6, 2, 4, seed=3) if case == "paper-dense" else \
        builtin.demo()
    model = ef.compile(data, construction=case.removesuffix("-dense"),
                       width=64 if case == "paper-dense" else 4)
    dtype, ff = (torch.float32, "dense") if case == "paper-dense" else (torch.bfloat16, "profile")
    et.to_torch(model, dtype, ff=ff).save_pretrained(tmp_path, data=data,
                                                     report=ef.verify(model, data))
    card = (tmp_path / "README.md").read_text()
    snippet, out = run_snippet(card, tmp_path)
    out = out[:, :data.d]
    D = np.linalg.norm(out[:, None] - data.floats()[1][0][None], axis=-1)  # own Hausdorff
    misses = not np.max([D.min(axis=1).max(), D.min(axis=0).max()]) <= 1e-5 * \
        data.coordinate_scale()
    assert misses == case.startswith("paper")  # the test's own premise, measured here
    (saved,) = [line for line in card.splitlines() if line.startswith("The module this folder")]
    assert str(dtype).removeprefix("torch.") in saved and f"FFs in {ff} form" in saved
    assert ("does NOT reproduce" in saved) == misses
    assert ("their distinct rows are the target set" in snippet) == (not misses)


def test_recorded_runtime_proofs_must_be_for_the_stored_weights(tmp_path):
    """A folder's config records what the runtime proofs said of its weights. Moved beside
    other weights of the same shape (the paper model's, which float32 does not reproduce),
    that verdict would claim PROVED for them: reading the folder must refuse it."""
    data = builtin.demo()
    keyed, paper = ef.compile(data), ef.compile(data, construction="paper")
    et.to_torch(keyed).save_pretrained(tmp_path / "k", data=data)
    et.to_torch(paper).save_pretrained(tmp_path / "p", data=data)
    ck, cp = (json.loads((tmp_path / f / "config.json").read_text()) for f in "kp")
    assert et.NativeTransformer.from_pretrained(tmp_path / "k").model.n_blocks == keyed.n_blocks
    assert cp["runtime_proofs"]["float32"] != ck["runtime_proofs"]["float32"]  # the premise
    wk, wp = (load_file(str(tmp_path / f / "model.safetensors")) for f in "kp")
    assert any(k not in wp or not torch.equal(v, wp[k]) for k, v in wk.items())
    moved = {k: ck[k] for k in ("runtime_proofs", "runtime_proofs_for")}
    (tmp_path / "p" / "config.json").write_text(json.dumps(cp | moved))
    refused(tmp_path / "p", "runtime_proofs", "model.safetensors")
    del cp["runtime_proofs_for"]  # proofs recorded with nothing naming what they were for
    (tmp_path / "p" / "config.json").write_text(json.dumps(cp))
    refused(tmp_path / "p", "runtime_proofs")
