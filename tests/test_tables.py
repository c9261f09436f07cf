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


def test_a_pipe_in_a_markdown_header_or_cell_does_not_split_its_column():
    from exactformer.tables import markdown_table
    text = markdown_table([{"max|θ|": "a|b", "L": 3}], ["max|θ|", "L"])
    head, rule, row = text.splitlines()
    assert rule == "|---|---|"
    for line in (head, row):  # two columns: three unescaped pipes
        assert len([i for i, ch in enumerate(line) if ch == "|" and line[i - 1] != "\\"]) == 3
    assert "max\\|θ\\|" in head and "a\\|b" in row
