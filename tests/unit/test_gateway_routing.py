"""The gateway's routing table: which Service a request names, and which pod serves it."""

from collections import Counter

import pytest
from hypothesis import given, strategies as st

from shoal.gateway.routing import Balancer, RoutesError, RoutingTable, ServiceNotFound, parse_address
from shoal.gateway.stats import GatewayStats, RateWindow


def backend(pod, deployment="llm", port=8000, ready=True, terminating=False, address="127.0.1.2", **extra):
    return {"pod": pod, "deployment": deployment, "address": address, "port": port, "ready": ready,
            "terminating": terminating, **extra}


def table(*services, version=1):
    return RoutingTable.from_json({"version": version, "services": list(services)})


def service(name="llm", namespace="default", backends=(), **extra):
    return {"namespace": namespace, "name": name, "ports": [{"name": "http", "port": 80, "targetPort": 8000}],
            "backends": list(backends), **extra}


LLM = table(service(backends=[backend("llm-a"), backend("llm-b")]),
            service("embed", "research", [backend("embed-0", "embed", port=9000)],
                    ports=[{"name": "http", "port": 80, "targetPort": 9000},
                           {"name": "metrics", "port": 9090, "targetPort": 9091}]))


# ------------------------------------------------------------------ addressing a Service


@pytest.mark.parametrize("host", [
    "llm.default", "llm.default:8080", "llm.default.svc", "llm.default.svc.cluster.local",
    "llm.default.svc.cluster.local:80", "LLM.Default.SVC.cluster.local.",
])  # fmt: skip
def test_a_user_reaches_a_service_by_every_kubernetes_dns_form_of_its_name(host):
    route = LLM.lookup(host, "/v1/completions?stream=true")
    assert route.service.key == "default/llm"
    assert route.path == "/v1/completions?stream=true"  # forwarded as it came
    assert route.port.name == "http"


def test_the_api_server_proxy_path_names_namespace_service_and_port_and_forwards_the_rest():
    route = LLM.lookup("gateway.example:8080", "/shoal/v1/namespaces/research/services/embed:metrics/proxy/stats?x=1")
    assert (route.service.key, route.port.port, route.path) == ("research/embed", 9090, "/stats?x=1")
    by_number = LLM.lookup(None, "/shoal/v1/namespaces/research/services/embed:9090/proxy/")
    assert (by_number.port.name, by_number.path) == ("metrics", "/")
    bare = LLM.lookup(None, "/shoal/v1/namespaces/default/services/llm/proxy")
    assert (bare.service.name, bare.port.name, bare.path) == ("llm", "http", "/")
    with_scheme = LLM.lookup(None, "/shoal/v1/namespaces/default/services/http:llm:http/proxy/v1/models")
    assert (with_scheme.service.name, with_scheme.path) == ("llm", "/v1/models")


def test_a_multi_port_service_sends_each_port_to_its_target_port():
    svc = LLM.services[("research", "embed")]
    pod = svc.backends[0]
    assert pod.target(svc.port("http")) == ("127.0.1.2", 9000)
    assert pod.target(svc.port("9090")) == ("127.0.1.2", 9091)
    named = table(service("embed", backends=[backend("e0", port=9000, ports={"metrics": 7777})],
                          ports=[{"name": "http", "port": 80, "targetPort": "http"},
                                 {"name": "metrics", "port": 9090, "targetPort": "prom"}]))
    svc = named.services[("default", "embed")]
    assert svc.backends[0].target(svc.port("metrics")) == ("127.0.1.2", 7777)
    assert svc.backends[0].target(svc.port("http")) == ("127.0.1.2", 9000)


def test_an_unknown_service_or_port_is_named_in_the_404_message():
    with pytest.raises(ServiceNotFound, match="service default/nope not found"):
        LLM.lookup("nope.default", "/")
    with pytest.raises(ServiceNotFound, match="service research/embed has no port 'grpc'"):
        LLM.lookup(None, "/shoal/v1/namespaces/research/services/embed:grpc/proxy/")
    with pytest.raises(ServiceNotFound, match="no Service addressed"):
        LLM.lookup("127.0.0.1:8080", "/v1/models")


