"""Deployment rollouts as kube-controller-manager carries them out: the stories an operator of an
inference service lives through (first start, rolling update, Recreate, undo, a stuck rollout,
a pause), driven through the pure controller functions by a small stand-in for the server."""

import copy

import pytest
from hypothesis import given, settings, strategies as st

from shoal.kube.rollout import (
    HASH_LABEL,
    REVISION_ANNOTATION,
    NewReplicaSet,
    PodView,
    RSView,
    parse_time,
    plan_rollout,
    replicaset_manifest,
    replicaset_pod_diff,
    replicaset_status,
    resolve_fenceposts,
    rollback_template,
    scaled_value,
    template_hash,
)

T0 = 1_764_700_000.0


def deployment(replicas=4, image="vllm/vllm-openai:v1", strategy=None, **spec) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "default", "generation": 1, "uid": "u-1"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "llm"}},
            "template": {"metadata": {"labels": {"app": "llm"}},
                         "spec": {"containers": [{"name": "vllm", "image": image}]}},
            "strategy": strategy or {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%",
                                                                               "maxUnavailable": "25%"}},
            "minReadySeconds": 0, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600, "paused": False,
            **spec,
        },
    }


class Cluster:
    """The server's part, in miniature: apply each plan, let the ReplicaSet controller make and
    delete pods, and let pods become ready ``start_s`` after they are made (never, if None)."""

    def __init__(self, deploy: dict, start_s: float | None = 10.0, now: float = T0):
        self.deploy = deploy
        self.rs: dict[str, dict] = {}
        self.now = now
        self.start_s = start_s
        self.serial = 0
        self.plans = []

    def views(self) -> list[RSView]:
        min_ready = self.deploy["spec"].get("minReadySeconds", 0)
        out = []
        for name, r in self.rs.items():
            counts = replicaset_status(r["pods"], min_ready, self.now)
            out.append(RSView(name, r["revision"], r["hash"], r["replicas"], ready=counts["readyReplicas"],
                              available=counts["availableReplicas"], created=r["created"],
                              current=counts["replicas"], terminating=counts["terminatingReplicas"]))
        return out

    def available(self) -> int:
        return sum(v.available for v in self.views())

    def sync(self):
        plan = plan_rollout(self.deploy, self.views(), self.now)
        self.plans.append(plan)
        if plan.create is not None:
            self.rs[plan.create.name] = {"revision": plan.create.revision, "hash": plan.create.template_hash,
                                         "replicas": plan.create.replicas, "created": self.now, "pods": []}
        for name, n in plan.replicas.items():
            self.rs[name]["replicas"] = n
        for name, rev in plan.revisions.items():
            self.rs[name]["revision"] = rev
        for name in plan.delete:
            del self.rs[name]
        self.deploy = {**self.deploy, "status": dict(plan.status)}
        for name, r in self.rs.items():
            to_create, to_delete = replicaset_pod_diff(r["replicas"], r["pods"])
            r["pods"] = [p for p in r["pods"] if p not in to_delete]
            for _ in range(to_create):
                self.serial += 1
                r["pods"].append(PodView(f"{name}-{self.serial}", created=self.now, node="gpu01", phase="Pending"))
        return plan

    def tick(self, seconds: float = 5.0):
        self.now += seconds
        for r in self.rs.values():
            r["pods"] = [self._started(p) for p in r["pods"]]

    def _started(self, p: PodView) -> PodView:
        if p.ready or self.start_s is None or self.now - p.created < self.start_s:
            return p
        return PodView(p.name, p.created, p.node, "Running", True, p.created + self.start_s)

    def settle(self, max_steps: int = 200, check=None):
        """Sync and tick until nothing changes and the rollout is complete."""
        for _ in range(max_steps):
            plan = self.sync()
            if check:
                check(self)
            desired = self.deploy["spec"]["replicas"]
            progressing = _cond(plan.status, "Progressing")
            if progressing and progressing["reason"] == "NewReplicaSetAvailable" and not plan.delete \
                    and plan.status["updatedReplicas"] == plan.status["availableReplicas"] == desired \
                    and all(v.replicas == v.pods for v in self.views()):
                return plan
            self.tick()
        raise AssertionError("rollout did not finish")

    def set_image(self, image: str):
        d = copy.deepcopy(self.deploy)
        d["spec"]["template"]["spec"]["containers"][0]["image"] = image
        d["metadata"]["generation"] += 1
        self.deploy = d

    def replicas(self) -> dict[int, int]:
        return {r["revision"]: r["replicas"] for r in self.rs.values()}


