"""Which pending jobs a pass's plan gives a new reason or start estimate
(Controller._changed_reasons), against the kept rows' reasons and estimates (JobRowCache's
said_reason and said_start): exactly the jobs whose (reason, estimate) differs from the row's,
in any pass; in a quick pass (no estimates) only the reason counts."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from shoal.server.controller import Controller

IDS = st.integers(1, 12)
REASONS = st.sampled_from(["Priority", "Resources", "Dependency", None])
STARTS = st.sampled_from([100.0, 250.0, 900.0])


@given(said=st.dictionaries(IDS, st.tuples(REASONS, st.one_of(st.none(), STARTS))),
       reasons=st.dictionaries(IDS, REASONS.filter(lambda r: r is not None)),
       estimates=st.one_of(st.none(), st.dictionaries(IDS, STARTS)))
def test_the_changed_jobs_are_those_whose_reason_or_estimate_differs_from_their_rows(said, reasons, estimates):
    rows = SimpleNamespace(said_reason={jid: reason for jid, (reason, _) in said.items()},
                           said_start={jid: start for jid, (_, start) in said.items() if start is not None})
    changed = Controller._changed_reasons(SimpleNamespace(_rows=rows), reasons, estimates)
    if estimates is None:
        expected = {jid for jid, reason in reasons.items() if jid not in said or said[jid][0] != reason}
    else:
        expected = {jid for jid, reason in reasons.items() if said.get(jid) != (reason, estimates.get(jid))}
    assert changed == expected
