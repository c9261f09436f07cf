"""What reading and validating data can raise or warn (docs/problem.md#validation-rules)."""


class DatasetError(ValueError):
    """A dataset breaks a rule of docs/problem.md; the message names the pair and the rule."""


class DuplicatePairWarning(UserWarning):
    """Two inputs are equal as sets and so are their targets: the pairs were merged."""
