"""The same command lines on a real Slurm 22.05 and on Shoal, compared after normalisation.

Each case in cases.yaml is identical on both, or names its row (``differs: D<n>``) in the
table of deliberate differences, docs/SLURM-DIFFERENCES.md; a documented case that becomes
identical fails too, so the table never outlives the difference.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.parity.conftest import RESULTS
from tests.parity.sides import Outcome, normalise

HERE = Path(__file__).resolve().parent
CASES = yaml.safe_load((HERE / "cases.yaml").read_text())
DIFFERENCES = HERE.parents[1] / "docs" / "SLURM-DIFFERENCES.md"
ASPECTS = ("stdout", "stderr", "rc", "files")


def seen(outcome: Outcome, case: dict) -> dict[str, object]:
    """What a user or script sees of one side's outcome, normalised; only the case's aspects."""
    fields = case.get("fields")
    ids = outcome.job_ids
    view = {"stdout": normalise(outcome.stdout, ids, fields), "stderr": normalise(outcome.stderr, ids),
            "rc": outcome.rc,
            "files": {normalise(k, ids): normalise(v, ids, fields) for k, v in outcome.files.items()}}
    return {k: view[k] for k in case.get("compare", ASPECTS)}


def test_cases_are_well_formed():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)), "case ids repeat"
    table = DIFFERENCES.read_text()
    for case in CASES:
        assert set(case) <= {"id", "run", "files", "fields", "compare", "differs", "timeout"}, case["id"]
        assert set(case.get("compare", ASPECTS)) <= set(ASPECTS), case["id"]
        if "differs" in case:
            assert re.search(rf"^\| {case['differs']} \|", table, re.M), \
                f"{case['id']}: {case['differs']} is not a row of {DIFFERENCES.name}"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_same_as_slurm(sides, case):
    real, shoal = sides
    timeout = case.get("timeout", 60)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(side.run, case["id"], case["run"], case.get("files", {}), timeout)
                for side in (real, shoal)]
        expected, got = (seen(r.result(), case) for r in runs)
    identical = expected == got
    if not identical and os.environ.get("SHOAL_PARITY_REPORT"):  # both sides' views, to read a difference whole
        with open(os.environ["SHOAL_PARITY_REPORT"], "a") as f:
            f.write(json.dumps({"id": case["id"], "slurm": expected, "shoal": got}) + "\n")
    RESULTS[case["id"]] = identical
    if "differs" in case:
        assert not identical, f"{case['id']} is now identical to Slurm: drop 'differs: {case['differs']}' " \
                              f"and its row in {DIFFERENCES.name} if nothing else cites it"
        return
    assert got == expected, f"{case['id']}: Shoal differs from Slurm 22.05 on `{case['run']}`"
