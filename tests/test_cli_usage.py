"""Small things a user meets first: "did you mean" for a mistyped command, option or choice,
and datasets that print as a short summary instead of every array."""

from __future__ import annotations

import pytest

import exactformer as ef
from exactformer.cli import main


@pytest.mark.parametrize("argv, hint", [
    (["build", "d.json", "-o", "m.json", "--atention", "softmax"], "did you mean --attention?"),
    (["buidl", "d.json"], "did you mean build?"),
    (["build", "d.json", "-o", "m.json", "--attention", "sofmax"], "did you mean softmax?"),
    (["verify", "m.json", "d.json", "--jsn", "r.json"], "did you mean --json?"),
])
def test_a_mistyped_word_gets_the_nearest_one(capsys, argv, hint):
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and hint in err and len(err.strip().splitlines()) == 1


def test_a_word_far_from_every_option_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        main(["build", "d.json", "-o", "m.json", "--zzzz"])
    assert "did you mean" not in capsys.readouterr().err


def test_datasets_print_short():
    data = ef.Dataset.from_arrays([[[0, 1], [2, 3]], [["1/2", 0]]], [[[1, 1]], [[0, 0]]])
    assert repr(data) == "Dataset(N=2, d=2, lengths 1..2, Σm=2, exact)"
    big = ef.Dataset.from_arrays([[[float(i), 1.0]] for i in range(500)],
                                 [[[float(i), 1.0]] for i in range(500)])
    assert repr(big) == "Dataset(N=500, d=2, lengths 1..1, Σm=500, float64)"
    text = ef.CausalDataset.from_text("hello world")
    assert repr(text) == "CausalDataset(N=1, d=8, lengths 11..11, 10 constrained, float64)"



def test_a_warning_is_one_line_naming_the_command(tmp_path):
    import json
    import os
    import subprocess
    import sys

    code = {c: [k, k % 3] for k, c in enumerate("abcdefg")}
    text = "abcdef"  # set data that look like a text's next characters: a --causal hint
    (tmp_path / "d.json").write_text(json.dumps(
        {"inputs": [[code[c] for c in text]], "targets": [[code[c] for c in text[1:] + "g"]]}))
    done = subprocess.run([sys.executable, "-m", "exactformer.cli", "build",
                           str(tmp_path / "d.json"), "-o", str(tmp_path / "m.json")],
                          capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert done.returncode == 0, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("exactformer build: warning: ")
    assert "--causal" in err[0] and ".py:" not in err[0]
