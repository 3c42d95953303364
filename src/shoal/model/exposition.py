"""Prometheus text exposition, the few pieces Shoal's /metrics endpoints share (stdlib only)."""

from __future__ import annotations


def label_set(**labels: str) -> str:
    """``{k="v",...}`` with the values escaped as the text format requires."""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
