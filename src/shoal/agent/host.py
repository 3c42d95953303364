"""What the node agent reports about its host besides GPUs: CPUs, memory, kernel, boot time."""

from __future__ import annotations

import platform
import socket
from dataclasses import dataclass

_MiB = 1024 * 1024


@dataclass(frozen=True)
class HostFacts:
    """The host as the agent registers it."""

    cpus: int  # logical CPUs (slurm.conf's CPUs=)
    memory_mb: int  # MiB (slurm.conf's RealMemory=)
    boot_time: float  # seconds since the epoch; a change means the node rebooted
    kernel: str  # uname -r
    hostname: str  # short name, as slurmd's default NodeName (hostname -s)


def discover_host(cpus: int | None = None, memory_mb: int | None = None) -> HostFacts:
    """Read the host through psutil; ``cpus`` and ``memory_mb`` from the config win.

    As with Slurm's CPUs= and RealMemory=, an override is taken as given: an administrator
    may hold back memory for the OS, or describe a node before it is fully up.
    """
    import psutil

    for name, value in (("cpus", cpus), ("memory_mb", memory_mb)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} override must be a positive integer, got {value!r}")
    return HostFacts(
        cpus=cpus if cpus is not None else (psutil.cpu_count(logical=True) or 1),
        memory_mb=memory_mb if memory_mb is not None else psutil.virtual_memory().total // _MiB,
        boot_time=psutil.boot_time(),
        kernel=platform.release(),
        hostname=socket.gethostname().split(".")[0],
    )
