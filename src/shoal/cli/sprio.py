"""sprio: the factors that make up each pending job's multifactor priority, as Slurm's sprio.

Fetching (GET /shoal/v1/priority) is kept apart from rendering: ``render_priorities(doc,
options)`` is a pure function the tests call directly.
"""

from __future__ import annotations

import sys

from shoal.api_client import Client, ClientError, fail
from shoal.slurm.fmt import Field, FormatError, argument_parser, emit, parse_format, render, split_list

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the command's start-up time
    from collections.abc import Mapping
    from typing import Any

DEFAULT_FORMAT = "%.15i %9r %.8u %.10Y %.10S %.10A %.10F %.10J %.10P %.10Q"
LONG_FORMAT = "%.15i %9r %.8u %.8o %.10Y %.10S %.10A %.10F %.10J %.10P %.10n %.10Q %.11N"
NORM_FORMAT = "%.15i %9r %.8u %.10y %.10S %.10a %.10f %.10j %.10p %.10q"

_WEIGHTS_ROW = "Weights"


def _job_id(job: Mapping[str, Any], now: float) -> str:
    if job.get("array_task_id") is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


def _weighted(key: str):
    """A weighted term, shown as a whole number as sprio does."""
    return lambda j, now: "" if j.get(key) is None else str(round(j[key]))


def _norm(key: str):
    return lambda j, now: "" if j.get("factors") is None else f"{j['factors'][key]:.7f}"


FIELDS: dict[str, Field] = {
    "a": Field("AGE", _norm("age")),
    "A": Field("AGE", _weighted("age")),
    "f": Field("FAIRSHARE", _norm("fairshare")),
    "F": Field("FAIRSHARE", _weighted("fairshare")),
    "i": Field("JOBID", _job_id),
    "j": Field("JOBSIZE", _norm("jobsize")),
    "J": Field("JOBSIZE", _weighted("jobsize")),
    "N": Field("NICE", lambda j, now: j.get("nice", "")),
    "n": Field("QOSNAME", lambda j, now: j.get("qos") or ""),
    "o": Field("ACCOUNT", lambda j, now: j.get("account") or ""),
    "p": Field("PARTITION", _norm("partition")),
    "P": Field("PARTITION", _weighted("partition_priority")),
    "q": Field("QOS", _norm("qos")),
    "Q": Field("QOS", _weighted("qos_priority")),
    "r": Field("PARTITION", lambda j, now: j.get("partition") or ""),
    "S": Field("SITE", lambda j, now: j.get("site", "")),
    "u": Field("USER", lambda j, now: j.get("user") or ""),
    "y": Field("PRIORITY", lambda j, now: "" if j.get("priority") is None
               else f"{j['priority'] / 0xFFFFFFFF:.10f}"),
    "Y": Field("PRIORITY", lambda j, now: "" if j.get("priority") is None else str(j["priority"])),
}


def weights_row(weights: Mapping[str, Any]) -> dict:
    """sprio -w: one row, under the same columns, giving each factor's weight."""
    return {"job_id": _WEIGHTS_ROW, "site": 1, "age": weights["age"], "fairshare": weights["fairshare"],
            "jobsize": weights["jobsize"], "partition_priority": weights["partition"],
            "qos_priority": weights["qos"]}


def render_priorities(doc: Mapping[str, Any], options) -> str:
    """sprio's table for a GET /shoal/v1/priority answer."""
    fmt = options.format or (LONG_FORMAT if options.long else NORM_FORMAT if options.norm
                             else DEFAULT_FORMAT)
    specs = parse_format(fmt, FIELDS)
    rows = [weights_row(doc["weights"])] if options.weights else doc["jobs"]
    return render(specs, rows, 0.0, header=not options.noheader)


def parse_args(argv: list[str] | None):
    p = argument_parser("sprio", "View the factors that make up pending jobs' priorities, as Slurm's sprio.")
    p.add_argument("-j", "--jobs", action="append", help="comma list of job ids")
    p.add_argument("-u", "--user", action="append", help="comma list of users")
    p.add_argument("-l", "--long", action="store_true", help="long report (account, QOS name, nice)")
    p.add_argument("-n", "--norm", action="store_true", help="normalised factors instead of weighted ones")
    p.add_argument("-w", "--weights", action="store_true", help="show the configured weights")
    p.add_argument("-o", "--format", help="output format, e.g. '%%.15i %%.10Y %%.10F'")
    p.add_argument("-h", "--noheader", action="store_true", help="no header line")
    p.add_argument("--help", action="help", help="show this help and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
        if options.format:
            parse_format(options.format, FIELDS)  # a bad format fails before the server is asked
        params = {"job_id": split_list(options.jobs) or None,
                  "user": ",".join(split_list(options.user)) or None}
        doc = Client.from_config().get("/shoal/v1/priority", params)
        if doc["weights"]["type"] != "multifactor" and not options.weights:
            fail("PriorityType is basic: jobs run in submit order and have no priority factors "
                 "(set priority: {type: multifactor} in the cluster configuration)")
        if options.jobs and not doc["jobs"] and not options.weights:
            fail("Unable to find jobs matching user/id(s) specified (only pending jobs have priorities)")
        emit(render_priorities(doc, options))
    except (ClientError, FormatError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
