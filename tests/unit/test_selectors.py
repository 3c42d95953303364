"""Label selectors, node affinity, taints and tolerations, with Kubernetes' matching rules."""

import pytest
from hypothesis import given, strategies as st

from shoal.model.selectors import (
    LabelSelector,
    Requirement,
    SelectorError,
    Taint,
    TaintChange,
    Toleration,
    eviction_delay,
    label_key_error,
    label_value_error,
    node_affinity_matches,
    parse_selector_text,
    parse_taint,
    preferred_score,
    tolerates,
    untolerated,
    update_taints,
)

VLLM_POD = {"app": "vllm", "tier": "serving", "env": "prod"}


# -- label selectors -------------------------------------------------------------------------

def test_match_labels_and_expressions_all_must_hold():
    sel = LabelSelector.from_dict({
        "matchLabels": {"app": "vllm"},
        "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "staging"]},
                             {"key": "canary", "operator": "DoesNotExist"}],
    })
    assert sel.matches(VLLM_POD)
    assert not sel.matches({**VLLM_POD, "canary": "true"})
    assert not sel.matches({**VLLM_POD, "env": "dev"})
    assert not sel.matches({"env": "prod"})


def test_notin_matches_a_pod_without_the_label_as_kubernetes_does():
    sel = LabelSelector.from_dict({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["batch"]}]})
    assert sel.matches({"app": "x"})
    assert sel.matches({"tier": "serving"})
    assert not sel.matches({"tier": "batch"})


def test_exists_looks_at_the_key_only():
    sel = LabelSelector.from_dict({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]})
    assert sel.matches({"gpu": ""})
    assert not sel.matches({})


def test_empty_selector_matches_everything():
    assert LabelSelector.from_dict({}).matches({"anything": "at-all"})
    assert LabelSelector().matches({})


def test_a_services_selector_is_equality_on_every_pair():
    sel = LabelSelector.from_labels({"app": "vllm", "tier": "serving"})
    assert sel.matches(VLLM_POD)
    assert not sel.matches({"app": "vllm"})


@pytest.mark.parametrize("selector, field, message", [
    ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "matchExpressions[0].values",
     "Required value: must be specified when `operator` is 'In' or 'NotIn'"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "matchExpressions[0].values",
     "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"),
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "matchExpressions[0].operator",
     'Unsupported value: "Gt": supported values: "In", "NotIn", "Exists", "DoesNotExist"'),
    ({"matchExpressions": [{"key": "a", "operator": "Like", "values": ["x"]}]}, "matchExpressions[0].operator",
     'Unsupported value: "Like": supported values: "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"'),
    ({"matchLabels": {"app": "v" * 64}}, "matchLabels[app]", "must be no more than 63 characters"),
])
def test_bad_selectors_name_the_field(selector, field, message):
    with pytest.raises(SelectorError) as e:
        LabelSelector.from_dict(selector)
    assert (e.value.field, e.value.message) == (field, message)


def test_label_key_and_value_syntax():
    assert label_key_error("nvidia.com/gpu.product") is None
    assert label_key_error("app") is None
    assert label_key_error("a" * 63) is None
    assert label_key_error("a" * 64) == "name part must be no more than 63 characters"
    assert "prefix part" in label_key_error("Bad_Prefix/x")
    assert label_key_error("/x") == "prefix part must be non-empty"
    assert "name part must consist" in label_key_error("-x")
    assert label_value_error("") is None
    assert label_value_error("NVIDIA-H100-SXM") is None
    assert label_value_error("v" * 64) == "must be no more than 63 characters"
    assert "a valid label" in label_value_error("has space")


# -- kubectl -l text -------------------------------------------------------------------------

