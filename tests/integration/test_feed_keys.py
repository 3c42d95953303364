"""Several servers on one PostgreSQL keep their views in memory: each commit's keys travel on
the change feed in the commit's own transaction (``shoal.store.changes``, ``shoal.store.feed``).

Two sides here are two servers' stores, each with its own engine, sessions, recorder, counts
and feed on one real PostgreSQL database: what one commits reaches the other's counts, a
rollback sends nothing, a commit of thousands of keys arrives whole, a bulk UPDATE arrives as
ALL, and a listener that lost its connection reads everything again when it is back. The
servers' own story (squeue, sinfo and the agents' work through either server) is at the end.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select, text, update

from shoal.store.changes import ALL, ChangeCount, note_changes, recorder_of
from shoal.store.engine import make_engine, migrate, session_factory
from shoal.store.feed import ChangeFeed
from shoal.store.models import PartitionRow
from tests.integration.cluster import wait_until

pytestmark = pytest.mark.postgres


class Side:
    """One server's store: sessions, a count of the partitions' rows, and the feed carrying keys."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self.sessions = session_factory(self.engine)
        self.count = ChangeCount(self.sessions, {PartitionRow: "name"})
        self.resyncs = 0
        self.feed = ChangeFeed(self.engine, self._delivered)
        self.feed.carry(recorder_of(self.sessions))
        self.feed.start()

    def _delivered(self, event: dict) -> None:
        if event.get("resync"):
            self.resyncs += 1

    def add(self, *names: str) -> None:
        with self.sessions() as s, s.begin():
            s.add_all(PartitionRow(name=n, changes={}, updated=0.0) for n in names)

    def heard(self, at: int, within: float = 10.0) -> set:
        """The keys taken once the count moved past ``at``."""
        wait_until(lambda: self.count.value > at, within, "the other server's keys")
        return self.count.take()

    def stop(self) -> None:
        self.feed.stop()
        self.engine.dispose()


@pytest.fixture
def sides(postgres_url):
    migrate(make_engine(postgres_url))
    a, b = Side(postgres_url), Side(postgres_url)
    try:
        wait_until(lambda: a.feed.connected.is_set() and b.feed.connected.is_set(), 10, "both listeners")
        wait_until(lambda: a.resyncs and b.resyncs, 10, "the first resync")
        a.count.take(), b.count.take()
        yield a, b
    finally:
        a.stop(), b.stop()


def test_a_commit_s_keys_reach_the_other_server_s_count_and_its_own_at_once(sides):
    a, b = sides
    at_a, at_b = a.count.value, b.count.value
    a.add("gpu", "cpu")
    assert a.count.value == at_a + 1 and a.count.take() == {"gpu", "cpu"}  # its own: at the commit
    assert b.heard(at_b) == {"gpu", "cpu"}
    time.sleep(0.3)
    assert a.count.value == at_a + 1, "a server's own notification is not applied twice"


def test_keys_recorded_beside_the_orm_and_a_bulk_update_arrive_too(sides):
    a, b = sides
    at = b.count.value
    a.add("gpu")
    assert b.heard(at) == {"gpu"}
    at = b.count.value
    with a.sessions() as s, s.begin():
        s.execute(text("UPDATE partitions SET updated = 1 WHERE name = 'gpu'"))  # past the ORM
        note_changes(s, PartitionRow, ["gpu"])
    assert b.heard(at) == {"gpu"}
    at = b.count.value
    with a.sessions() as s, s.begin():
        s.execute(update(PartitionRow).values(updated=2.0))  # any row may have changed
    assert b.heard(at) == {ALL}


def test_a_rollback_sends_nothing_and_keys_arrive_in_commit_order(sides):
    a, b = sides
    at = b.count.value
    with a.sessions() as s:
        s.add(PartitionRow(name="never", changes={}, updated=0.0))
        s.flush()
        s.rollback()
    a.add("after")
    assert b.heard(at) == {"after"}
    assert b.count.value == at + 1, "the rolled back commit moved nothing"


def test_a_savepoint_s_keys_go_with_the_whole_transaction_once(sides):
    a, b = sides
    at = b.count.value
    with a.sessions() as s, s.begin():
        with s.begin_nested():
            s.add(PartitionRow(name="inner", changes={}, updated=0.0))
        s.add(PartitionRow(name="outer", changes={}, updated=0.0))
    assert b.heard(at) == {"inner", "outer"}


def test_a_commit_of_thousands_of_keys_arrives_whole_in_several_notifications(sides):
    a, b = sides
    names = [f"partition-with-a-long-name-{i:05d}" for i in range(3000)]  # ~100 KB of keys
    at = b.count.value
    a.add(*names)
    wait_until(lambda: b.count.value >= at + 2, 10, "every notification")  # one count per notification
    got: set = set()
    wait_until(lambda: got.update(b.count.take()) or got == set(names), 10, "every key")


def test_a_listener_back_from_a_lost_connection_reads_everything_again(sides, postgres_url):
    a, b = sides
    at, resyncs = b.count.value, b.resyncs
    with a.sessions() as s, s.begin():  # cut the listening connections, as a network fault would
        s.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"))
    wait_until(lambda: b.resyncs > resyncs, 15, "b to listen again")
    assert b.heard(at) == {ALL}
    at = b.count.value
    a.add("after-the-cut")
    assert b.heard(at) == {"after-the-cut"}


def test_many_commits_from_threads_on_both_sides_are_each_seen_by_the_other(sides):
    a, b = sides
    seen = {"a": set(), "b": set()}
    stop = threading.Event()

    def collect(side, into):
        while not stop.is_set():
            into |= side.count.take()
            time.sleep(0.01)

    collectors = [threading.Thread(target=collect, args=(a, seen["a"])),
                  threading.Thread(target=collect, args=(b, seen["b"]))]
    for t in collectors:
        t.start()
    try:
        def write(side: Side, prefix: str) -> None:
            for i in range(25):
                side.add(f"{prefix}-{i}")

        writers = [threading.Thread(target=write, args=(side, f"{name}{w}"))
                   for side, name in ((a, "a"), (b, "b")) for w in range(3)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        every = {f"{n}{w}-{i}" for n in "ab" for w in range(3) for i in range(25)}
        wait_until(lambda: seen["a"] >= every and seen["b"] >= every, 15, "every commit on both sides")
    finally:
        stop.set()
        for t in collectors:
            t.join()
    with a.sessions() as s:
        assert set(s.scalars(select(PartitionRow.name))) == every
