"""Slurm's filename patterns for --output, --error and --input (``slurm-%A_%a.out``).

Mirrors slurmstepd's fname.c: ``%%`` is a percent sign; a number after ``%`` zero-pads a
numeric field (at most 10 wide) and is ignored for text fields; an unknown ``%c`` is kept
as written; any backslash turns substitution off and the backslashes are removed.
"""

from __future__ import annotations

NO_VAL = 4294967294
"""What Slurm puts for %a in a job that is not an array task (its NO_VAL marker)."""
MAX_WIDTH = 10


def expand_pattern(
    pattern: str,
    *,
    job_id: int,
    job_name: str,
    user: str,
    node: str,
    array_job_id: int | None = None,
    array_task_id: int | None = None,
    step_id: int | str | None = None,
    task_id: int | None = None,
    node_index: int | None = None,
) -> str:
    """Fill in a pattern's ``%`` fields for one job (and, where given, one step and task).

    ``%A`` is the array's job id, or the job id outside an array; ``%J`` is
    ``job.step`` once a step is given and the job id before. A missing ``step_id``
    prints as ``batch`` for ``%s``; a missing task or node index as 0 (the batch script
    is task 0 on node 0).
    """
    if "\\" in pattern:
        return pattern.replace("\\", "")
    numbers: dict[str, int] = {
        "j": job_id,
        "A": array_job_id if array_task_id is not None and array_job_id is not None else job_id,
        "a": array_task_id if array_task_id is not None else NO_VAL,
        "b": (array_task_id if array_task_id is not None else NO_VAL) % 10,
        "t": task_id or 0,
        "n": node_index or 0,
    }
    texts: dict[str, str] = {"u": user, "x": job_name, "N": node.split(".", 1)[0]}
    if isinstance(step_id, int):
        numbers["s"] = step_id
    else:
        texts["s"] = step_id or "batch"
    out: list[str] = []
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        j = i + 1
        if j < n and pattern[j] == "%":
            out.append("%")
            i = j + 1
            continue
        while j < n and pattern[j].isascii() and pattern[j].isdigit():
            j += 1
        digits = pattern[i + 1:j].lstrip("0") or "0"
        width = MAX_WIDTH if len(digits) > 2 else min(int(digits), MAX_WIDTH)
        field = pattern[j] if j < n else ""
        if field in numbers:
            out.append(str(numbers[field]).zfill(width))
        elif field == "J":
            jid = str(job_id).zfill(width)
            out.append(jid if step_id is None else f"{jid}.{step_id}")
        elif field in texts:
            out.append(texts[field])
        else:
            out.append(pattern[i:j + 1])
        i = j + 1
    return "".join(out)