def test_the_kubectl_example_parses_into_five_requirements():
    sel = parse_selector_text("app=vllm,tier!=x,env in (a,b),!foo,bar")
    assert sel.requirements == (
        Requirement("app", "In", ("vllm",)), Requirement("tier", "NotIn", ("x",)),
        Requirement("env", "In", ("a", "b")), Requirement("foo", "DoesNotExist"), Requirement("bar", "Exists"),
    )
    assert sel.matches({"app": "vllm", "env": "b", "bar": "1"})
    assert not sel.matches({"app": "vllm", "env": "b", "bar": "1", "foo": "1"})
    assert not sel.matches({"app": "vllm", "env": "b"})


def test_text_forms_double_equals_notin_spaces_and_integers():
    sel = parse_selector_text(" app == vllm , env notin ( dev , test ), gen>3, rank<10 ")
    assert sel.matches({"app": "vllm", "env": "prod", "gen": "4", "rank": "2"})
    assert not sel.matches({"app": "vllm", "env": "dev", "gen": "4", "rank": "2"})
    assert not sel.matches({"app": "vllm", "gen": "3", "rank": "2"})
    assert not sel.matches({"app": "vllm", "gen": "x", "rank": "2"})


def test_empty_text_selects_everything_and_an_empty_value_is_a_value():
    assert parse_selector_text("").matches({"a": "b"})
    sel = parse_selector_text("a=")
    assert sel.matches({"a": ""}) and not sel.matches({"a": "x"}) and not sel.matches({})


@pytest.mark.parametrize("bad, why", [
    ("a=b,", "a requirement must follow ','"),
    ("a in ()", "for 'in', the set of values can't be empty"),
    ("a in (b", "unexpected end"),
    ("a in b", "expected '(' after 'in'"),
    ("==x", "expected a label key, found '=='"),
    ("a b", "expected an operator after 'a', found 'b'"),
    ("a=b c=d", "expected ',' between requirements, found 'c'"),
    ("a>x", 'must be an integer'),
    ("bad key!=1", "expected an operator after 'bad', found 'key'"),
    ("k=" + "v" * 64, "must be no more than 63 characters"),
])
def test_bad_text_says_what_was_expected(bad, why):
    with pytest.raises(SelectorError) as e:
        parse_selector_text(bad)
    assert why in str(e.value)
    assert str(e.value).startswith(f"invalid selector {bad!r}: ")


_names = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,8}[a-z0-9])?", fullmatch=True)
_keys = st.builds(lambda p, n: f"{p}/{n}" if p else n, st.sampled_from(["", "nvidia.com", "shoal.io"]), _names)
_requirements = st.one_of(
    st.builds(Requirement, _keys, st.sampled_from(["In", "NotIn"]), st.lists(_names, min_size=1, max_size=3).map(tuple)),
    st.builds(Requirement, _keys, st.sampled_from(["Exists", "DoesNotExist"])),
    st.builds(lambda k, op, n: Requirement(k, op, (str(n),)), _keys, st.sampled_from(["Gt", "Lt"]),
              st.integers(-100, 100)),
)


@given(st.lists(_requirements, max_size=5).map(lambda reqs: LabelSelector(tuple(reqs))))
def test_selector_text_round_trips(selector):
    assert parse_selector_text(str(selector)) == selector


@given(st.lists(_requirements, max_size=4).map(lambda reqs: LabelSelector(tuple(reqs))),
       st.dictionaries(_keys, _names, max_size=4))
def test_text_form_selects_what_the_selector_selects(selector, labels):
    assert parse_selector_text(str(selector)).matches(labels) == selector.matches(labels)


