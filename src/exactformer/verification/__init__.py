"""The verification stage: what ``exactformer.verify`` decides, and the proofs behind it.

``decide`` holds the decision procedure (set and causal), ``report`` the reports, ``shape`` the
model's sizes they list, ``balls`` the rigorous ball evaluation, ``bound`` the softmax error
bounds decided by it, ``certify`` the proof of exactness, ``margins`` the snap margins;
``formats``, ``runtime_boxes``, ``runtime_proof``, ``runtime_keys``, ``runtime_staged``,
``runtime_attention``, ``runtime_scores``, ``runtime_decode`` and ``runtime_verdict`` the proofs
for reduced-precision runtimes (``prove_runtime``). Named ``verification`` so that
``exactformer.verify`` stays the function. See docs/verification.md.
"""

from .decide import check_kind, verify, verify_causal
from .report import CausalReport, Report
from .runtime_verdict import RuntimeVerdict, prove_runtime

__all__ = ["CausalReport", "Report", "RuntimeVerdict", "check_kind", "prove_runtime", "verify",
           "verify_causal"]
