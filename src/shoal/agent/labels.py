"""Node labels as NVIDIA's GPU Feature Discovery writes them, Slurm's Gres string, GPU types.

The label set follows GFD's defaults (mig-strategy none, no sharing). Left out: the
``gfd.timestamp`` label (it would change the node on every restart), ``gpu.machine``
(the DMI product name is a host fact, not an NVML one), ``gpu.mode`` (it needs the PCI
class code, which NVML does not give) and ``mig.strategy`` (GFD sets it only when a
strategy other than ``none`` is configured).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

from shoal.model.gpu import gpu_gres, gpu_type, gpu_type_matches  # noqa: F401  (re-exported)
from shoal.model.resources import GPU

_PREFIX = "nvidia.com/"

# GFD's getArchFamily, by CUDA compute capability.
_FAMILY_BY_MAJOR = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal",
                    9: "hopper", 10: "blackwell", 12: "blackwell"}

# Used only when NVML gave no compute capability (a fake GPU described by hand).
_FAMILY_BY_TYPE = {
    "h100": "hopper", "h200": "hopper", "h800": "hopper", "h20": "hopper", "gh200": "hopper",
    "a100": "ampere", "a800": "ampere", "a30": "ampere", "a40": "ampere", "a10": "ampere",
    "a10g": "ampere", "a16": "ampere", "a2": "ampere",
    "l40s": "ada-lovelace", "l40": "ada-lovelace", "l4": "ada-lovelace",
    "l20": "ada-lovelace",
    "t4": "turing", "v100": "volta", "p100": "pascal",
    "b100": "blackwell", "b200": "blackwell", "gb200": "blackwell", "b300": "blackwell",
}

# Words in NVML product names that name the vendor or brand, not the GPU.


class LabelError(ValueError):
    """A node label that Kubernetes would reject; the message names it."""


def arch_family(compute_capability: tuple[int, int]) -> str:
    """GFD's ``gpu.family`` for a compute capability ("undefined" when unknown)."""
    major, minor = compute_capability
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return _FAMILY_BY_MAJOR.get(major, "undefined")


def sanitise_product(product: str) -> str:
    """GFD's product label value: drop characters outside [A-Za-z0-9-_. ], join words by '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", product).split())


def gpu_labels(gpus: tuple[GPU, ...], driver_version: str | None, cuda_version: int | None,
               *, compute_capability: tuple[int, int] | None = None) -> dict[str, str]:
    """The labels GFD would put on a node with these GPUs; empty for a node without GPUs.

    The product, count and memory describe the node's most common product (GFD warns
    and picks one when a node mixes models). ``compute_capability`` is that product's;
    when None or (0, 0) the compute labels are left out, as GFD does, and the family is
    inferred from the product name.
    """
    if not gpus:
        return {}
    counts = Counter(g.product for g in gpus)
    product = max(counts, key=lambda p: counts[p])  # ties: the first in index order
    first = next(g for g in gpus if g.product == product)

    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": sanitise_product(product),
        "nvidia.com/gpu.count": str(counts[product]),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": _bool(any(g.mig_capable for g in gpus)),
        "nvidia.com/mps.capable": "false",
    }
    if first.memory_mb:
        labels["nvidia.com/gpu.memory"] = str(first.memory_mb)
    if compute_capability and compute_capability[0]:
        labels["nvidia.com/gpu.family"] = arch_family(compute_capability)
        labels["nvidia.com/gpu.compute.major"] = str(compute_capability[0])
        labels["nvidia.com/gpu.compute.minor"] = str(compute_capability[1])
    else:
        family = _FAMILY_BY_TYPE.get(gpu_type(product))
        if family:
            labels["nvidia.com/gpu.family"] = family
    if driver_version is not None:
        labels.update(_driver_labels(driver_version))
    if cuda_version is not None:
        major, minor = cuda_version // 1000, cuda_version % 1000 // 10
        labels.update({
            "nvidia.com/cuda.runtime.major": str(major),
            "nvidia.com/cuda.runtime.minor": str(minor),
            "nvidia.com/cuda.runtime-version.major": str(major),
            "nvidia.com/cuda.runtime-version.minor": str(minor),
            "nvidia.com/cuda.runtime-version.full": f"{major}.{minor}",
        })
    return labels


def _driver_labels(driver_version: str) -> dict[str, str]:
    parts = driver_version.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise LabelError(f"driver version {driver_version!r} does not match X.Y[.Z]")
    major, minor = parts[0], parts[1]
    rev = parts[2] if len(parts) == 3 else ""
    return {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": driver_version,
    }


def _bool(value: bool) -> str:
    return "true" if value else "false"


# --------------------------------------------------------------------------- validation

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def validate_label(key: object, value: object) -> None:
    """Kubernetes' rules for a label: raise LabelError naming the label if it breaks one."""
    if not isinstance(key, str):
        raise LabelError(f"label key {key!r} must be a string")
    if not isinstance(value, str):
        raise LabelError(f"label {key}: value {value!r} must be a string (quote it in YAML)")
    prefix, slash, name = key.rpartition("/")
    if slash:
        if "/" in prefix:
            raise LabelError(f"label key {key!r}: at most one '/' is allowed")
        if not prefix:
            raise LabelError(f"label key {key!r}: the prefix before '/' must not be empty")
        if len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
            raise LabelError(f"label key {key!r}: prefix {prefix!r} must be a DNS subdomain "
                             "(lower-case letters, digits, '-' and '.', at most 253 characters)")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        raise LabelError(f"label key {key!r}: name {name!r} must be 1-63 characters of "
                         "letters, digits, '-', '_' and '.', starting and ending with a "
                         "letter or digit")
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise LabelError(f"label {key}: value {value!r} must be empty or 1-63 characters of "
                         "letters, digits, '-', '_' and '.', starting and ending with a "
                         "letter or digit")


def merge_labels(discovered: Mapping[str, str], user_labels: Mapping[str, str]) -> dict[str, str]:
    """Discovered labels overlaid with the agent config's labels, which win. All validated."""
    merged = {**discovered, **user_labels}
    for key, value in merged.items():
        validate_label(key, value)
    return merged
