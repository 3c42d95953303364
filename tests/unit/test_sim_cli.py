"""`shoal simulate` end to end on the sample traces: reports, plots and option parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoal.cli.main import main as shoal
from shoal.sched import SchedConfig
from shoal.sim.cli import UsageError, parse_duration, parse_failure, parse_policy

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
CLUSTER = str(TRACES / "cluster-sim.yaml")


def test_simulate_writes_reports_and_readable_plots(tmp_path, capsys):
    out = tmp_path / "out"
    rc = shoal(["simulate", "--cluster", CLUSTER, "--trace", str(TRACES / "helios_cluster_log.csv"),
                "--policy", "fifo,backfill", "--out", str(out), "--fail", "dgx01@1h+30m"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "JCT p99" in table and "fifo" in table and "backfill" in table
    report = json.loads((out / "report.json").read_text())
    assert [p["label"] for p in report["policies"]] == ["fifo", "backfill"]
    assert report["trace"] == {"file": str(TRACES / "helios_cluster_log.csv"), "format": "helios",
                               "jobs": 30, "skipped": {}}
    assert report["failures"] == [{"nodes": ["dgx01"], "at": 3600.0, "down_for": 1800.0}]
    for name in ("utilisation.png", "wait_cdf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "jobs-backfill.csv").read_text().count("\n") == 31  # header + 30 jobs


def test_json_output_on_stdout(capsys):
    rc = shoal(["simulate", "--cluster", CLUSTER, "--trace", str(TRACES / "sample.swf"),
                "--policy", "backfill", "--json", "--limit", "5"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    (policy,) = data["policies"]
    assert policy["jobs"] == 5 and policy["share_resource"] == "cpu"
    assert "series_t" not in policy  # the series go to --out only


def test_an_unknown_policy_is_a_usage_error(capsys):
    rc = shoal(["simulate", "--cluster", CLUSTER, "--trace", str(TRACES / "philly.csv"),
                "--policy", "lottery"])
    assert rc == 2
    assert "unknown scheduling policy 'lottery'" in capsys.readouterr().err


def test_a_cluster_file_without_sim_nodes_says_what_to_add(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("partitions:\n  - {name: gpu, nodes: 'n[1-2]'}\n")
    rc = shoal(["simulate", "--cluster", str(path), "--trace", str(TRACES / "philly.csv")])
    assert rc == 2 and "sim_nodes is required" in capsys.readouterr().err


def test_failure_and_duration_forms():
    assert parse_failure("dgx[01-02]@6h+30m").nodes == ("dgx01", "dgx02")
    assert (parse_failure("n1@90").at, parse_failure("n1@90").down_for) == (90, None)
    assert [parse_duration(x) for x in ("45", "2m", "1.5h", "1d", "1-00:00:00", "01:00:00")] == \
        [45, 120, 5400, 86400, 86400, 3600]
    with pytest.raises(UsageError):
        parse_failure("n1")
    with pytest.raises(UsageError):
        parse_duration("soon")


def test_policy_specs_set_sched_config_fields():
    label, config = parse_policy("backfill:max_jobs_per_pass=100", {"kill_invalid_depend": True})
    assert label == "backfill:max_jobs_per_pass=100"
    assert (config.policy, config.max_jobs_per_pass, config.kill_invalid_depend) == ("backfill", 100, True)
    assert parse_policy("fifo", {})[1] == SchedConfig(policy="fifo")
