"""Group commit: submissions made at once share a transaction, and each is answered only
once committed; a refused one fails alone, and a write that breaks the shared transaction
is retried alone so the others still commit."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from shoal.server.groupcommit import GroupCommit

metadata = MetaData()
jobs = Table("jobs", metadata, Column("id", Integer, primary_key=True), Column("name", String, unique=True))


class Refused(Exception):
    pass


@pytest.fixture
def store(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'g.db'}", connect_args={"check_same_thread": False, "timeout": 30})
    metadata.create_all(engine)
    commits = []
    sessions = sessionmaker(engine)

    def counting():
        s = sessions()
        from sqlalchemy import event

        event.listen(s, "after_commit", lambda _s: commits.append(1))
        return s

    yield engine, GroupCommit(counting, refusals=(Refused,)), commits
    engine.dispose()


def submit(name: str):
    def work(s):
        if name.startswith("refuse"):
            raise Refused(name)
        return s.execute(insert(jobs).values(name=name)).inserted_primary_key[0]

    return work


def names(engine) -> set[str]:
    with engine.connect() as c:
        return set(c.scalars(select(jobs.c.name)))


def test_submissions_made_at_once_share_commits_and_each_gets_its_own_answer(store):
    engine, group, commits = store
    answers: dict[str, object] = {}
    start = threading.Barrier(16)

    def user(i: int):
        start.wait()
        try:
            answers[f"job{i}"] = group.run(submit(f"job{i}" if i % 5 else f"refuse{i}"))
        except Refused as e:
            answers[f"job{i}"] = e

    threads = [threading.Thread(target=user, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = names(engine)
    assert stored == {f"job{i}" for i in range(16) if i % 5}
    assert all(isinstance(answers[f"job{i}"], Refused) for i in range(0, 16, 5))
    assert len({answers[f"job{i}"] for i in range(16) if i % 5}) == len(stored)  # distinct ids
    assert len(commits) < len(stored), "concurrent submissions should share commits"


def test_a_write_that_breaks_the_shared_transaction_fails_alone(store):
    engine, group, _ = store
    group.run(submit("taken"))
    results = []
    barrier = threading.Barrier(4)

    def user(name: str):
        barrier.wait()
        try:
            results.append(group.run(submit(name)))
        except IntegrityError:
            results.append("duplicate")

    threads = [threading.Thread(target=user, args=(n,)) for n in ("a", "b", "taken", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("duplicate") == 1
    assert names(engine) == {"taken", "a", "b", "c"}


def test_a_commit_that_fails_is_never_run_again(tmp_path):
    """A connection lost during COMMIT leaves its outcome unknown: the jobs may be stored.
    Running the works again could store each twice, so every caller gets the error instead."""
    engine = create_engine(f"sqlite:///{tmp_path / 'g.db'}", connect_args={"check_same_thread": False})
    metadata.create_all(engine)
    sessions = sessionmaker(engine)
    runs: list[str] = []

    def failing_commit():
        from sqlalchemy import event

        s = sessions()
        event.listen(s, "before_commit", lambda _s: (_ for _ in ()).throw(ConnectionError("lost at COMMIT")))
        return s

    group = GroupCommit(failing_commit, refusals=(Refused,))
    errors = []
    barrier = threading.Barrier(3)

    def work(name: str):
        def run(s):
            runs.append(name)
            if name == "a":
                time.sleep(0.3)  # the others queue up meanwhile and share the next commit
            return submit(name)(s)

        return run

    def user(name: str):
        if name != "a":
            barrier.wait()
            time.sleep(0.05)
        try:
            group.run(work(name))
        except (ConnectionError, Refused) as e:
            errors.append(type(e).__name__)

    threads = [threading.Thread(target=user, args=(n,)) for n in ("a", "b", "refuse-c", "d")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    assert sorted(runs) == ["a", "b", "d", "refuse-c"]  # each work ran once, never again alone
    assert sorted(errors) == ["ConnectionError"] * 3 + ["Refused"]
