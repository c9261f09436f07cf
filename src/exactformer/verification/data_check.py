"""Which data a verdict is about: the data given against those the model was built for.

``compile`` records the data's sha256 and N in the model (``record.data_sha256``, ``record.N``);
``verify`` compares the data it is given with them and says when they differ, because a verdict
on a subset, or on other data, is true of those data only (docs/verification.md#the-data-checked).
The exactness verdict itself does not depend on this comparison.
"""

from __future__ import annotations

from ..modelio import model_sha256


def data_check(model, dataset) -> dict:
    """The report's ``data`` field: the given data's sha256 and N, the recorded ones (None where
    the model file predates them or records no construction), ``same``: True or False
    when a hash is recorded, else None, and the checked model's own ``model_sha256``."""
    rec = model.record
    stored = getattr(rec, "data_sha256", None)
    given = dataset.sha256()
    return {"sha256": given, "N": dataset.N,
            "built_for_sha256": stored, "built_for_N": None if rec is None else rec.N,
            "same": None if stored is None else stored == given,
            "model_sha256": model_sha256(model)}


def data_row(data: dict) -> str:
    """The table's line on the data (``data`` as :func:`data_check` returns it)."""
    if not data:
        return "not compared"
    n, built = data["N"], data["built_for_N"]
    sizes = "" if built is None else f"built for N = {built}, given N = {n}"
    if data["same"]:
        return f"those the model was built for (sha256 {data['sha256'][:12]}… matches)"
    if data["same"] is False:
        kind = "a subset or other data" if built is not None and n < built else "other data"
        return (f"NOT those the model was built for: sha256 differs ({sizes}: {kind}); "
                "the verdict is about the data given")
    if built is None:
        return "the model records no data to compare with"
    warn = "" if n == built else "; N differs: other data"
    return f"the model records no sha256 of its data ({sizes}{warn})"


def kind_mismatch(model_causal: bool) -> str:
    """The error for a model given data of the other kind, naming the likely fix."""
    if model_causal:
        return ("a causal model is verified on causal data (a target or null per position), "
                "not on set data: read the file as causal (CausalDataset.load, or "
                "load_dataset(path, causal=True))")
    return ("a set model (built from set-to-set pairs) is given causal data: verify it on the "
            "set data it was built for, or build a causal model from these data "
            "(exactformer build DATA --causal)")
