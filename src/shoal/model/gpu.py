"""GPU types as Slurm users write them (gres "gpu:h100:8", --gpus=a100:4), from NVML product names.

Shared by the agent (sinfo's Gres), the server and the scheduler's placement, so one
rule decides what "h100" means everywhere.
"""

from __future__ import annotations

import re
from collections import Counter

from shoal.model.resources import GPU

_BRAND_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[\s\-_]+", text.lower()) if w]


def gpu_type(product: str) -> str:
    """The short GPU type Slurm users write: "NVIDIA H100 80GB HBM3" -> "h100".

    The first word of the product, past vendor and brand words, that has a digit in it,
    with any letter-only words before it joined by '_' ("NVIDIA RTX A6000" -> "rtx_a6000").
    """
    words = [w for w in _words(product) if w not in _BRAND_WORDS]
    for i, w in enumerate(words):
        if any(c.isdigit() for c in w):
            return "_".join(words[: i + 1])
    return "_".join(words) or "gpu"


def gpu_gres(gpus: tuple[GPU, ...]) -> str:
    """Slurm's Gres string, e.g. "gpu:h100:8"; types in GPU-index order; "" without GPUs.

    sinfo and scontrol print "(null)" for the empty string, as Slurm does.
    """
    counts = Counter(gpu_type(g.product) for g in sorted(gpus, key=lambda g: g.index))
    return ",".join(f"gpu:{t}:{n}" for t, n in counts.items())


def gpu_type_matches(product: str, requested: str) -> bool:
    """Whether ``--gres=gpu:TYPE`` / ``--gpus=TYPE:N`` asks for this product.

    Case-insensitive, on whole words in order: "h100", "h100-80gb" and "a100 80gb" match "NVIDIA H100 80GB HBM3"
    and "a100" matches "NVIDIA A100-SXM4-80GB", but "a10" matches neither an A100 nor an
    A10G. The full product, GFD's sanitised product and the Gres type match too.
    """
    want = _words(requested)
    if not want:
        return False
    if requested.strip().lower() == gpu_type(product):
        return True
    have = iter(_words(product))
    return all(any(w == h for h in have) for w in want)  # whole words, in order
