"""sbatch: submit a batch script (or --wrap a command) to Shoal, as Slurm's sbatch does.

The shell (shoal.cli.sbatch) reads what only its process can (argv, the script file or standard
input, the environment); ``run`` does the rest with every input passed in, so the server runs the
very same code for the compiled front end (POST /shoal/v1/commands/sbatch).
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TextIO


def read_script(data: bytes) -> str:
    """A script's bytes as text that gives back the very same bytes: no newline translation
    (a lone CR stays a CR), and bytes that are not UTF-8 kept as surrogates."""
    return data.decode("utf-8", "surrogateescape")


def run(argv: list[str], script: str | None, source: str | None, *, cwd: str, environ: Mapping[str, str],
        now: float, connect: Callable[[], Any], out: TextIO, err: TextIO, prog: str | None = None,
        may_wait: bool = True) -> int:
    """Parse, submit and report: what sbatch prints, written to ``out``/``err``; the exit code.

    ``script`` is the text of ``source`` (a path, ``-`` for standard input, None with --wrap);
    ``connect()`` gives the API (Client.get/post). Without ``may_wait``, --wait raises
    RunLocally before anything is submitted.
    """
    from shoal.api_client import ClientError, RunLocally, print_error, program_name
    from shoal.slurm.options import OptionError, parse_sbatch

    prog = prog or program_name()
    try:
        req = parse_sbatch(argv, script, cwd=cwd, environ=environ, now=now)
    except OptionError as e:
        print_error(err, prog, str(e))
        return e.exit_code
    if req.wait and not may_wait:
        raise RunLocally("--wait blocks until the job ends")
    body = req.body
    if source not in (None, "-"):
        body["environment"]["SHOAL_SUBMIT_COMMAND"] = os.path.normpath(os.path.join(cwd, source))
    try:
        client = connect()
        if req.test_only:
            answer = client.post("/shoal/v1/jobs/test", body)
            print(f"sbatch: Job {answer['job_id']} to start at {answer['start_time']} using "
                  f"{answer['cpus']} processors on nodes {answer['nodelist']} in partition "
                  f"{answer['partition']}", file=err)
            return 0
        answer = client.post("/shoal/v1/jobs", body)
    except ClientError as e:
        return print_error(err, prog, f"Batch job submission failed: {e}")
    job_id = answer["job_id"]
    if req.parsable:
        print(job_id, file=out)
    else:
        print(f"Submitted batch job {job_id}", file=out)
    out.flush()
    if req.wait:
        return _wait(client, job_id)
    return 0


def _wait(client, job_id: int) -> int:
    """--wait: block until the job (all array tasks) ends; exit with its highest exit code."""
    from shoal.api_client import ClientError, fail

    delay = 0.05
    while True:
        try:
            jobs = client.get("/shoal/v1/jobs", {"job_id": str(job_id), "all": "true"})["jobs"]
        except ClientError as e:
            fail(str(e))
        if jobs and all(j["state"] not in ("PENDING", "RUNNING") for j in jobs):
            worst = max((j["exit_code"] or 0) for j in jobs)
            if any(j["state"] != "COMPLETED" for j in jobs) and worst == 0:
                worst = 1
            return worst
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)

