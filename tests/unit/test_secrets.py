"""A pod's Secrets as its node's agent gets them: registry logins and referenced keys."""

from __future__ import annotations

import base64
import json

from shoal.server.kube.secrets import registry_auths


def test_docker_registry_secrets_give_logins_by_registry_host():
    config = {"auths": {"https://index.docker.io/v1/": {"auth": "YTpi"},
                        "r:5000": {"username": "alice", "password": "pw"}, "bad": "x"}}
    assert registry_auths({".dockerconfigjson": json.dumps(config).encode()}, "kubernetes.io/dockerconfigjson") == {
        "index.docker.io": {"auth": "YTpi"}, "r:5000": {"auth": base64.b64encode(b"alice:pw").decode()}}
    assert registry_auths({".dockercfg": b'{"r:5000": {"auth": "YTpi"}}'}, "kubernetes.io/dockercfg") == {
        "r:5000": {"auth": "YTpi"}}
    assert registry_auths({".dockerconfigjson": b"not json"}, "kubernetes.io/dockerconfigjson") == {}
    assert registry_auths({"token": b"x"}, "Opaque") == {}


def test_the_pull_secrets_login_of_the_registry_pulled_from():
    from shoal.agent.pods import _login_for

    auths = {"r:5000": {"auth": base64.b64encode(b"alice:p:w").decode()}}
    assert _login_for(auths, "r:5000/team/x:1") == ("alice", "p:w")
    assert _login_for(auths, "other:5000/team/x:1") is None
    assert _login_for(auths, "busybox") is None
    assert _login_for({"r:5000": {"auth": "!!"}}, "r:5000/x:1") is None
