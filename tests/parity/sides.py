"""The two sides of the differential suite: a real Slurm 22.05 and a Shoal local cluster of one shape.

Both run the same bash command line in a fresh directory of their own, with their own commands
first on PATH. What comes back (stdout, stderr, exit status, files written) is normalised by
``normalise`` so that job ids, times, paths and the cluster's names read the same on both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.slurm import cluster as slurm
from tests.integration.cluster import BIN, LocalCluster

NODES, GPUS_PER_NODE, CPUS_PER_NODE, MEMORY_MB = 2, 4, 64, 512000
PARTITION, CLUSTER_NAME = "gpu", "shoalbench"  # bench/slurm/slurm.conf.in's names

# The commands a Slurm user types; on the Shoal side any that Shoal does not ship must not
# quietly resolve to the real Slurm's binary in /usr/bin (the sacctmgr/salloc trap).
SLURM_COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scancel", "sinfo", "scontrol", "sacct", "sstat",
                  "sacctmgr", "sreport", "sdiag", "sattach", "sprio", "sshare", "strigger", "sbcast")

# Defined before every case's command line: wait for a job to end, as scripts poll for it.
PRELUDE = """\
wait_job() { for _ in $(seq 600); do
  scontrol -o show job "$1" 2>/dev/null | grep -Eq 'JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL) ' && return 0
  sleep 0.1; done; echo "wait_job: job $1 did not end" >&2; return 1; }
"""


@dataclass(frozen=True)
class Outcome:
    """What one side showed for one case, before normalisation."""

    stdout: str
    stderr: str
    rc: int
    files: dict[str, str]
    job_ids: tuple[int, ...]  # the jobs this case submitted, oldest first


class Side:
    """A cluster that runs case command lines; subclasses say where its commands live."""

    name = ""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.cases = root / "cases"
        self.cases.mkdir(parents=True, exist_ok=True)

    def job_ids(self) -> set[int]:
        raise NotImplementedError

    def run(self, case_id: str, command: str, files: dict[str, str], timeout: float) -> Outcome:
        workdir = self.cases / case_id
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir()
        for name, text in files.items():
            (workdir / name).write_text(text)
        before = self.job_ids()
        try:
            out = subprocess.run(["bash", "-c", PRELUDE + command], env=self.env, cwd=workdir, capture_output=True,
                                 text=True, timeout=timeout)
            stdout, stderr, rc = out.stdout, out.stderr, out.returncode
        except subprocess.TimeoutExpired as e:
            stdout, stderr, rc = _text(e.stdout), _text(e.stderr) + f"\n[timed out after {timeout:g} s]", -1
        written = {p.name: p.read_text(errors="replace") for p in sorted(workdir.iterdir())
                   if p.is_file() and p.name not in files}
        new_ids = tuple(sorted(self.job_ids() - before))
        stdout, stderr = stdout.replace(str(workdir), "<workdir>"), stderr.replace(str(workdir), "<workdir>")
        written = {k: v.replace(str(workdir), "<workdir>") for k, v in written.items()}
        return Outcome(stdout, stderr, rc, written, new_ids)


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


class SlurmSide(Side):
    """slurmctld, two slurmd and munged from Debian's slurm-wlm (bench/slurm/cluster.py)."""

    name = "slurm"

    def __init__(self, root: Path) -> None:
        slurm.ensure_installed()
        self.cluster = slurm.SlurmCluster(root / "daemons", slurm.DEFAULT, nodes=NODES, gpus_per_node=GPUS_PER_NODE,
                                          cpus_per_node=CPUS_PER_NODE, memory_mb=MEMORY_MB)
        if not self.cluster.multiple_slurmd:
            raise slurm.SlurmSetupError("this slurmd cannot run several nodes on one host (-N); the suite needs 2")
        super().__init__(root, self.cluster.env)

    def up(self) -> SlurmSide:
        self.cluster.up()
        return self

    def down(self) -> None:
        self.cluster.down()

    def job_ids(self) -> set[int]:
        out = subprocess.run([self.cluster.bin("scontrol"), "-o", "show", "job"], env=self.env, capture_output=True,
                             text=True)
        return {int(m) for m in re.findall(r"^JobId=(\d+) ", out.stdout, re.M)}


class ShoalSide(Side):
    """``shoal up`` with the Slurm side's nodes, GPUs, CPUs, memory, partition and cluster name."""

    name = "shoal"

    def __init__(self, root: Path) -> None:
        config = root / "cluster.yaml"
        root.mkdir(parents=True, exist_ok=True)
        names = [f"node{i:02d}" for i in range(1, NODES + 1)]
        config.write_text(json.dumps({
            "cluster_name": CLUSTER_NAME,
            "partitions": [{"name": PARTITION, "nodes": f"node[01-{NODES:02d}]", "default": True}],
            "nodes": {"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 30.0, "kill_wait_s": 2.0},
        }))
        assert len(names) == NODES
        self.cluster = LocalCluster(root / "cluster", nodes=NODES, gpus_per_node=GPUS_PER_NODE,
                                    cpus_per_node=CPUS_PER_NODE, memory=f"{MEMORY_MB}M", config=str(config))
        stubs = root / "not-shipped"
        stubs.mkdir(exist_ok=True)
        for command in SLURM_COMMANDS:
            if not (BIN / command).exists():
                stub = stubs / command
                stub.write_text(f'#!/bin/sh\necho "bash: {command}: command not found" >&2\nexit 127\n')
                stub.chmod(0o755)
        env = {k: v for k, v in self.cluster.env.items() if not k.startswith("SLURM_")}
        env["PATH"] = f"{BIN}{os.pathsep}{stubs}{os.pathsep}{env['PATH']}"
        super().__init__(root, env)

    def up(self) -> ShoalSide:
        self.cluster.up()
        return self

    def down(self) -> None:
        self.cluster.down()

    def job_ids(self) -> set[int]:
        return {int(j["job_id"]) for j in self.cluster.jobs()}


# ---------------------------------------------------------------------- normalisation

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
_KEY_VALUE = re.compile(r"(\S+?)=(\S*)")


def normalise(text: str, job_ids: tuple[int, ...], fields: list[str] | None = None) -> str:
    """Job ids as J1, J2... in submission order, timestamps as <time>; with ``fields``,
    each ``Key=Value`` line reduced to those keys (in the order given)."""
    for n, job_id in enumerate(job_ids, start=1):
        text = re.sub(rf"(?<![\d.]){job_id}(?!\d)", f"J{n}", text)
    text = _TIMESTAMP.sub("<time>", text)
    if fields is not None:
        text = "".join(_select(record, fields) for record in _records(text))
    return text


def _records(text: str) -> list[str]:
    """scontrol's records: a flush-left line and its indented continuation lines (-o: one line each)."""
    records: list[str] = []
    for line in text.splitlines():
        if line[:1].isspace() and records:
            records[-1] += " " + line.strip()
        elif line.strip():
            records.append(line)
    return records


def _select(record: str, fields: list[str]) -> str:
    pairs = dict(_KEY_VALUE.findall(record))
    if not pairs:
        return record + "\n"
    return " ".join(f"{k}={pairs.get(k, '<absent>')}" for k in fields) + "\n"
