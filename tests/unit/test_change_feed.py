"""The change feed's notifications: what servers sharing a store tell each other."""

from __future__ import annotations

import json

from shoal.store.feed import MAX_PAYLOAD, ChangeFeed


def test_a_pass_that_starts_work_on_a_thousand_nodes_wakes_each_of_them_on_the_other_servers():
    """A bump naming 1,000 nodes is over PostgreSQL's NOTIFY limit: it is split into
    notifications that each fit and that name every node once between them, with the other
    events alongside (the split used to merge its halves back together until Python's
    recursion limit, and no follower heard the wake-ups)."""
    feed = ChangeFeed(engine=None, deliver=lambda event: None)  # type: ignore[arg-type]
    nodes = [f"hollow-{i:04d}" for i in range(1000)]
    payloads = feed._payloads([{"bump": nodes[:600]}, {"wake": "scheduler"}, {"bump": nodes[400:]}])
    events = [e for p in payloads for e in json.loads(p)["e"]]
    assert all(len(p) <= MAX_PAYLOAD for p in payloads) and len(payloads) > 1
    named = [n for e in events if "bump" in e for n in e["bump"]]
    assert sorted(named) == nodes
    assert [e for e in events if "bump" not in e] == [{"wake": "scheduler"}]