def test_a_host_port_that_is_not_a_service_port_falls_back_to_the_first_port():
    assert LLM.lookup("embed.research:9090", "/").port.name == "metrics"
    assert LLM.lookup("embed.research:8080", "/").port.name == "http"


@pytest.mark.parametrize("host", [None, "", "localhost", "localhost:8080", "10.0.0.1", "[::1]:8080",
                                  "a.b.c", "llm.default.svc.cluster", "llm.default.cluster.local"])
def test_hosts_that_are_not_service_names_address_nothing(host):
    assert parse_address(host, "/x") is None


def test_other_api_paths_fall_back_to_the_host_header():
    addr = parse_address("llm.default", "/shoal/v1/namespaces/default/pods")
    assert (addr.namespace, addr.name, addr.path) == ("default", "llm", "/shoal/v1/namespaces/default/pods")


def test_a_malformed_service_is_left_out_and_named_while_the_rest_of_the_table_is_used():
    t = RoutingTable.from_json({"version": 3, "services": [
        service(backends=[backend("llm-a")]),
        {"name": "broken", "backends": [{"pod": "x"}]},  # no address, no port
        service("weighted", split={"v1": -5}),
    ]})
    assert list(t.services) == [("default", "llm")]
    assert len(t.problems) == 2 and "broken" in t.problems[0] and "weight" in t.problems[1]
    with pytest.raises(RoutesError):
        RoutingTable.from_json({"services": "nope"})


# ------------------------------------------------------------------ choosing a pod


def test_only_ready_pods_that_are_not_terminating_take_new_requests():
    t = table(service(backends=[backend("ready"), backend("starting", ready=False),
                                backend("draining", terminating=True)]))
    svc = t.services[("default", "llm")]
    balancer = Balancer()
    assert {balancer.pick(svc, {}).pod for _ in range(10)} == {"ready"}
    none_ready = table(service(backends=[backend("starting", ready=False)])).services[("default", "llm")]
    assert not none_ready.serving and balancer.pick(none_ready, {}) is None


def test_the_pod_with_the_fewest_outstanding_requests_is_chosen():
    svc = table(service(backends=[backend("a"), backend("b"), backend("c")])).services[("default", "llm")]
    assert Balancer().pick(svc, {"default/a": 3, "default/b": 1, "default/c": 2}).pod == "b"


def test_idle_pods_share_sequential_requests_evenly():
    svc = table(service(backends=[backend("a"), backend("b"), backend("c")])).services[("default", "llm")]
    balancer = Balancer()
    picks = Counter(balancer.pick(svc, {}).pod for _ in range(300))
    assert picks == {"a": 100, "b": 100, "c": 100}


def test_ties_among_the_least_loaded_are_spread_not_always_the_first():
    svc = table(service(backends=[backend("a"), backend("b"), backend("c")])).services[("default", "llm")]
    balancer = Balancer()
    load = {"default/a": 5}
    assert Counter(balancer.pick(svc, load).pod for _ in range(100)) == {"b": 50, "c": 50}


def test_a_retry_never_goes_back_to_a_pod_already_tried():
    svc = table(service(backends=[backend("a"), backend("b")])).services[("default", "llm")]
    balancer = Balancer()
    assert balancer.pick(svc, {}, exclude={"default/a"}).pod == "b"
    assert balancer.pick(svc, {}, exclude={"default/a", "default/b"}) is None


def canary():
    return table(service(split={"llm-v1": 90, "llm-v2": 10},
                         backends=[backend("v1-a", "llm-v1"), backend("v1-b", "llm-v1"),
                                   backend("v2-a", "llm-v2")])).services[("default", "llm")]


