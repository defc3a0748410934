"""The README's "Install with Helm" values table is values.yaml's, key for key."""
from chart import ROOT
from values_table import END, START, table


def test_readme_values_table_matches_values_yaml():
    readme = (ROOT / "README.md").read_text()
    assert START in readme and END in readme, "README.md has no values table markers"
    current = readme[readme.index(START):readme.index(END) + len(END)]
    assert current == table(), \
        "README.md's values table is stale: replace it with `python3 tests/chart/values_table.py`"
