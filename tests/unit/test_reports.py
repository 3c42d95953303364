"""sreport's figures (usage_report) and layouts, and sdiag's, as pure functions."""

from __future__ import annotations

from shoal.cli import sdiag, sreport
from shoal.model.accounting import UsageRecord
from shoal.server.reports import usage_report

DAY = 86400.0
RECORDS = (
    UsageRecord("alice", "physics", gpus=4, cpus=8, start=-3600, end=3600),  # half of it in the period
    UsageRecord("bob", "chem", gpus=0, cpus=2, start=7200, end=None),  # still running at the period's end
    UsageRecord("carol", None, gpus=1, cpus=1, start=DAY + 10, end=DAY + 20),  # after the period
)
ACCOUNTS = [{"name": "root", "parent": None}, {"name": "physics", "parent": "root"},
            {"name": "chem", "parent": "root"}]


def report() -> dict:
    return usage_report(RECORDS, {"cpu": 16, "gres/gpu": 8}, 0.0, DAY)


def test_usage_within_the_period_only_and_the_clusters_capacity_over_it():
    doc = report()
    assert doc["allocated"] == {"cpu": 8 * 3600 + 2 * (DAY - 7200), "gres/gpu": 4 * 3600}
    assert doc["reported"] == {"cpu": 16 * DAY, "gres/gpu": 8 * DAY}
    assert [(u["user"], u["account"]) for u in doc["users"]] == [("alice", "physics"), ("bob", "chem")]


def test_the_three_reports_in_sreports_parsable_form():
    kind, o = sreport.parse(["-P", "-n", "-t", "hours", "cluster", "utilization", "start=2026-01-01", "end=2026-01-02"],
                            now=0)
    assert kind == "utilization"
    assert sreport.render_report(kind, report(), ACCOUNTS, "c1", o) == "c1|52|0|0|332|0|384\n"
    kind, o = sreport.parse(["-P", "-n", "-T", "gres/gpu", "-t", "percent", "user", "top"], now=DAY)
    assert sreport.render_report(kind, report(), ACCOUNTS, "c1", o) == "c1|alice|alice|physics|2.08%|0\n"
    kind, o = sreport.parse(["-p", "-n", "-t", "hours", "cluster", "AccountUtilizationByUser"], now=DAY)
    assert sreport.render_report(kind, report(), ACCOUNTS, "c1", o) == (
        "c1|root|||52|0|\nc1|chem|||44|0|\nc1|chem|bob|bob|44|0|\nc1|physics|||8|0|\nc1|physics|alice|alice|8|0|\n")


def test_sdiag_counts_every_pass_as_the_main_schedulers_and_full_ones_that_left_jobs_as_backfill():
    quick = {"count": 3, "started": 1, "sum_s": 0.003, "depth_sum": 3, "queue_sum": 3, "max_s": 0.002,
             "last_s": 0.001, "last_queue": 1, "last_when": 100.0, "last_depth": 1}
    full = {**quick, "count": 1, "started": 2, "sum_s": 0.01, "max_s": 0.01, "last_s": 0.01, "last_when": 50.0}
    doc = {"now": 200.0, "since": 0.0, "submitted": 4, "started": 3, "completed": 2, "canceled": 0, "failed": 1,
           "pending": 1, "running": 0, "cycles": {"quick": quick, "full": full}}
    out = sdiag.render_diag(doc)
    assert "\tLast cycle:   1000\n\tMax cycle:    10000\n\tTotal cycles: 4\n\tMean cycle:   3250\n" in out
    assert "\tCycles per minute: 1\n" in out and "Total backfilled jobs (since last slurm start): 2\n" in out
