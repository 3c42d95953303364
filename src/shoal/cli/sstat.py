"""sstat: what a running job's steps have used so far, printed the way Slurm's sstat does.

The figures come from each step's cgroup on each of its nodes (the server asks the nodes'
agents: GET /shoal/v1/jobs/ID/usage). A node's cgroup holds all of a step's tasks there, so
the Max/Min fields name a node, not a task (their ...Task fields are blank), and the
averages are the step's totals divided by its tasks. ``render_sstat`` is pure.
"""

from __future__ import annotations

import os
import sys

from shoal.api_client import Client, ClientError, fail, print_error, program_name
from shoal.slurm.fmt import FormatError, argument_parser, emit, split_list
from shoal.cli.sacct import Column, cpu_time_text, parse_fields, print_fields, size_text, usage_columns
from shoal.model.hostlist import compress

# Slurm 22.05's STAT_FIELDS (src/sstat/sstat.h).
DEFAULT_FIELDS = (
    "jobid,maxvmsize,maxvmsizenode,maxvmsizetask,avevmsize,maxrss,maxrssnode,maxrsstask,averss,maxpages,"
    "maxpagesnode,maxpagestask,avepages,mincpu,mincpunode,mincputask,avecpu,ntasks,avecpufreq,"
    "reqcpufreqmin,reqcpufreqmax,reqcpufreqgov,consumedenergy,maxdiskread,maxdiskreadnode,maxdiskreadtask,"
    "avediskread,maxdiskwrite,maxdiskwritenode,maxdiskwritetask,avediskwrite,tresusageinave,tresusageinmax,"
    "tresusageinmaxnode,tresusageinmaxtask,tresusageinmin,tresusageinminnode,tresusageinmintask,"
    "tresusageintot,tresusageoutave,tresusageoutmax,tresusageoutmaxnode,tresusageoutmaxtask,"
    "tresusageoutmin,tresusageoutminnode,tresusageoutmintask,tresusageouttot")

# Slurm's abbreviations of the TRES fields' names, accepted as it accepts them.
ALIASES = {"tresusageinmaxn": "tresusageinmaxnode", "tresusageinmaxt": "tresusageinmaxtask",
           "tresusageinminn": "tresusageinminnode", "tresusageinmint": "tresusageinmintask",
           "tresusageoutmaxn": "tresusageoutmaxnode", "tresusageoutmaxt": "tresusageoutmaxtask",
           "tresusageoutminn": "tresusageoutminnode", "tresusageoutmint": "tresusageoutmintask"}


def _nodes(row) -> list[dict]:
    return row["step"]["nodes"]


def _tasks(row) -> int:
    return sum(n.get("tasks") or 0 for n in _nodes(row)) or 1


def _extreme(key: str, pick):
    """The node with the largest (``max``) or smallest (``min``) figure ``key``, or None."""
    def get(row):
        nodes = [n for n in _nodes(row) if n.get(key) is not None]
        return pick(nodes, key=lambda n: n[key]) if nodes else None
    return get


_max_rss, _min_cpu = _extreme("max_rss_kb", max), _extreme("cpu_s", min)


def _average(key: str, text):
    def get(row, now):
        nodes = _nodes(row)
        return text(sum(n.get(key) or 0 for n in nodes) / _tasks(row)) if nodes else None
    return get


def _of(pick, key: str, text=lambda v: v):
    def get(row, now):
        n = pick(row)
        return None if n is None else text(n[key])
    return get


def _as_sacct(row) -> tuple[dict, dict]:
    """This step as sacct's (step, job) pair for shoal.slurm.tresusage: its cgroup figures over
    its nodes (the largest and smallest node, the sum, the sum per task), and the job's GPU use
    (``gpu_usage`` of GET /shoal/v1/jobs/ID/usage)."""
    tres: dict[str, dict] = {stat: {} for stat in ("ave", "max", "min", "tot")}
    for name, key, scale in (("cpu", "cpu_s", 1), ("mem", "max_rss_kb", 1024)):
        nodes = [n for n in _nodes(row) if n.get(key) is not None]
        if not nodes:
            continue
        total = sum(n[key] for n in nodes) * scale
        top, low = max(nodes, key=lambda n: n[key]), min(nodes, key=lambda n: n[key])
        tres["tot"][name], tres["ave"][name] = (total, None), (total / _tasks(row), None)
        tres["max"][name], tres["min"][name] = (top[key] * scale, top["node"]), (low[key] * scale, low["node"])
    step = {"step_id": row["step"]["step_id"], "tres": tres}
    return step, {"gpu_usage": row.get("gpu_usage"), "steps": [{"step_id": "batch"}]}


def _blank(row, now):
    return None  # a figure cgroups do not give (virtual memory, pages, disk, CPU frequency)


