"""The verification stage: what ``exactformer.verify`` decides, and the proofs behind it.

``report`` holds the decision procedure and the reports, ``certify`` the ball-arithmetic proof
of softmax models. Named ``verification`` so that ``exactformer.verify`` stays the function.
See docs/verification.md.
"""

from .report import CausalReport, Report, verify, verify_causal

__all__ = ["CausalReport", "Report", "verify", "verify_causal"]
