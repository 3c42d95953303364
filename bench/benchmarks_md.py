"""BENCHMARKS.md: each benchmark script owns one ``## `` section and replaces only that one."""

from __future__ import annotations

from pathlib import Path

PATH = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
HEADER = "# Benchmarks\n\nFigures written by the scripts in bench/.\n"


def write_section(section: str, text: str, path: Path = PATH) -> None:
    """Replace (or append) the section headed ``section``; keep every other section as it is."""
    old = path.read_text(encoding="utf-8") if path.exists() else HEADER
    lines = old.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == section), None)
    if start is None:
        new = old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        rest = [""] + lines[end:] if end < len(lines) else []
        new = "\n".join(lines[:start] + text.rstrip("\n").splitlines() + rest) + "\n"
    path.write_text(new, encoding="utf-8")


def publish(section: str, lines: list[str], write: bool) -> None:
    """Print a benchmark's section, and write it into BENCHMARKS.md when ``write``."""
    text = "\n".join(lines) + "\n"
    print(text)
    if write:
        write_section(section, text)
