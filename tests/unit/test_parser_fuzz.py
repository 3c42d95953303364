"""Hostile text through every parser users feed: whatever arrives, each parser answers or
raises its own documented error (which the commands turn into a one-line message), never
another exception that would surface as a traceback or a 500.
"""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.slurm.options import OptionError, directives, parse_sbatch, parse_srun
from shoal.kube.manifest import load_documents, validate
from shoal.kube.schema import ManifestError
from shoal.model.hostlist import HostlistError, compress, expand
from shoal.model.timefmt import TimeFormatError, format_hms, parse_begin_time, parse_time_limit

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = 1_764_688_000.0

# Text biased towards each grammar's own characters, plus anything at all.
hostlist_text = st.text(alphabet=string.ascii_lowercase[:4] + string.digits + "[]-,: \t", max_size=40) | st.text()
time_text = st.text(alphabet=string.digits + "-:/T+ nowtdayhms", max_size=25) | st.text(max_size=25)
word = st.text(alphabet=string.ascii_letters + string.digits + "-=:,%[]@_./ '\"#", max_size=20) | st.text(max_size=20)
OPTION_NAMES = ["--nodes", "-N", "--ntasks", "-n", "--gpus", "--gpus-per-node", "--gres", "--time", "-t", "--mem",
                "--array", "-a", "--dependency", "-d", "--begin", "--nodelist", "-w", "--exclude", "-x", "--output",
                "-o", "--signal", "--export", "--cpus-per-task", "-c", "--partition", "-p", "--job-name", "-J",
                "--exclusive", "--constraint", "-C", "--mem-per-cpu", "--time-min", "--open-mode", "--wrap"]
option_words = st.lists(st.one_of(st.sampled_from(OPTION_NAMES), word,
                                  st.builds(lambda o, v: f"{o}={v}", st.sampled_from(OPTION_NAMES), word)),
                        max_size=8)


@FUZZ
@given(hostlist_text)
def test_any_hostlist_expands_or_says_why(text):
    try:
        names = expand(text)
    except HostlistError:
        return
    assert all(isinstance(n, str) for n in names)


@FUZZ
@given(st.lists(st.from_regex(r"[a-z]{1,4}[0-9]{0,3}", fullmatch=True), min_size=1, max_size=30))
def test_compressed_names_expand_back_to_the_same_names(names):
    assert set(expand(compress(names))) == set(names)


@FUZZ
@given(time_text)
def test_any_time_limit_parses_or_says_why(text):
    try:
        seconds = parse_time_limit(text)
    except TimeFormatError:
        return
    assert seconds is None or (isinstance(seconds, int) and seconds >= 0)
    format_hms(seconds)


@FUZZ
@given(time_text)
def test_any_begin_time_parses_or_says_why(text):
    try:
        when = parse_begin_time(text, NOW)
    except TimeFormatError:
        return
    assert isinstance(when, float)


@FUZZ
@given(st.lists(st.one_of(st.builds(lambda ws: "#SBATCH " + " ".join(ws), st.lists(word, max_size=4)),
                          st.builds(lambda o, v: f"#SBATCH {o}={v}", st.sampled_from(OPTION_NAMES), word),
                          st.text(max_size=30)), max_size=6))
def test_any_sbatch_directives_parse_or_say_why(lines):
    script = "#!/bin/sh\n" + "\n".join(lines) + "\ntrue\n"
    try:
        directives(script)
        parse_sbatch(["job.sh"], script, cwd="/tmp", environ={}, now=NOW)
    except OptionError:
        pass


@FUZZ
@given(option_words, st.text(max_size=60))
def test_any_sbatch_command_line_parses_or_says_why(argv, script):
    try:
        parse_sbatch(argv, "#!/bin/sh\n" + script, cwd="/tmp", environ={}, now=NOW)
    except OptionError:
        pass


@FUZZ
@given(option_words)
def test_any_srun_command_line_parses_or_says_why(argv):
    try:
        parse_srun(argv, cwd="/tmp", environ={})
    except OptionError:
        pass


@FUZZ
@given(st.text(max_size=200) | st.text(alphabet="{}[]:-,'\"&*!|>#\n abc123", max_size=120))
def test_any_manifest_text_loads_or_says_why(text):
    try:
        docs = load_documents(text)
    except ManifestError:
        return
    for doc in docs:
        try:
            validate(doc)
        except ManifestError:
            pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)
KEYS = ["metadata", "spec", "replicas", "template", "containers", "selector", "matchLabels", "name", "image",
        "labels", "annotations", "ports", "containerPort", "resources", "limits", "nvidia.com/gpu", "strategy",
        "minReplicas", "maxReplicas", "metrics", "scaleTargetRef", "value", "namespace", "env", "command"]
shaped = st.recursive(
    st.none() | st.integers(-5, 5) | st.text(max_size=6) | st.sampled_from(["1", "100m", "1Gi", "x", "25%"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    max_leaves=25)


@FUZZ
@given(st.sampled_from([("apps/v1", "Deployment"), ("v1", "Service"), ("autoscaling/v2", "HorizontalPodAutoscaler"),
                        ("scheduling.k8s.io/v1", "PriorityClass"), ("v1", "Namespace"), ("v1", "Pod"), (None, None)]),
       st.dictionaries(st.sampled_from(KEYS), shaped, max_size=4))
def test_any_object_validates_or_says_why(kind, fields):
    try:
        out, warnings = validate({**fields, "apiVersion": kind[0], "kind": kind[1]})
    except ManifestError as e:
        assert str(e)
        return
    assert isinstance(out, dict) and isinstance(warnings, list)


def deployment() -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "25%"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{
                                      "name": "app", "image": "example/app:v1", "command": ["serve"],
                                      "ports": [{"containerPort": 8000, "name": "http"}],
                                      "env": [{"name": "A", "value": "1"}],
                                      "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "1Gi"}},
                                      "readinessProbe": {"httpGet": {"path": "/", "port": "http"}}}],
                                      "nodeSelector": {"gpu": "h100"},
                                      "tolerations": [{"key": "k", "operator": "Exists"}]}}}}


PATHS = [("metadata", "name"), ("metadata", "labels"), ("metadata", "annotations"), ("spec", "replicas"),
         ("spec", "selector"), ("spec", "strategy", "rollingUpdate", "maxSurge"), ("spec", "template", "metadata"),
         ("spec", "template", "spec", "containers", 0, "image"), ("spec", "template", "spec", "containers", 0, "ports"),
         ("spec", "template", "spec", "containers", 0, "env"), ("spec", "template", "spec", "containers", 0, "command"),
         ("spec", "template", "spec", "containers", 0, "resources", "limits"),
         ("spec", "template", "spec", "containers", 0, "readinessProbe"),
         ("spec", "template", "spec", "containers", 0, "name"), ("spec", "template", "spec", "nodeSelector"),
         ("spec", "template", "spec", "tolerations"), ("spec", "template", "spec", "containers")]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PATHS), json_values | shaped), min_size=1, max_size=3))
def test_a_valid_deployment_with_any_field_replaced_validates_or_says_why(changes):
    doc = deployment()
    for path, value in changes:
        node = doc
        try:
            for step in path[:-1]:
                node = node[step]
            node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced the way there
    try:
        validate(doc)
    except ManifestError as e:
        assert str(e)


def test_the_deployment_the_fuzzing_starts_from_is_valid():
    out, warnings = validate(deployment())
    assert out["spec"]["replicas"] == 2 and warnings == []
