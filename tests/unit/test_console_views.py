"""The console's own figures: the GPU grid's colours, partitions' totals, GPU-hours; and the
cookie's and login's rules."""

from shoal.server.console import cookie_credential, local_path
from shoal.server.console.views import Holder, gpu_grid, gpu_hours, gpu_hours_over_time, partition_totals


def node(name, state="UP", display="idle", gpus=4, partitions=("gpu",), health=()):
    return {"name": name, "state": state, "display_state": display, "reason": "bad fan" if state != "UP" else None,
            "partitions": list(partitions), "gpu_health": list(health),
            "gpus": [{"index": i, "product": "NVIDIA H100 80GB HBM3", "memory_mb": 81920} for i in range(gpus)]}


def alloc(*pairs):
    return {"nodes": [{"name": n, "gpus": list(g), "cpus": 1, "memory_mb": 1} for n, g in pairs]}


def test_each_gpu_is_coloured_by_its_holder_and_private_jobs_stay_anonymous():
    nodes = [node("a", display="mix"), node("b", state="DRAIN", display="drng"), node("c", state="DOWN", display="down")]
    holders = [Holder(7, "batch", "train", "alice", None, alloc(("a", [0, 1]), ("b", [3]))),
               Holder(9, "pod", "web-1", "bob", "default", alloc(("a", [2]))),
               Holder(5, "batch", "", "", None, alloc(("a", [1, 3])), completing=True)]
    grid = gpu_grid(nodes, holders, {("a", 0): 87.0}, visible=lambda h: h.user == "alice")
    a, b, c = ([cell["holder"] for cell in n["gpus"]] for n in grid)
    assert a == ["training", "training", "serving", "completing"]  # the running job wins GPU 1
    assert b == ["drained", "drained", "drained", "training"]
    assert c == ["down"] * 4
    cells = grid[0]["gpus"]
    assert cells[0]["utilisation"] == 87.0 and cells[1]["utilisation"] is None
    assert cells[0]["job"]["job_id"] == 7
    assert cells[2]["job"] is None  # bob's pod: coloured, not named, for alice
    assert cells[0]["model"] == "NVIDIA H100 80GB HBM3"


def test_unhealthy_gpus_are_marked():
    grid = gpu_grid([node("a", health=[{"index": 2, "kind": "ecc"}])], [], {}, visible=lambda h: True)
    assert [c["healthy"] for c in grid[0]["gpus"]] == [True, True, False, True]


def test_partition_totals_count_a_node_in_each_of_its_partitions():
    grid = gpu_grid([node("a", partitions=("gpu", "all")), node("b", state="DRAIN", partitions=("all",))],
                    [Holder(1, "batch", "x", "u", None, alloc(("a", [0])))], {}, visible=lambda h: True)
    totals = {t["partition"]: t for t in partition_totals(grid)}
    gpu = totals["gpu"]
    assert (gpu["nodes"], gpu["gpus"], gpu["training"], gpu["idle"], gpu["drained"]) == (1, 4, 1, 3, 0)
    assert (totals["all"]["nodes"], totals["all"]["drained"], totals["all"]["training"]) == (2, 4, 1)


def test_gpu_hours_per_account_and_user_run_until_now_for_running_jobs():
    rows = [("alice", "ml", 0.0, 3600.0, alloc(("a", [0, 1]))),      # 2 GPUs for an hour
            ("alice", "ml", 0.0, None, alloc(("a", [2]), ("b", [0]))),  # 2 GPUs, still running
            ("bob", None, 0.0, 7200.0, alloc(("b", [1]))),            # default account
            ("carol", "ml", None, None, None)]                        # never started
    out = gpu_hours(rows, now=1800.0)
    assert out["accounts"] == [{"account": "(default account)", "gpu_hours": 2.0, "busy_gpu_hours": 0.0},
                               {"account": "ml", "gpu_hours": 3.0, "busy_gpu_hours": 0.0}]
    assert {(u["user"], u["gpu_hours"]) for u in out["users"]} == {("alice", 3.0), ("bob", 2.0)}


def test_the_cookie_counts_only_with_the_consoles_header_and_never_over_a_real_header():
    assert cookie_credential(None, "tok", "1") == "Bearer tok"
    assert cookie_credential(None, "tok", None) is None  # a cross-site form cannot add the header
    assert cookie_credential("Bearer mine", "tok", "1") == "Bearer mine"


def test_a_login_goes_on_only_to_a_console_page():
    assert local_path("/console/jobs/7") == "/console/jobs/7"
    for bad in ("https://evil.example/", "//evil.example/console/", "/console/..//evil", "/shoal/v1/tokens"):
        assert local_path(bad) == "/console/overview", bad


def test_gpu_hours_count_busy_hours_where_the_agents_sampled_them():
    rows = [("alice", "ml", 0.0, 3600.0, alloc(("a", [0, 1])))]
    out = gpu_hours(rows, now=3600.0, busy={("ml", "alice"): 0.5})
    assert out["accounts"] == [{"account": "ml", "gpu_hours": 2.0, "busy_gpu_hours": 0.5}]
    assert out["users"][0]["busy_gpu_hours"] == 0.5


def test_gpu_hours_over_time_split_runs_across_buckets_sized_to_the_span():
    rows = [("alice", "ml", 7200.0, 7200.0 + 5400, alloc(("a", [0, 1]))),    # 2 GPUs, 90 min from 2:00
            ("bob", None, 9000.0, None, alloc(("b", [0]))),                  # 1 GPU since 2:30, running
            ("carol", "ml", None, None, None)]                               # never started
    out = gpu_hours_over_time(rows, now=7200.0 + 8 * 3600)
    assert out["bucket_s"] == 900 and out["start"] == 7200.0 and out["buckets"] == 33  # 8 h in 15 min bars
    ml, bob = out["accounts"]["ml"], out["accounts"]["(default account)"]
    assert ml[:6] == [0.5] * 6 and ml[6:] == [0.0] * 27  # 2 GPUs x 15 min a bar for 90 min
    assert bob[:2] == [0.0, 0.0] and bob[2:32] == [0.25] * 30 and bob[32] == 0.0
    assert abs(sum(ml) - 3.0) < 1e-9 and set(out["users"]) == {"alice", "bob"}
    # A year of accounting fits in weekly bars; nothing started: no bars.
    assert gpu_hours_over_time(rows, now=7200.0 + 365 * 86400)["bucket_s"] == 7 * 86400
    assert gpu_hours_over_time([], now=1.0)["buckets"] == 0
