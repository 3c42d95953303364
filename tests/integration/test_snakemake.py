"""Snakemake with its slurm executor plugin (both from PyPI) runs a workflow on a Shoal cluster
unchanged: it submits each rule's job with sbatch (--comment, --export, -A, -p, --mem...), polls
sacct (--clusters all), reads scontrol show config, and each job runs its rule under srun."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytest.importorskip("snakemake")  # in pyproject's test extras
pytest.importorskip("snakemake_executor_plugin_slurm")

SNAKEFILE = """\
SAMPLES = ["a", "b", "c"]

rule all:
    input: "report.txt"

rule make:
    output: "raw/{s}.txt"
    resources: mem_mb=1000, runtime=5
    shell: "echo {wildcards.s} $SLURM_JOB_ID > {output}"

rule upper:
    input: "raw/{s}.txt"
    output: "up/{s}.txt"
    shell: "tr a-z A-Z < {input} > {output}"

rule merge:
    input: expand("up/{s}.txt", s=SAMPLES)
    output: "merged.txt"
    threads: 2
    shell: "cat {input} > {output}"

rule report:
    input: "merged.txt"
    output: "report.txt"
    shell: "wc -l < {input} > {output}"
"""


@pytest.mark.slow
def test_a_five_rule_workflow_runs_with_the_slurm_executor(cluster, tmp_path):
    work = tmp_path / "flow"
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    env = {k: v for k, v in cluster.env.items() if not k.startswith("SLURM_")}
    snakemake = shutil.which("snakemake", path=f"{sys.prefix}/bin")
    out = subprocess.run([snakemake, "--executor", "slurm", "--jobs", "4", "--latency-wait", "5",
                          "--default-resources", "slurm_account=root",
                          "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (work / "report.txt").read_text().strip() == "3"
    assert (work / "up" / "a.txt").read_text().split()[0] == "A"
    assert len([j for j in cluster.jobs() if j["state"] == "COMPLETED"]) == 8  # 3 + 3 + 1 + 1 rules' jobs
