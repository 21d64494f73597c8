"""Every metric name the code logs is documented in docs/metrics.md."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOGGED = re.compile(
    r"\"((?:rollout|actor|advantages|reward|val|time|throughput|data|routing|dynamic_sampling|staleness)/[a-z_@]+)"
)


def test_logged_metric_names_are_documented():
    doc = (REPO / "docs" / "metrics.md").read_text()
    names = set()
    for path in (REPO / "rlinf").rglob("*.py"):
        names.update(LOGGED.findall(path.read_text()))
    assert len(names) > 20
    undocumented = sorted(n for n in names if f"`{n}" not in doc and not n.endswith("/"))
    assert not undocumented, f"document these in docs/metrics.md: {undocumented}"
