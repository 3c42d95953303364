"""shoal up names its nodes in /etc/hosts: clusters starting and stopping at once (as the tests
run them) must never lose the file's own lines, nor each other's blocks."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from shoal.cli import local

SYSTEM = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def _churn(hosts: str, sdir: str, rounds: int) -> None:
    local.HOSTS_FILE = hosts
    for i in range(rounds):
        assert local._hosts_add(Path(sdir), ["node01", "node02"], [f"127.0.{i % 200}.2", "127.0.9.3"])
        begin, end = local._marker(Path(sdir))
        assert local._edit_hosts(lambda text: local._hosts_strip(text, begin, end))
    # leave this cluster's block in place, as a running cluster would
    assert local._hosts_add(Path(sdir), ["node01"], ["127.0.1.2"])


def test_clusters_editing_the_hosts_file_at_once_keep_every_line(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text(SYSTEM)
    # The blocks of clusters that are not running would be dropped: keep them all "alive".
    monkeypatch.setattr(local, "_read_state", lambda sdir: {"pids": {"server": 1}})
    monkeypatch.setattr(local, "_alive", lambda pid: True)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_churn, args=(str(hosts), str(tmp_path / f"c{n}"), 150)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    text = hosts.read_text()
    assert text.startswith(SYSTEM), text[:300]
    for n in range(4):
        assert text.count(f"# BEGIN shoal local cluster {tmp_path / f'c{n}'}\n") == 1, text
