"""scancel: cancel or signal jobs, by id (``12``, ``12_3``, ``12_[1-3]``) or by filter.

Ids alone use POST /shoal/v1/jobs/{id}/cancel one by one; any filter (-u, -t, -p, -n, --me)
uses the bulk POST /shoal/v1/jobs/cancel. As in Slurm, cancelling a job that has already
finished prints an error but exits 0; an unknown job id exits 1.
"""

from __future__ import annotations

import signal as _signal
import sys

from shoal.api_client import ClientError, print_error, program_name
from shoal.slurm.fmt import UsageError as ArgumentsError
from shoal.slurm.fmt import argument_parser, split_list
from shoal.model.arrays import ArraySpecError, parse_array

ALREADY_DONE = "Job/step already completing or completed"
INVALID_ID = "Invalid job id specified"


class UsageError(ValueError):
    """A job id or signal scancel cannot use."""


def parse_signal(text: str | None) -> str | int | None:
    """``USR1``, ``SIGUSR1``, ``10`` -> ``"USR1"`` / ``10``; unknown names are refused."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    name = text.upper().removeprefix("SIG")
    if not hasattr(_signal.Signals, f"SIG{name}") and f"SIG{name}" not in _signal.Signals.__members__:
        raise UsageError(f"Unknown job signal: {text} (expected a name like TERM, USR1 or a number)")
    return name


def expand_job_ids(args: list[str]) -> list[str]:
    """``12 12_3 12_[1-3]`` -> ``['12', '12_3', '12_1', '12_2', '12_3']``."""
    out: list[str] = []
    for arg in args:
        for item in _split_ids(arg):
            base, sep, task = item.partition("_")
            if not base.isdigit() or (sep and not task):
                raise UsageError(f"Invalid job id {item} (expected 12, 12_3 or 12_[1-3])")
            if task.startswith("[") and task.endswith("]"):
                try:
                    ids, _ = parse_array(task[1:-1], max_size=10**9)
                except ArraySpecError as e:
                    raise UsageError(f"Invalid job id {item}: {e}") from None
                out.extend(f"{base}_{t}" for t in ids)
            elif sep and not task.isdigit():
                raise UsageError(f"Invalid job id {item} (expected 12, 12_3 or 12_[1-3])")
            else:
                out.append(item)
    return out


def _split_ids(arg: str) -> list[str]:
    """Split at commas outside brackets: ``12_[1,3],14`` -> ``['12_[1,3]', '14']``."""
    parts, depth, cur = [], 0, ""
    for c in arg:
        depth += (c == "[") - (c == "]")
        if c == "," and not depth:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def kill_error(job_id: str, err: ClientError) -> str:
    """Slurm's wording for a cancel the server refused."""
    reason = {404: INVALID_ID, 409: ALREADY_DONE}.get(err.status or 0, str(err))
    return f"Kill job error on job id {job_id}: {reason}"


_PARSERS: dict[bool, object] = {}


def _parser(remote: bool):
    """The argument parser, built once per process (the server parses every call with it)."""
    if remote in _PARSERS:
        return _PARSERS[remote]
    p = argument_parser("scancel", "Cancel or signal jobs, as Slurm's scancel.", remote=remote)
    p.add_argument("job_ids", nargs="*", help="12, 12_3 or 12_[1-3]")
    p.add_argument("-s", "--signal", help="signal name or number instead of cancelling")
    p.add_argument("-b", "--batch", action="store_true", help="signal only the batch step")
    p.add_argument("-f", "--full", action="store_true", help="signal all steps and the batch shell")
    p.add_argument("-u", "--user", action="append", help="jobs of these users")
    p.add_argument("--me", action="store_true", help="my jobs")
    p.add_argument("-t", "--state", action="append", help="jobs in these states")
    p.add_argument("-p", "--partition", action="append", help="jobs in these partitions")
    p.add_argument("-n", "--name", "--jobname", action="append", help="jobs with these names")
    p.add_argument("-q", "--qos", help="jobs of this QOS")
    p.add_argument("-A", "--account", help="jobs charged to this account")
    p.add_argument("-Q", "--quiet", action="store_true", help="no error messages")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--help", action="help", help="show this help and exit")
    _PARSERS[remote] = p
    return p


def parse_args(argv: list[str] | None, remote: bool = False):
    return _parser(remote).parse_args(argv)


def run(argv: list[str] | None, *, connect, err=None, prog: str | None = None, user: str | None = None,
        remote: bool = False) -> int:
    """Cancel or signal what ``argv`` names; messages to ``err`` (this process's stderr by
    default); the exit code. ``user`` is the login name ``--me`` stands for; ``remote`` is
    the server answering the compiled front end (see squeue.run)."""
    err = err or sys.stderr
    prog = prog or program_name()
    try:
        options = parse_args(argv, remote=remote)
        sig = parse_signal(options.signal)
        ids = expand_job_ids(options.job_ids)
        users = split_list(options.user)
        if options.me:
            if user is None:
                from shoal.api_client import _login_name

                user = _login_name()
            users.append(user)
        filtered = bool(users or options.state or options.partition or options.name or options.qos
                        or options.account)
        if not ids and not filtered:
            raise UsageError("No job identification provided (give job ids, or -u/--me/-t/-p/-n)")
        client = connect()
        if filtered:
            body = {"job_ids": ids or None, "user": users[0] if len(users) == 1 else None,
                    "partition": ",".join(split_list(options.partition)) or None,
                    "states": [s.upper() for s in split_list(options.state)] or None,
                    "name": ",".join(split_list(options.name)) or None, "signal": sig,
                    "qos": options.qos, "account": options.account}
            done = client.post("/shoal/v1/jobs/cancel", body).get("jobs") or []
            if options.verbose:
                for job_id in done:
                    print(f"scancel: {'Signal' if sig else 'Terminating'} job {job_id}", file=err)
            return 0
        rc = 0
        for job_id in ids:
            try:
                client.post(f"/shoal/v1/jobs/{job_id}/cancel",
                            {"signal": sig, "batch": options.batch, "full": options.full})
                if options.verbose:
                    print(f"scancel: {'Signal' if sig else 'Terminating'} job {job_id}", file=err)
            except ClientError as e:
                if e.status is None:
                    raise
                if not options.quiet:
                    print_error(err, prog, kill_error(job_id, e))
                if not (e.status == 409 and sig is None):
                    rc = 1
        return rc
    except (ClientError, UsageError, ArgumentsError) as e:
        return print_error(err, prog, str(e))