def test_a_90_10_canary_split_sends_10_percent_of_2000_requests_to_the_canary():
    svc = canary()
    balancer = Balancer()
    picks = Counter(balancer.pick(svc, {}).deployment for _ in range(2000))
    assert abs(picks["llm-v2"] - 200) <= 60
    assert picks["llm-v2"] == 200  # smooth weighted round-robin is exact over whole cycles


def test_the_canary_interleaves_rather_than_arriving_in_a_burst():
    balancer = Balancer()
    svc = canary()
    first = [balancer.pick(svc, {}).deployment for _ in range(20)]
    assert first.count("llm-v2") == 2 and first[:10].count("llm-v2") == 1


def test_a_split_group_with_no_ready_pod_hands_its_share_to_the_others():
    svc = table(service(split={"llm-v1": 90, "llm-v2": 10},
                        backends=[backend("v1-a", "llm-v1"), backend("v2-a", "llm-v2", ready=False)])
                ).services[("default", "llm")]
    balancer = Balancer()
    assert {balancer.pick(svc, {}).pod for _ in range(50)} == {"v1-a"}


def test_pods_of_a_deployment_the_split_does_not_name_get_no_traffic():
    svc = table(service(split={"llm-v1": 100, "llm-v2": 0},
                        backends=[backend("v1-a", "llm-v1"), backend("v2-a", "llm-v2"), backend("old", "llm-v0")])
                ).services[("default", "llm")]
    balancer = Balancer()
    assert {balancer.pick(svc, {}).pod for _ in range(50)} == {"v1-a"}


@given(st.lists(st.integers(0, 100), min_size=1, max_size=5).filter(lambda ws: sum(ws) > 0),
       st.integers(1, 400))
def test_every_group_gets_its_weighted_share_within_one_request(weights, n):
    split = {f"d{i}": w for i, w in enumerate(weights)}
    svc = table(service(split=split, backends=[backend(f"p{i}", f"d{i}") for i in range(len(weights))])
                ).services[("default", "llm")]
    balancer = Balancer()
    picks = Counter(balancer.pick(svc, {}).deployment for _ in range(n))
    total = sum(weights)
    for name, w in split.items():
        assert abs(picks[name] - n * w / total) < 1 + 1e-9


# ------------------------------------------------------------------ load figures


def test_request_rate_is_a_sliding_ten_second_window():
    rate = RateWindow(now=100.0)
    for i in range(50):  # 10 requests per second for 5 s
        rate.add(100.0 + i / 10)
    assert rate.rate(105.0) == pytest.approx(10.0, rel=0.05)  # seen for 5 s: not diluted over 10
    for i in range(100):
        rate.add(105.0 + i / 10)
    assert rate.rate(115.0) == pytest.approx(10.0, rel=0.1)
    assert rate.rate(130.0) == 0.0  # quiet for longer than the window


def test_the_metrics_report_lists_every_routed_pod_and_held_requests():
    now = [1000.0]
    stats = GatewayStats(clock=lambda: now[0])
    stats.begin("default/llm", "default/llm-a")
    stats.end("default/llm", "default/llm-a", 200, 999.9)
    stats.begin("default/llm", "default/llm-a")
    stats.held["default/zero"] += 2
    now[0] = 1002.0
    report = stats.report(["default/llm-a", "default/llm-b"])
    assert report == {"pods": {"default/llm-a": {"rps": 0.5, "inflight": 1},
                               "default/llm-b": {"rps": 0.0, "inflight": 0}},
                      "held": {"default/zero": 2}}
    text = stats.prometheus(routes_version=7)
    assert 'shoal_gateway_requests_total{service="default/llm",pod="default/llm-a",code="200"} 1' in text
    assert 'shoal_gateway_inflight_requests{service="default/llm",pod="default/llm-a"} 1' in text
    assert 'shoal_gateway_request_duration_seconds_bucket{service="default/llm",le="+Inf"} 1' in text
    assert "shoal_gateway_routes_version 7" in text