def _cond(status, kind):
    return next((c for c in status.get("conditions", ()) if c["type"] == kind), None)


# -- template hash and ReplicaSet objects ----------------------------------------------------

def test_template_hash_is_ten_safe_characters_and_stable():
    d = deployment()
    h = template_hash(d["spec"]["template"])
    assert len(h) == 10 and set(h) <= set("bcdfghjklmnpqrstvwxz2456789")
    reordered = {"spec": d["spec"]["template"]["spec"], "metadata": d["spec"]["template"]["metadata"]}
    assert template_hash(reordered) == h
    labelled = copy.deepcopy(d["spec"]["template"])
    labelled["metadata"]["labels"][HASH_LABEL] = h
    assert template_hash(labelled) == h  # a ReplicaSet's template hashes like its Deployment's
    assert template_hash(deployment(image="vllm/vllm-openai:v2")["spec"]["template"]) != h


def test_replicaset_manifest_carries_the_hash_revision_and_owner():
    d = deployment()
    d["metadata"]["annotations"] = {"kubernetes.io/change-cause": "first release",
                                    "kubectl.kubernetes.io/last-applied-configuration": "{}"}
    h = template_hash(d["spec"]["template"])
    rs = replicaset_manifest(d, NewReplicaSet(f"llm-{h}", h, 1, 1))
    assert rs["metadata"]["name"] == f"llm-{h}"
    assert rs["metadata"]["labels"] == {"app": "llm", HASH_LABEL: h}
    assert rs["metadata"]["annotations"] == {"kubernetes.io/change-cause": "first release",
                                             REVISION_ANNOTATION: "1",
                                             "deployment.kubernetes.io/desired-replicas": "4",
                                             "deployment.kubernetes.io/max-replicas": "5"}
    assert rs["metadata"]["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm",
                                                  "controller": True, "blockOwnerDeletion": True, "uid": "u-1"}]
    assert rs["spec"]["selector"] == {"matchLabels": {"app": "llm", HASH_LABEL: h}}
    assert rs["spec"]["template"]["metadata"]["labels"][HASH_LABEL] == h
    assert "pod-template-hash" not in d["spec"]["template"]["metadata"]["labels"]  # the Deployment is untouched
    assert rollback_template(rs["spec"]["template"]) == d["spec"]["template"]


@pytest.mark.parametrize("surge, unavailable, desired, expected", [
    ("25%", "25%", 10, (3, 2)),  # surge rounds up, unavailable down
    ("25%", "25%", 4, (1, 1)),
    ("25%", "25%", 1, (1, 0)),
    (1, 0, 4, (1, 0)),
    ("0%", "10%", 3, (0, 1)),  # both come to 0: one pod may be unavailable
    (0, 0, 5, (0, 1)),
    ("100%", "100%", 3, (3, 3)),
])
def test_fenceposts_resolve_like_kubernetes(surge, unavailable, desired, expected):
    assert resolve_fenceposts(surge, unavailable, desired) == expected


def test_scaled_value_refuses_what_is_not_a_percent():
    assert scaled_value("50%", 3, True) == 2 and scaled_value("50%", 3, False) == 1
    with pytest.raises(ValueError, match="percentage"):
        scaled_value("half", 3, True)


# -- stories ---------------------------------------------------------------------------------

def test_a_new_deployment_scales_up_from_zero():
    c = Cluster(deployment(replicas=4))
    first = c.sync()
    h = template_hash(c.deploy["spec"]["template"])
    assert first.create == NewReplicaSet(f"llm-{h}", h, 1, 4)
    assert first.new_replicaset == f"llm-{h}" and first.revision == 1
    assert first.status["replicas"] == 0 and first.status["unavailableReplicas"] == 4
    assert _cond(first.status, "Available")["reason"] == "MinimumReplicasUnavailable"
    assert _cond(first.status, "Progressing")["reason"] == "NewReplicaSetCreated"
    assert _cond(first.status, "Progressing")["message"] == f'Created new replica set "llm-{h}"'
    done = c.settle()
    assert {k: done.status[k] for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas",
                                        "unavailableReplicas", "observedGeneration")} == {
        "replicas": 4, "updatedReplicas": 4, "readyReplicas": 4, "availableReplicas": 4, "unavailableReplicas": 0,
        "observedGeneration": 1}
    assert _cond(done.status, "Available")["status"] == "True"
    progressing = _cond(done.status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "NewReplicaSetAvailable")
    assert progressing["message"] == f'ReplicaSet "llm-{h}" has successfully progressed.'
    assert c.sync().replicas == done.replicas  # level-triggered: nothing more to do


