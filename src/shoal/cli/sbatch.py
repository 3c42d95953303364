"""sbatch: submit a batch script (or --wrap a command) to Shoal, as Slurm's sbatch does."""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from shoal.cli.client import Client, ClientError, fail
    from shoal.cli.options import OptionError, parse_sbatch, script_source

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help", "--usage"):
        print("Usage: sbatch [OPTIONS...] script [args...]\n       sbatch [OPTIONS...] --wrap=command\n"
              "Options are those of Slurm's sbatch; #SBATCH lines in the script give defaults.")
        return 0
    try:
        source = script_source(argv)
        script = None
        if source == "-":
            if sys.stdin.isatty():
                fail("no batch script: name a script file, pipe one on standard input, or use --wrap")
            script = sys.stdin.read()
        elif source is not None:
            try:
                with open(source, encoding="utf-8", errors="surrogateescape") as f:
                    script = f.read()
            except OSError as e:
                fail(f"Unable to open file {source}: {e.strerror}")
        req = parse_sbatch(argv, script, cwd=os.getcwd(), environ=os.environ, now=time.time())
    except OptionError as e:
        fail(str(e))
    body = req.body
    if source not in (None, "-"):
        body["environment"]["SHOAL_SUBMIT_COMMAND"] = os.path.abspath(source)
    try:
        client = Client.from_config()
        if req.test_only:
            out = client.post("/api/v1/jobs/test", body)
            print(f"sbatch: Job {out['job_id']} to start at {out['start_time']} using "
                  f"{out['cpus']} processors on nodes {out['nodelist']} in partition {out['partition']}",
                  file=sys.stderr)
            return 0
        out = client.post("/api/v1/jobs", body)
    except ClientError as e:
        fail(f"Batch job submission failed: {e}")
    job_id = out["job_id"]
    if req.parsable:
        print(job_id)
    else:
        print(f"Submitted batch job {job_id}")
    sys.stdout.flush()
    if req.wait:
        return _wait(client, job_id)
    return 0


def _wait(client, job_id: int) -> int:
    """--wait: block until the job (all array tasks) ends; exit with its highest exit code."""
    from shoal.cli.client import ClientError, fail

    delay = 0.05
    while True:
        try:
            jobs = client.get("/api/v1/jobs", {"job_id": str(job_id), "all": "true"})["jobs"]
        except ClientError as e:
            fail(str(e))
        if jobs and all(j["state"] not in ("PENDING", "RUNNING") for j in jobs):
            worst = max((j["exit_code"] or 0) for j in jobs)
            if any(j["state"] != "COMPLETED" for j in jobs) and worst == 0:
                worst = 1
            return worst
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


if __name__ == "__main__":
    sys.exit(main())
