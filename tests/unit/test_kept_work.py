"""KeptWork: a node's last work answer, given only for the generation it was built at."""

from __future__ import annotations

from shoal.server.work import KeptWork


def test_an_answer_is_given_for_its_own_generation_only_and_never_replaced_by_an_older_one():
    kept = KeptWork()
    assert kept.get("n1", 0) is None
    kept.keep("n1", 3, b"three")
    assert kept.get("n1", 3) == b"three" and kept.get("n1", 4) is None and kept.get("n2", 3) is None
    kept.keep("n1", 2, b"two")  # built before a later one was kept: a slower thread's
    assert kept.get("n1", 3) == b"three" and kept.get("n1", 2) is None
    kept.keep("n1", 4, b"four")
    assert kept.get("n1", 4) == b"four" and kept.get("n1", 3) is None


def test_an_answer_over_the_limit_is_not_kept_and_drops_the_older_one():
    kept = KeptWork()
    kept.keep("n1", 1, b"small")
    kept.keep("n1", 2, b"x" * (KeptWork.LIMIT + 1))
    assert kept.get("n1", 1) is None and kept.get("n1", 2) is None
