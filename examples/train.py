"""A CPU stand-in for a real pre-training script: it checks where it runs, then "trains".

Every worker checks that what Slurm (srun) and torchrun told it agree: its node rank is
the node srun put it on, its rank is its srun task's when each task is one worker, the
master address resolves to the job's first node, and the --config file exists. It prints
one line for itself (rank, local and node as srun numbers the task), ending in "ok" or
in what is wrong (and then exits 1). Rank 0 then fits one parameter with a few steps of
gradient descent, standing in for the model.

Standard library only, so it runs with any Python: `python train.py --config ...` by
hand, under examples/bin/torchrun, or under real torchrun.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys


def first_host(nodelist: str) -> str:
    """The first name of a Slurm hostlist: "node[01-08],gpu7" -> "node01"."""
    m = re.match(r"([^,\[]*)(?:\[([^\],-]+))?", nodelist)
    return (m.group(1) + (m.group(2) or "")) if m else nodelist


def read_section(path: str, section: str) -> dict[str, str]:
    """`key: value` lines under a top-level `section:` of a YAML file (enough for our config)."""
    out: dict[str, str] = {}
    inside = False
    with open(path) as f:
        for line in f:
            text = line.split("#", 1)[0].rstrip()
            if not text:
                continue
            if not text.startswith((" ", "\t")):
                inside = text == f"{section}:"
            elif inside and ":" in text:
                key, value = text.strip().split(":", 1)
                out[key.strip()] = value.strip()
    return out


def resolve(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        return f"<unresolvable: {e}>"


def check(env: dict[str, str], args) -> list[str]:
    """What disagrees between srun's, torchrun's and the job's view of this worker."""
    problems = []
    need = ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_NTASKS",
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    missing = [k for k in need if k not in env]
    if missing:
        return [f"not set: {' '.join(missing)} (run me with srun and torchrun)"]
    num = {k: int(env[k]) for k in need if k not in ("MASTER_ADDR",)}
    node_rank = int(env.get("GROUP_RANK", env["SLURM_NODEID"]))
    nnodes = int(env.get("GROUP_WORLD_SIZE", num["WORLD_SIZE"] // max(1, num["LOCAL_WORLD_SIZE"])))
    if node_rank != num["SLURM_NODEID"]:
        problems.append(f"node_rank={node_rank} but SLURM_NODEID={num['SLURM_NODEID']}")
    if nnodes != num["SLURM_NNODES"]:
        problems.append(f"nnodes={nnodes} but SLURM_NNODES={num['SLURM_NNODES']}")
    if num["SLURM_NTASKS"] == num["WORLD_SIZE"]:  # one srun task per worker: the ranks must be srun's
        if num["RANK"] != num["SLURM_PROCID"]:
            problems.append(f"RANK={num['RANK']} but SLURM_PROCID={num['SLURM_PROCID']}")
        if num["LOCAL_RANK"] != num["SLURM_LOCALID"]:
            problems.append(f"LOCAL_RANK={num['LOCAL_RANK']} but SLURM_LOCALID={num['SLURM_LOCALID']}")
    if not 0 <= num["RANK"] < num["WORLD_SIZE"]:
        problems.append(f"RANK={num['RANK']} is outside WORLD_SIZE={num['WORLD_SIZE']}")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        first = first_host(nodelist)
        want, got = resolve(first), resolve(env["MASTER_ADDR"])
        if got != want:
            problems.append(f"MASTER_ADDR={env['MASTER_ADDR']} resolves to {got}, "
                            f"not to the first node {first} ({want})")
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    if gpus and len(gpus) != 1 and num["LOCAL_RANK"] >= len(gpus):
        problems.append(f"LOCAL_RANK={num['LOCAL_RANK']} has no GPU among CUDA_VISIBLE_DEVICES={','.join(gpus)}")
    if not os.path.isfile(args.config):
        problems.append(f"config {args.config} not found in {os.getcwd()}")
    return problems


def train(steps: int, lr: float) -> list[float]:
    """Fit w in y = 3x by gradient descent on four points; the losses, one per step."""
    xs = [1.0, 2.0, 3.0, 4.0]
    w, losses = 0.0, []
    for _ in range(steps):
        loss = sum((w * x - 3 * x) ** 2 for x in xs) / len(xs)
        grad = sum(2 * (w * x - 3 * x) * x for x in xs) / len(xs)
        w -= lr * grad / 10
        losses.append(loss)
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run's YAML config")
    args = parser.parse_args()
    env = dict(os.environ)
    problems = check(env, args)
    host = socket.gethostname()
    gpus = env.get("CUDA_VISIBLE_DEVICES") or "none"
    # srun's view of this task; check() has made sure torchrun's RANK/LOCAL_RANK agree with it.
    where = (f"rank={env.get('SLURM_PROCID', '?')} local={env.get('SLURM_LOCALID', '?')} "
             f"node={env.get('SLURM_NODEID', '?')} "
             f"host={host} gpus={gpus} master={env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}")
    if problems:
        print(f"{where}  FAILED: {'; '.join(problems)}", flush=True)
        return 1
    print(f"{where}  ok", flush=True)
    if env["RANK"] == "0":
        conf = read_section(args.config, "train")
        steps, lr = int(conf.get("steps", 5)), float(conf.get("lr", 0.1))
        losses = train(steps, lr)
        print(f"rank 0: {len(losses)} steps on {env['WORLD_SIZE']} workers, loss {losses[0]:.3f} -> "
              f"{losses[-1]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
