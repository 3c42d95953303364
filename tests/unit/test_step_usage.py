"""What sacct shows of an srun step's usage: its nodes' cgroup figures folded into one line."""

from __future__ import annotations

from shoal.cli import sacct
from shoal.server.jobs import step_usage


def test_a_steps_usage_is_its_largest_nodes_peak_and_its_nodes_cpu_summed():
    per_node = {"node02": {"max_rss_kb": 4096, "cpu_s": 1.5, "user_cpu_s": 1.25, "system_cpu_s": 0.25},
                "node01": {"max_rss_kb": 2048, "cpu_s": 3.0, "user_cpu_s": 2.5, "system_cpu_s": 0.5}}
    assert step_usage(per_node) == {"max_rss_kb": 4096, "max_rss_node": "node02", "cpu_s": 4.5,
                                    "user_cpu_s": 3.75, "system_cpu_s": 0.75}
    assert step_usage(None) == {} and step_usage({}) == {}
    # A tie names the first node in order, whatever order the reports came in.
    tie = {"b": {"max_rss_kb": 1}, "a": {"max_rss_kb": 1}}
    assert step_usage(tie)["max_rss_node"] == "a"


def test_sacct_prints_each_steps_own_line():
    job = {"job_id": 7, "name": "train", "state": "COMPLETED", "partition": "gpu", "nodelist": "node[01-02]",
           "nodes": 2, "start_time": 100.0, "end_time": 160.0, "exit_code": 0, "signal": 0,
           "steps": [{"step_id": "batch", "name": "batch", "state": "COMPLETED", "nodelist": "node01",
                      "max_rss_kb": 3072, "max_rss_node": "node01", "cpu_s": 0.25, "user_cpu_s": 0.2,
                      "system_cpu_s": 0.05},
                     {"step_id": "0", "name": "python", "state": "COMPLETED", "nodelist": "node[01-02]",
                      **step_usage({"node01": {"max_rss_kb": 204800, "cpu_s": 61.0, "user_cpu_s": 60.0,
                                               "system_cpu_s": 1.0},
                                    "node02": {"max_rss_kb": 102400, "cpu_s": 59.0, "user_cpu_s": 58.5,
                                               "system_cpu_s": 0.5}})}]}
    out = sacct.render_sacct([job], sacct.parse_args(["-a", "-n", "-P", "-o", "JobID,MaxRSS,MaxRSSNode,TotalCPU"]),
                             200.0)
    assert out.splitlines() == ["7|||02:00.250", "7.batch|3M|node01|00:00.250", "7.0|200M|node01|00:02:00"]
