"""A model is prepared for a pass (evaluate/jobs.py, ``Job.of``) once per verify.

A causal verify whose enclosure is not the plain float64 pass runs both, and both read the
same layer forms, gates and runs: ``one_job_per_model`` lets them share one Job. The sharing
must end with the verify: a model changed in place between two verifies is prepared again
and judged as it is now.
"""

from __future__ import annotations

import numpy as np
import pytest

import exactformer as ef
from exactformer.evaluate import jobs
from exactformer.evaluate.arithmetic import Arithmetic

TEXTS = ["1the cat sat on the mat", "2the cat ate the rat", "3a cat sat by the hat"]


@pytest.fixture
def prepared(monkeypatch):
    """Counts the Jobs made from scratch."""
    made = []
    real = jobs.Job._prepare.__func__

    def counting(cls, model, *args):
        made.append(model)
        return real(cls, model, *args)

    monkeypatch.setattr(jobs.Job, "_prepare", classmethod(counting))
    return made


def _keyed_softmax():
    data = ef.CausalDataset.from_text(TEXTS)
    return ef.compile(data, attention="softmax", exact=False), data


def test_a_causal_verify_prepares_its_model_once_for_both_passes(prepared, monkeypatch):
    model, data = _keyed_softmax()
    passes = []
    real_forward = ef.verification.decide.forward_causal

    def forward(*args, **kw):
        passes.append("float64")
        return real_forward(*args, **kw)

    monkeypatch.setattr(ef.verification.decide, "forward_causal", forward)
    report = ef.verify(model, data)
    assert report.ok
    assert passes == ["float64"]  # the enclosure did not stand in for the float64 pass
    assert len(prepared) == 1 and prepared[0] is model


def test_a_model_changed_between_two_verifies_is_prepared_again(prepared):
    model, data = _keyed_softmax()
    assert ef.verify(model, data).ok
    last = next(b.ff for b in reversed(model.blocks) if b.ff is not None and b.ff.W.any())
    last.W *= 2.0  # in place: the same object, other outputs
    report = ef.verify(model, data)
    assert not report.ok  # (the failing verify may run further passes, of other models)
    assert sum(m is model for m in prepared) == 2


def test_within_the_scope_one_job_per_arithmetic_temperature_and_mode(prepared):
    model, _ = _keyed_softmax()
    f64 = Arithmetic("float")
    with jobs.one_job_per_model():
        first = jobs.Job.of(model, f64, None)
        assert jobs.Job.of(model, f64, None) is first
        assert jobs.Job.of(model, f64, None, causal=True) is first  # (the model's own mode)
        assert jobs.Job.of(model, f64, 0.5) is not first
        assert jobs.Job.of(model, f64, None, causal=False) is not first
        assert jobs.Job.of(model, Arithmetic("mp", 30), None) is not first
    assert jobs.Job.of(model, f64, None) is not first
    assert len(prepared) == 5
    assert np.all([m is model for m in prepared])