# -- node affinity ---------------------------------------------------------------------------

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8", "zone": "a"}
L40S = {"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "4", "zone": "b"}


def _required(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_terms_are_ored_and_expressions_anded():
    affinity = _required(
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
                              {"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["6"]}]},
    )
    assert node_affinity_matches(affinity, H100)  # the second term
    assert not node_affinity_matches(affinity, L40S)  # neither: L40S in zone b has 4 GPUs
    assert node_affinity_matches(affinity, {**L40S, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})


def test_gt_and_lt_compare_integers_and_a_non_integer_label_never_matches():
    lt = _required({"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["8"]}]})
    assert node_affinity_matches(lt, L40S)
    assert not node_affinity_matches(lt, H100)
    assert not node_affinity_matches(lt, {"nvidia.com/gpu.count": "four"})
    assert not node_affinity_matches(lt, {})


def test_no_required_affinity_admits_every_node_but_an_empty_term_admits_none():
    assert node_affinity_matches(None, H100)
    assert node_affinity_matches({}, H100)
    assert node_affinity_matches({"podAntiAffinity": {}}, H100)
    assert not node_affinity_matches(_required({}), H100)
    assert not node_affinity_matches(_required(), H100)


def test_match_fields_pin_a_node_by_name():
    affinity = _required({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu07"]}]})
    assert node_affinity_matches(affinity, H100, node_name="gpu07")
    assert not node_affinity_matches(affinity, H100, node_name="gpu08")
    assert not node_affinity_matches(affinity, H100)


def test_preferred_score_sums_the_weights_of_matching_terms():
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 80, "preference": {"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}},
        {"weight": 20, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}},
        {"weight": 50, "preference": {}},  # an empty preference counts for nothing
    ]}}
    assert preferred_score(affinity, H100) == 100
    assert preferred_score(affinity, L40S) == 0
    assert preferred_score(affinity, {**L40S, "zone": "a"}) == 20
    assert preferred_score(None, H100) == 0


# -- taints and tolerations ------------------------------------------------------------------

GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


def test_equal_needs_the_same_value_exists_any_value():
    assert Toleration("nvidia.com/gpu", "Equal", "present", "NoSchedule").tolerates(GPU_TAINT)
    assert not Toleration("nvidia.com/gpu", "Equal", "absent", "NoSchedule").tolerates(GPU_TAINT)
    assert Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule").tolerates(GPU_TAINT)
    assert not Toleration("other", "Exists").tolerates(GPU_TAINT)


def test_empty_effect_matches_every_effect_and_a_set_one_only_itself():
    assert Toleration("nvidia.com/gpu", "Exists").tolerates(Taint("nvidia.com/gpu", "", "NoExecute"))
    assert not Toleration("nvidia.com/gpu", "Exists", effect="NoExecute").tolerates(GPU_TAINT)


def test_empty_key_with_exists_tolerates_everything():
    everything = Toleration(operator="Exists")
    assert everything.tolerates(GPU_TAINT)
    assert everything.tolerates(Taint("node.kubernetes.io/unreachable", "", "NoExecute"))


def test_tolerations_from_the_manifest_and_taints_from_the_snapshot():
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert tolerates(tolerations, ("nvidia.com/gpu", "present", "NoSchedule"))
    assert tolerates(tolerations, {"key": "nvidia.com/gpu", "effect": "NoSchedule"})
    assert not tolerates([], GPU_TAINT)
    assert not tolerates([{"key": "nvidia.com/gpu", "value": "x"}], GPU_TAINT)  # operator defaults to Equal


def test_untolerated_keeps_a_pod_off_and_ignores_prefer_no_schedule_by_default():
    taints = [GPU_TAINT, Taint("maintenance", "", "NoExecute"), Taint("spot", "", "PreferNoSchedule")]
    tols = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert untolerated(taints, tols) == [Taint("maintenance", "", "NoExecute")]
    assert untolerated(taints, tols, effects=("PreferNoSchedule",)) == [Taint("spot", "", "PreferNoSchedule")]
    assert untolerated(taints, [{"operator": "Exists"}]) == []


@pytest.mark.parametrize("toleration, field, message", [
    ({"operator": "Equal", "value": "x"}, "operator",
     'Invalid value: "Equal": operator must be Exists when `key` is empty, which means "match all values and all keys"'),
    ({"key": "a", "operator": "Exists", "value": "x"}, "operator",
     "Invalid value: \"Exists\": value must be empty when `operator` is 'Exists'"),
    ({"key": "a", "operator": "Exists", "tolerationSeconds": 60, "effect": "NoSchedule"}, "effect",
     "Invalid value: \"NoSchedule\": effect must be 'NoExecute' when `tolerationSeconds` is set"),
    ({"key": "a", "operator": "Matches"}, "operator",
     'Unsupported value: "Matches": supported values: "Equal", "Exists"'),
    ({"key": "a", "effect": "NoWay"}, "effect",
     'Unsupported value: "NoWay": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"'),
])
def test_tolerations_kubernetes_refuses(toleration, field, message):
    with pytest.raises(SelectorError) as e:
        Toleration.from_dict(toleration)
    assert (e.value.field, e.value.message) == (field, message)


def test_eviction_delay_is_the_least_toleration_seconds():
    unreachable = Taint("node.kubernetes.io/unreachable", "", "NoExecute")
    assert eviction_delay([unreachable], []) == 0
    assert eviction_delay([unreachable], [{"key": unreachable.key, "operator": "Exists", "effect": "NoExecute",
                                           "tolerationSeconds": 300},
                                          {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]) == 60
    assert eviction_delay([unreachable], [{"operator": "Exists"}]) is None
    assert eviction_delay([GPU_TAINT], []) is None


def test_taint_arguments_as_kubectl_takes_them():
    assert parse_taint("nvidia.com/gpu=present:NoSchedule") == TaintChange("nvidia.com/gpu", "present", "NoSchedule")
    assert parse_taint("maintenance:NoExecute") == TaintChange("maintenance", "", "NoExecute")
    assert parse_taint("maintenance:NoExecute-") == TaintChange("maintenance", "", "NoExecute", remove=True)
    assert parse_taint("maintenance-") == TaintChange("maintenance", "", "", remove=True)
    assert parse_taint("gpu=x:PreferNoSchedule").taint == Taint("gpu", "x", "PreferNoSchedule")
    assert str(GPU_TAINT) == "nvidia.com/gpu=present:NoSchedule"
    assert str(Taint("maintenance", effect="NoExecute")) == "maintenance:NoExecute"


@pytest.mark.parametrize("bad, why", [
    ("gpu=true", "expected key[=value]:effect"),
    ("gpu:NoWay", "unsupported effect 'NoWay'"),
    ("bad key:NoSchedule", "name part must consist"),
    ("gpu=" + "v" * 64 + ":NoSchedule", "must be no more than 63 characters"),
])
def test_bad_taint_arguments(bad, why):
    with pytest.raises(SelectorError) as e:
        parse_taint(bad)
    assert why in str(e.value)


def test_update_taints_like_kubectl_taint():
    node = [GPU_TAINT]
    added = update_taints(node, [parse_taint("maintenance:NoExecute")])
    assert added == [GPU_TAINT, Taint("maintenance", "", "NoExecute")]
    assert update_taints(added, [parse_taint("nvidia.com/gpu=present:NoSchedule")]) == added  # the same again: no-op
    with pytest.raises(SelectorError, match="--overwrite is false"):
        update_taints(added, [parse_taint("nvidia.com/gpu=other:NoSchedule")])
    replaced = update_taints(added, [parse_taint("nvidia.com/gpu=other:NoSchedule")], overwrite=True)
    assert Taint("nvidia.com/gpu", "other", "NoSchedule") in replaced and GPU_TAINT not in replaced
    assert update_taints(added, [parse_taint("maintenance-")]) == [GPU_TAINT]
    assert update_taints(added, [parse_taint("nvidia.com/gpu:NoSchedule-")]) == [Taint("maintenance", "", "NoExecute")]
    with pytest.raises(SelectorError, match="not found"):
        update_taints(added, [parse_taint("nvidia.com/gpu:NoExecute-")])
