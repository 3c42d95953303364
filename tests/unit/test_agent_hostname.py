"""``shoal agent --hostname`` names the node's UTS namespace after the node, never the machine:
outside a namespace of its own it refuses (a run of it once renamed a test machine "node02")."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest


def test_hostname_is_refused_in_the_machines_own_uts_namespace(tmp_path):
    before = socket.gethostname()
    out = subprocess.run([sys.executable, "-m", "shoal", "agent", "--hostname", "--name", "node-renamed-by-test",
                          "--server", "http://127.0.0.1:9", "--join-token", "x", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "--hostname would rename this machine itself" in out.stderr and "unshare --uts" in out.stderr
    assert "Traceback" not in out.stderr
    assert socket.gethostname() == before


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_a_uts_namespace_of_its_own_is_told_apart_from_the_machines():
    probe = "from shoal.agent.main import in_own_uts_namespace as f; print(f())"
    inside = subprocess.run(["unshare", "--uts", "--", sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (inside.stdout.strip(), outside.stdout.strip()) == ("True", "False"), (inside.stderr, outside.stderr)
