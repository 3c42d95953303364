"""`shoal up` and `shoal down` edit /etc/hosts; clusters started and stopped at once (tests
in parallel) must never lose a line another wrote, least of all `localhost`."""

from __future__ import annotations

import threading

from shoal.cli import local


def test_concurrent_edits_of_the_hosts_file_lose_nothing(tmp_path, monkeypatch):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    monkeypatch.setattr(local, "HOSTS_FILE", str(hosts))
    start = threading.Barrier(16)
    errors: list[BaseException] = []

    def cluster(k: int) -> None:
        start.wait()
        try:
            for i in range(50):
                line = f"127.0.{k}.{i}\tnode{k:02d}-{i}"
                local.edit_hosts(lambda text: text + line + "\n")
                local.edit_hosts(lambda text: "".join(x + "\n" for x in text.splitlines() if x != line))
        except BaseException as e:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=cluster, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert hosts.read_text() == "127.0.0.1\tlocalhost\n::1\tlocalhost\n"
