"""Fixtures of the differential suite: one real Slurm and one Shoal cluster for the whole session."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.parity.sides import ShoalSide, SlurmSide

# case id -> True (identical), False (a documented difference); filled by test_slurm_parity.
RESULTS: dict[str, bool] = {}


@pytest.fixture(scope="session")
def sides(tmp_path_factory):
    """(Slurm, Shoal), started once, side by side; both stopped at the end of the session."""
    root = tmp_path_factory.mktemp("parity")
    # munged runs as the munge user and checks every directory on its socket's path, which
    # pytest's private (0700) temporary tree would fail: Slurm's side lives in /tmp itself.
    slurm_root = Path(tempfile.mkdtemp(prefix="shoal-parity-slurm-"))
    slurm_root.chmod(0o755)
    real = SlurmSide(slurm_root)
    shoal = ShoalSide(root / "shoal")
    real.up()
    try:
        shoal.up()
    except BaseException:
        real.down()
        shutil.rmtree(slurm_root, ignore_errors=True)
        raise
    yield real, shoal
    shoal.down()
    real.down()
    shutil.rmtree(slurm_root, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        same = sum(RESULTS.values())
        terminalreporter.write_line(
            f"Slurm parity: {len(RESULTS)} cases, {same} identical ({100 * same / len(RESULTS):.0f}%), "
            f"{len(RESULTS) - same} different")