_FILLED = (
    Column("JobID", -12, lambda row, now: f"{row['job_id']}.{row['step']['step_id']}"),
    Column("MaxRSS", 10, _of(_max_rss, "max_rss_kb", size_text)),
    Column("MaxRSSNode", 10, _of(_max_rss, "node")),
    Column("AveRSS", 10, _average("max_rss_kb", lambda kb: size_text(int(kb)))),
    Column("MinCPU", 10, _of(_min_cpu, "cpu_s", cpu_time_text)),
    Column("MinCPUNode", 10, _of(_min_cpu, "node")),
    Column("AveCPU", 10, _average("cpu_s", cpu_time_text)),
    Column("NTasks", 8, lambda row, now: _tasks(row) if _nodes(row) else None),
    Column("Nodelist", 20, lambda row, now: row["step"].get("nodelist") or compress(n["node"] for n in _nodes(row))),
    *usage_columns(_as_sacct),
)
_WIDTHS = {  # sstat's fields[] (src/sstat/sstat.c): name -> default width
    "AveCPUFreq": 10, "AveDiskRead": 12, "AveDiskWrite": 12, "AvePages": 10, "AveVMSize": 10,
    "MaxDiskRead": 12, "MaxDiskReadNode": 15,
    "MaxDiskReadTask": 15, "MaxDiskWrite": 12, "MaxDiskWriteNode": 16, "MaxDiskWriteTask": 16, "MaxPages": 8,
    "MaxPagesNode": 12, "MaxPagesTask": 14, "MaxRSSTask": 10, "MaxVMSize": 10, "MaxVMSizeNode": 14,
    "MaxVMSizeTask": 14, "MinCPUTask": 10, "Pids": 20, "ReqCPUFreq": 10, "ReqCPUFreqMin": 13,
    "ReqCPUFreqMax": 13, "ReqCPUFreqGov": 13,
    "TRESUsageInMaxTask": 18, "TRESUsageInMinTask": 18, "TRESUsageOutAve": 15, "TRESUsageOutMax": 15,
    "TRESUsageOutMaxNode": 19, "TRESUsageOutMaxTask": 19, "TRESUsageOutMin": 15, "TRESUsageOutMinNode": 19,
    "TRESUsageOutMinTask": 19, "TRESUsageOutTot": 15,
}
COLUMNS: dict[str, Column] = dict(sorted(
    {c.name.lower(): c for c in (*_FILLED, *(Column(n, w, _blank) for n, w in _WIDTHS.items()))}.items()))


def parse_steps(values: list[str]) -> list[tuple[int, str | None]]:
    """``-j 12,13.0,14.batch``: (job id, step id or None for the job's first step)."""
    out = []
    for text in values:
        job, _, step = text.partition(".")
        if not job.isdigit() or (step and not (step.isdigit() or step in ("batch", "extern"))):
            raise FormatError(f"Bad job/step specified: {text}")
        out.append((int(job), step or None))
    return out


def pick_steps(usage: dict, step: str | None, all_steps: bool) -> list[dict]:
    """The running steps sstat reports: the one asked for; with -a all of them; else the
    job's first srun step (never the batch step, as Slurm skips its special steps)."""
    steps = usage["steps"]
    if all_steps:
        return steps
    if step is not None:
        return [s for s in steps if s["step_id"] == step]
    normal = sorted((s for s in steps if s["step_id"].isdigit()), key=lambda s: int(s["step_id"]))
    return normal[:1]


def not_running(job_id: int, step: str | None) -> str:
    """Slurm's words for a job or step with nothing running."""
    return f"No steps running for job {job_id}" if step is None else f"StepId={job_id}.{step} not found running."


def render_sstat(rows: list[dict], options) -> str:
    """sstat's lines for these (job, step) rows, with its header unless -n."""
    return print_fields(parse_fields(field_spec(options), COLUMNS), rows, options, 0.0)


def field_spec(options) -> str:
    """-o, else $SSTAT_FORMAT, else Slurm's default fields; Slurm's short TRES names spelled out."""
    items = []
    for item in (options.format or os.environ.get("SSTAT_FORMAT") or DEFAULT_FIELDS).split(","):
        name, pct, width = item.strip().partition("%")
        items.append(ALIASES.get(name.lower(), name) + pct + width)
    return ",".join(items)


def parse_args(argv: list[str] | None):
    p = argument_parser("sstat", "Live usage of a running job's steps, as Slurm's sstat.")
    p.add_argument("-j", "--jobs", action="append", help="comma list of JOBID[.STEPID]")
    p.add_argument("-a", "--allsteps", action="store_true", help="every step of the job, the batch step too")
    p.add_argument("-o", "--format", "--fields", help="comma list of fields, e.g. jobid,maxrss,avecpu")
    p.add_argument("-n", "--noheader", action="store_true", help="no header lines")
    p.add_argument("-P", "--parsable2", action="store_true", help="'|'-separated, no trailing '|'")
    p.add_argument("-p", "--parsable", action="store_true", help="'|'-separated, trailing '|'")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("ids", nargs="*", help="==SUPPRESS==")  # argparse.SUPPRESS: sstat takes -j's ids bare too
    options = p.parse_args(argv)
    options.delimiter = "|"
    return options


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
        wanted = parse_steps(split_list(options.jobs) + list(options.ids))
        if not wanted:
            fail("You didn't give me any jobs to stat.")
        columns = parse_fields(field_spec(options), COLUMNS)
        client = Client.from_config()
    except (ClientError, FormatError) as e:
        fail(str(e))
    if not options.noheader:
        emit(print_fields(columns, [], options, 0.0))
    options.noheader = True
    for job_id, step in wanted:
        try:
            usage = client.get(f"/shoal/v1/jobs/{job_id}/usage")
        except ClientError:
            print_error(sys.stderr, program_name(), f"couldn't get steps for job {job_id}")
            continue
        steps = pick_steps(usage, step, options.allsteps)
        if not usage["steps"] or (step is not None and not steps):
            print_error(sys.stderr, program_name(), not_running(job_id, step))
            continue
        emit(print_fields(columns, [{"job_id": job_id, "step": s, "gpu_usage": usage.get("gpu_usage")}
                                    for s in steps], options, 0.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
