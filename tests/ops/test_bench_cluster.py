"""``python -m bench cluster`` end to end, tiny: one client process, a plain master and
clusters of 1 and 3 shards, half a second each; the saved JSON has a row per target,
the ratios and the Markdown table.

No figure is judged (speed lives in bench/, not in tests): this checks that the bench
runs and reports what it saw (a round that ran past node_timeout on a loaded machine
is a failure it counts, not one this test judges).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import main


@pytest.mark.slow
def test_bench_cluster_measures_every_target_and_saves_its_report(tmp_path: Path) -> None:
    argv = ["cluster", "--quick", "--seconds", "0.5", "--processes", "1", "--shards", "1,3"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "cluster.json").read_text())
    assert report["bench"] == "cluster"
    assert report["plan"]["processes"] == 1
    rows = report["targets"]
    assert [(row["target"], row["shards"], row["servers"]) for row in rows] == [
        ("plain master", None, 1),
        ("cluster, 1 shard", 1, 1),
        ("cluster, 3 shards", 3, 3),
    ]
    for row in rows:
        assert row["operations"] >= 1
        assert all(isinstance(count, int) for count in row["failures"].values())
        assert row["ops_per_s"] > 0
        assert row["p50_us"] <= row["p99_us"]
        assert 0 <= row["machine_cpu_busy"] <= 1
    assert rows[0]["over_plain"] == 1.0
    assert set(report["scale_out"]) == {"3_over_1"}
    markdown = (tmp_path / "cluster.md").read_text()
    assert "| cluster, 3 shards | 3 |" in markdown
    assert "Scale-out (ops/s): 3 shards / 1:" in markdown
