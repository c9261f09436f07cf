"""One table format for every printed report: labels padded to one width, two spaces, value."""

from exactformer import compile, verify
from exactformer.data import builtin
from exactformer.tables import format_table


def test_labels_are_padded_to_the_longest():
    text = format_table([("a", 1), ("longer label", "x  y"), ("ρ", None)])
    assert text.splitlines() == ["a             1", "longer label  x  y", "ρ             None"]
    assert format_table([]) == ""


def test_the_verification_report_is_such_a_table():
    data = builtin.shared_pool(N=3, d=2, pool=4, n_max=3, m_max=2, seed=1)
    report = verify(compile(data), data)
    assert report.table() == format_table(report.rows())
    width = max(len(k) for k, _ in report.rows())
    assert all(line[width:width + 2] == "  " for line in report.table().splitlines())
