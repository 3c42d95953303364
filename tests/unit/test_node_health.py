"""What the server makes of an agent's GPU health report: the drain reason, which jobs a lost
GPU takes down, and when a drained node may be resumed."""

from __future__ import annotations

from shoal.server.nodes import apply_gpu_health, gpu_health_reason, resume_refusal
from shoal.store.models import JobRow, NodeRow

XID_79 = {"index": 1, "uuid": "GPU-b", "kind": "xid", "xid": 79, "reason": "GPU 1 XID 79 (GPU has fallen off the bus)"}
LOST_1 = {"index": 1, "uuid": "GPU-b", "kind": "lost", "xid": None, "reason": "GPU 1 is lost"}
ECC_2 = {"index": 2, "uuid": "GPU-c", "kind": "ecc", "xid": None, "reason": "GPU 2 has 3 uncorrected ECC error(s)"}


class Controller:
    """Stands in for the scheduling controller: records which jobs a node failure would take."""

    def __init__(self, jobs: list[JobRow]) -> None:
        self.jobs = jobs
        self.failed: list[int] = []

    def fail_node_jobs(self, session, node, now, *, only=None):
        self.failed = [j.id for j in self.jobs if only is None or only(j)]
        return {node} if self.failed else set()


def node(state: str = "UP") -> NodeRow:
    return NodeRow(name="node01", state=state, reason=None, gpu_health=[])


def job(job_id: int, gpus: list[int], where: str = "node01") -> JobRow:
    return JobRow(id=job_id, allocation={"exclusive": False, "nodes": [
        {"name": where, "cpus": 1, "memory_mb": 1, "gpus": gpus}]})


def test_the_reason_names_each_gpu_fault_once_and_fits_the_column():
    assert gpu_health_reason([XID_79, LOST_1, LOST_1]) == "GPU 1 XID 79 (GPU has fallen off the bus); GPU 1 is lost"
    assert len(gpu_health_reason([{**ECC_2, "reason": f"GPU {i} " + "x" * 190} for i in range(3)])) == 255


def test_a_lost_gpu_drains_the_node_and_takes_down_only_the_jobs_holding_it():
    n = node()
    ctl = Controller([job(10, [1]), job(11, [0]), job(12, [0, 1]), job(13, [1], where="node02")])
    touched = apply_gpu_health(None, ctl, n, [XID_79, LOST_1], now=100.0)
    assert (n.state, n.reason, n.reason_time) == ("DRAIN", "GPU 1 XID 79 (GPU has fallen off the bus); GPU 1 is lost", 100.0)
    assert ctl.failed == [10, 12]  # node02's GPU 1 is another GPU
    assert touched == {"node01"}
    assert n.gpu_health == [LOST_1]  # the lasting state is kept, the XID event is not
    assert "GPU 1 is lost" in resume_refusal(n)


def test_an_ecc_error_drains_but_leaves_running_jobs_and_lasts_until_reported_healthy():
    n = node()
    ctl = Controller([job(10, [2])])
    apply_gpu_health(None, ctl, n, [ECC_2], now=1.0)
    assert n.state == "DRAIN" and ctl.failed == []
    assert resume_refusal(n).startswith("node node01 still reports GPU 2 has 3 uncorrected ECC error(s)")
    apply_gpu_health(None, ctl, n, [], now=2.0)
    assert n.gpu_health == [] and resume_refusal(n) is None
    assert n.state == "DRAIN"  # healthy again, but only the administrator resumes it


def test_an_xid_alone_drains_once_and_never_blocks_a_resume():
    n = node()
    apply_gpu_health(None, Controller([]), n, [{**XID_79, "xid": 74, "reason": "GPU 1 XID 74 (NVLink error)"}], 1.0)
    assert (n.state, n.reason) == ("DRAIN", "GPU 1 XID 74 (NVLink error)")
    assert resume_refusal(n) is None


def test_a_node_drained_or_down_for_another_reason_keeps_it():
    for state, reason in (("DRAIN", "maintenance"), ("DOWN", "Not responding")):
        n = node(state)
        n.reason = reason
        apply_gpu_health(None, Controller([]), n, [ECC_2], 1.0)
        assert (n.state, n.reason) == (state, reason)
        assert n.gpu_health == [ECC_2]
