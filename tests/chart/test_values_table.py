"""docs/install.md's values table is values.yaml's, key for key."""
from chart import ROOT
from values_table import END, START, table

GUIDE = ROOT / "docs" / "install.md"


def test_install_guide_values_table_matches_values_yaml():
    guide = GUIDE.read_text()
    assert START in guide and END in guide, "docs/install.md has no values table markers"
    current = guide[guide.index(START):guide.index(END) + len(END)]
    assert current == table(), \
        "docs/install.md's values table is stale: replace it with `python3 tests/chart/values_table.py`"
