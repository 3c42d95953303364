"""Discrete-event simulator: replays job traces through the very same ``schedule()``.

Imports only ``shoal.model`` and ``shoal.sched`` (plus the standard library);
plotting (matplotlib) and the command line (``shoal.sim.cli``) load lazily.
"""

from shoal.sim.cluster import SimCluster, SimClusterError, parse_sim_cluster
from shoal.sim.engine import Failure, SimResult, Simulator, simulate
from shoal.sim.report import PolicyReport, build_report
from shoal.sim.trace import TraceError, TraceJob, read_trace

__all__ = [
    "Failure",
    "PolicyReport",
    "SimCluster",
    "SimClusterError",
    "SimResult",
    "Simulator",
    "TraceError",
    "TraceJob",
    "build_report",
    "parse_sim_cluster",
    "read_trace",
    "simulate",
]
