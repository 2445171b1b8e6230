"""``python -m bench profile`` end to end, tiny: a few hundred operations per row, two
rounds, the working tree against ``HEAD``; the saved JSON has every row for 1 and 5
nodes on both sides, and the Markdown has the tables.

No figure is judged (speed lives in bench/, not in tests): this checks that the bench
runs (it fails when a side's worker imported the other side's celery_redlock) and
reports what it saw.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_profile_measures_every_layer_on_both_sides_and_saves_its_report(
    tmp_path: Path,
) -> None:
    argv = ["profile", "--quick", "--operations", "300", "--warmup", "30", "--rounds", "2"]
    assert main([*argv, "--against", "HEAD", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["bench"] == "profile"
    assert report["plan"]["operations"] == 300
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert report["against"] == {"rev": "HEAD", "sha": head}
    assert report["working_tree"]["describe"]
    for side in ("working_tree", "against"):
        assert set(report["sides"][side]) == {"1", "5"}
        for nodes, rows in report["sides"][side].items():
            assert list(rows) == ["floor", "lean", "wire", "lock_layer", "full"], (side, nodes)
            for row, figures in rows.items():
                assert "error" not in figures, (side, nodes, row)
                assert len(figures["runs"]) == 2
                assert figures["wall_us"] > 0
                assert figures["user_us"] >= 0 and figures["system_us"] >= 0
                assert figures["cpu_us"] > 0
                assert figures["failed"] <= 2 * 300 // 100
            split = report["split"][side][nodes]
            assert split["full_us"] == rows["full"]["user_us"]
            assert split["lean_us"] == rows["lean"]["user_us"]
            assert split["full_over_lean_cpu"] > 0
    markdown = (tmp_path / "profile.md").read_text()
    assert "| row | nodes | user µs | system µs |" in markdown
    assert "| lock layer | 5 |" in markdown
    assert "| nodes | floor | wire's Python | lock layer | full | unexplained |" in markdown
    assert "| lean Python | 5 |" in markdown
    assert "| nodes | lean user µs | full user µs | full ÷ lean, user + system |" in markdown
    assert "| row | nodes | `HEAD` | working tree | working tree ÷ `HEAD` |" in markdown
    assert f"`HEAD` is {head[:10]}" in markdown
    assert report["compiled"] is False