def test_rolling_update_with_surge_one_never_drops_below_four_available():
    c = Cluster(deployment(replicas=4, strategy={"type": "RollingUpdate",
                                                 "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}))
    c.settle()
    c.set_image("vllm/vllm-openai:v2")
    steps = []

    def check(cluster):
        assert cluster.available() >= 4
        assert sum(cluster.replicas().values()) <= 5
        state = (cluster.replicas()[1], cluster.replicas().get(2, 0))
        if not steps or steps[-1] != state:
            steps.append(state)

    done = c.settle(check=check)
    # (old, new): one new pod at a time, an old one goes only once a new one is available
    assert steps == [(4, 1), (3, 1), (3, 2), (2, 2), (2, 3), (1, 3), (1, 4), (0, 4)]
    assert done.revision == 2
    assert done.status["updatedReplicas"] == 4 and done.status["observedGeneration"] == 2
    assert c.replicas() == {1: 0, 2: 4}  # the old ReplicaSet stays, empty, for rollout undo


def test_percentages_resolve_against_the_desired_count():
    c = Cluster(deployment(replicas=10))
    c.settle()
    c.set_image("vllm/vllm-openai:v2")
    plan = c.sync()
    # 25% of 10: surge 3 (up), unavailable 2 (down); both steps happen in the first sync
    assert plan.create.replicas == 3
    assert c.replicas() == {1: 8, 2: 3}

    def check(cluster):
        assert sum(cluster.replicas().values()) <= 13
        assert cluster.available() >= 8

    c.settle(check=check)
    assert c.replicas() == {1: 0, 2: 10}


def test_recreate_takes_every_old_pod_away_before_starting_new_ones():
    d = deployment(replicas=2, strategy={"type": "Recreate"})
    old_hash = template_hash(d["spec"]["template"])
    d = copy.deepcopy(d)
    d["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v2"
    old = RSView(f"llm-{old_hash}", 1, old_hash, replicas=2, ready=2, available=2, created=T0, current=2)
    plan = plan_rollout(d, [old], T0 + 100)
    assert plan.replicas == {old.name: 0} and plan.create is None and plan.new_replicaset is None
    shutting_down = RSView(old.name, 1, old_hash, replicas=0, created=T0, current=0, terminating=2)
    plan = plan_rollout({**d, "status": plan.status}, [shutting_down], T0 + 105)
    assert plan.create is None  # the GPUs are not free yet: wait
    gone = RSView(old.name, 1, old_hash, replicas=0, created=T0, current=0)
    plan = plan_rollout({**d, "status": plan.status}, [gone], T0 + 130)
    assert plan.create.replicas == 2 and plan.create.revision == 2
    assert plan.replicas == {old.name: 0, plan.create.name: 2}


def test_recreate_story_never_runs_old_and_new_together():
    c = Cluster(deployment(replicas=3, strategy={"type": "Recreate"}))
    c.settle()
    c.set_image("vllm/vllm-openai:v2")

    def check(cluster):
        running = {r["revision"]: len(r["pods"]) for r in cluster.rs.values()}
        assert not (running.get(1) and running.get(2))

    c.settle(check=check)
    assert c.replicas() == {1: 0, 2: 3}


def test_undo_brings_the_old_replicaset_back_under_a_new_revision():
    c = Cluster(deployment(replicas=2))
    c.settle()
    v1_template = copy.deepcopy(c.deploy["spec"]["template"])
    v1_name = next(iter(c.rs))
    c.set_image("vllm/vllm-openai:v2")
    c.settle()
    assert c.replicas() == {1: 0, 2: 2}
    # rollout undo: the Deployment takes revision 1's template again
    d = copy.deepcopy(c.deploy)
    d["spec"]["template"] = rollback_template(v1_template)
    d["metadata"]["generation"] += 1
    c.deploy = d
    plan = c.sync()
    assert plan.create is None
    assert plan.new_replicaset == v1_name
    assert plan.revisions == {v1_name: 3} and plan.revision == 3
    c.settle()
    assert c.replicas() == {3: 2, 2: 0}
    assert len(c.rs) == 2  # no third ReplicaSet


def test_old_replicasets_beyond_the_history_limit_are_deleted_oldest_revision_first():
    d = deployment(replicas=2, revisionHistoryLimit=2)
    h = template_hash(d["spec"]["template"])
    current = RSView(f"llm-{h}", 5, h, 2, ready=2, available=2, created=T0 + 50, current=2)
    olds = [RSView(f"llm-old{r}", r, f"old{r}", 0, created=T0 + r, current=0) for r in (1, 2, 3, 4)]
    busy = RSView("llm-old0", 0, "old0", 0, created=T0, current=0, terminating=1)
    status = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    plan = plan_rollout({**d, "status": status}, [current, busy, *olds], T0 + 100)
    # five old ones, two kept: revisions 0, 1, 2 go, except revision 0 whose pod is still shutting down
    assert plan.delete == ("llm-old1", "llm-old2")


def test_nothing_is_deleted_while_a_rollout_is_under_way():
    d = deployment(replicas=2, revisionHistoryLimit=0)
    h = template_hash(d["spec"]["template"])
    new = RSView(f"llm-{h}", 2, h, 1, created=T0 + 50, current=1)
    old = RSView("llm-old", 1, "old", 2, ready=2, available=2, created=T0, current=2)
    assert plan_rollout(d, [new, old], T0 + 60).delete == ()


def test_a_rollout_that_never_becomes_ready_exceeds_its_progress_deadline():
    c = Cluster(deployment(replicas=2, progressDeadlineSeconds=60,
                           strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}))
    c.settle()
    c.start_s = None  # the new image crashes: its pods never become ready
    c.set_image("vllm/vllm-openai:broken")
    started = c.now
    reasons = []
    for _ in range(30):
        plan = c.sync()
        progressing = _cond(plan.status, "Progressing")
        reasons.append((c.now - started, progressing["status"], progressing["reason"]))
        c.tick()
    first_timeout = next(t for t, _, reason in reasons if reason == "ProgressDeadlineExceeded")
    assert 60 < first_timeout <= 70
    assert all(reason in ("NewReplicaSetCreated", "ReplicaSetUpdated") for t, _, reason in reasons if t <= 60)
    assert reasons[-1][1:] == ("False", "ProgressDeadlineExceeded")
    assert _cond(plan.status, "Progressing")["message"].endswith("has timed out progressing.")
    assert _cond(plan.status, "Available")["status"] == "True"  # the old pods still serve
    assert c.replicas() == {1: 2, 2: 1}  # and nothing more was taken away from them


def test_a_paused_deployment_makes_no_rollout_progress_until_resumed():
    c = Cluster(deployment(replicas=2))
    c.settle()
    d = copy.deepcopy(c.deploy)
    d["spec"]["paused"] = True
    d["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v2"
    c.deploy = d
    for _ in range(5):
        plan = c.sync()
        c.tick(120)  # far past the progress deadline: a pause never times out
    assert plan.create is None and plan.new_replicaset is None
    assert c.replicas() == {1: 2}
    assert _cond(plan.status, "Progressing")["reason"] == "DeploymentPaused"
    assert _cond(plan.status, "Progressing")["status"] == "Unknown"
    # scaling still works while paused
    c.deploy = {**c.deploy, "spec": {**c.deploy["spec"], "replicas": 3}}
    c.sync()
    assert c.replicas() == {1: 3}
    c.deploy = {**c.deploy, "spec": {**c.deploy["spec"], "paused": False}}
    resumed = c.sync()
    assert resumed.create is not None and resumed.create.revision == 2
    c.settle()
    assert c.replicas() == {1: 0, 2: 3}


def test_scaling_down_a_finished_deployment_shrinks_its_replicaset():
    c = Cluster(deployment(replicas=4))
    c.settle()
    c.deploy = {**c.deploy, "spec": {**c.deploy["spec"], "replicas": 1}}
    plan = c.sync()
    assert list(plan.replicas.values()) == [1]
    assert plan.scaled(c.views()) == {}  # already applied by sync()


def test_min_ready_seconds_delays_availability():
    pods = [PodView("a", T0, "n1", "Running", True, ready_since=T0 + 10),
            PodView("b", T0, "n1", "Running", True, ready_since=T0 + 25),
            PodView("c", T0, "n1", "Pending"),
            PodView("d", T0, "n1", "Running", True, ready_since=T0, terminating=True),
            PodView("e", T0, "n1", "Failed")]
    assert replicaset_status(pods, 30, T0 + 50) == {"replicas": 3, "readyReplicas": 2, "availableReplicas": 1,
                                                    "terminatingReplicas": 1}
    assert replicaset_status(pods, 0, T0 + 50)["availableReplicas"] == 2


# -- the ReplicaSet controller ---------------------------------------------------------------

def test_pods_to_delete_unready_and_unscheduled_first_then_newest():
    pods = [
        PodView("old-ready", T0, "n1", "Running", True, ready_since=T0 + 10),
        PodView("new-ready", T0 + 100, "n2", "Running", True, ready_since=T0 + 110),
        PodView("unscheduled", T0 + 5, None, "Pending"),
        PodView("pending", T0 + 6, "n3", "Pending"),
        PodView("running-unready", T0 + 7, "n4", "Running", False),
        PodView("gone", T0, "n1", "Running", True, terminating=True),
        PodView("done", T0, "n1", "Succeeded"),
    ]
    assert replicaset_pod_diff(5, pods) == (0, [])
    assert replicaset_pod_diff(8, pods) == (3, [])  # the terminating and the finished pod do not count
    _, doomed = replicaset_pod_diff(1, pods)
    assert [p.name for p in doomed] == ["unscheduled", "pending", "running-unready", "new-ready"]


def test_pods_doubled_up_on_a_node_go_first_and_deletion_cost_protects():
    pods = [PodView("a1", T0, "n1", "Running", True, ready_since=T0),
            PodView("a2", T0, "n1", "Running", True, ready_since=T0),
            PodView("b1", T0 + 10, "n2", "Running", True, ready_since=T0 + 10)]
    [doomed] = replicaset_pod_diff(2, pods)[1]
    assert doomed.node == "n1"  # though b1 is newer and was ready more recently
    costly = [PodView(p.name, p.created, p.node, p.phase, p.ready, p.ready_since, deletion_cost=100)
              for p in pods[:2]]
    assert [p.name for p in replicaset_pod_diff(2, costly + pods[2:])[1]] == ["b1"]


def test_condition_times_are_rfc3339():
    c = Cluster(deployment(replicas=1))
    plan = c.sync()
    cond = _cond(plan.status, "Progressing")
    assert cond["lastUpdateTime"].endswith("Z") and parse_time(cond["lastUpdateTime"]) == int(T0)


# -- properties ------------------------------------------------------------------------------

_fencepost = st.one_of(st.integers(0, 3), st.sampled_from(["0%", "10%", "25%", "50%", "100%"]))


@settings(max_examples=60, deadline=None)
@given(replicas=st.integers(1, 8), surge=_fencepost, unavailable=_fencepost,
       start_s=st.sampled_from([1.0, 5.0, 12.0, 30.0]), min_ready=st.sampled_from([0, 7]))
def test_a_rolling_update_stays_within_surge_and_availability_and_finishes(replicas, surge, unavailable, start_s,
                                                                          min_ready):
    if surge in (0, "0%") and unavailable in (0, "0%"):
        return  # refused by validation (fenceposts that only round to 0 are fine: one pod may go)
    c = Cluster(deployment(replicas=replicas, minReadySeconds=min_ready, strategy={
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}),
        start_s=start_s)
    c.settle(max_steps=400)
    c.set_image("vllm/vllm-openai:v2")
    max_surge, max_unavailable = resolve_fenceposts(surge, unavailable, replicas)
    max_unavailable = min(max_unavailable, replicas)

    def check(cluster):
        assert sum(cluster.replicas().values()) <= replicas + max_surge
        assert cluster.available() >= replicas - max_unavailable

    c.settle(max_steps=400, check=check)
    assert c.replicas() == {1: 0, 2: replicas}


def test_back_off_doubles_per_failure_up_to_its_cap_and_a_success_forgets_it():
    from shoal.server.kube.controller import BackOff

    now = [100.0]
    b = BackOff(base_s=0.005, max_s=1.0, clock=lambda: now[0])
    assert b.due("a") and b.due("b")
    assert [b.failed("a") for _ in range(4)] == [0.005, 0.01, 0.02, 0.04]
    assert not b.due("a") and b.due("b")  # one key's failures hold back no other key
    now[0] += 0.04
    assert b.due("a")
    assert max(b.failed("a") for _ in range(20)) == 1.0
    b.forget("a")
    assert b.due("a") and b.failures("a") == 0
