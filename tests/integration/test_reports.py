"""sdiag and sreport on a running cluster: the scheduler's passes and the jobs since the start,
and the period's usage by cluster, user and account, in Slurm's layouts."""

from __future__ import annotations

import time


def test_an_administrator_reads_scheduler_statistics_and_the_days_usage(cluster):
    cluster.run(["sacctmgr", "-i", "add", "account", "physics"])
    cluster.run(["sacctmgr", "-i", "add", "user", "root", "account=physics"])
    job = cluster.sbatch("-n", "4", "--wrap", "sleep 2")
    cluster.wait_for(job)
    out = cluster.run(["sdiag"]).stdout
    assert "Jobs submitted: 1\nJobs started:   1\nJobs completed: 1\n" in out
    main, backfill = (int(part.split()[0]) for part in out.split("Total cycles: ")[1:3])
    assert main + backfill >= 1  # the pass that started the job, quick (main) or full (backfill)

    start, end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 3600)), "now"
    period = [f"start={start}", f"end={end}"]
    out = cluster.run(["sreport", "-P", "-n", "-t", "seconds", "cluster", "utilization", *period]).stdout
    name, allocated, down, planned_down, idle, reserved, reported = out.strip().split("|")
    assert 8 <= int(allocated) <= 4 * 6  # 4 CPUs for about 2 s
    assert abs(int(allocated) + int(idle) - int(reported)) <= 1  # each figure is rounded down alone, as Slurm's
    out = cluster.run(["sreport", "-P", "-n", "-t", "seconds", "user", "top", *period]).stdout
    assert out.split("|")[1:4] == ["root", "root", "physics"]
    out = cluster.run(["sreport", "-n", "-P", "-t", "seconds", "cluster", "AccountUtilizationByUser", *period]).stdout
    rows = [line.split("|")[1:5] for line in out.splitlines()]
    assert [r[:3] for r in rows] == [["root", "", ""], ["physics", "", ""], ["physics", "root", "root"]]
    assert rows[0][3] == rows[1][3] == rows[2][3] == allocated
    out = cluster.run(["sreport", "cluster", "utilization", "-t", "percent", *period]).stdout
    assert out.splitlines()[1].startswith("Cluster Utilization ") and "Usage reported in Percentage of Total" in out
