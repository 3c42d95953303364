"""Shoal in two minutes: an unchanged 8-node Slurm training script on a cluster on this machine.

Starts a local cluster (8 nodes x 8 fake A100s) with its own state under .demo/, shows
sinfo, submits examples/llama-70b-pretrain.sbatch as a user would (sbatch, from
examples/), follows it in squeue, shows its output and its sacct record, and stops the
cluster again, also on Ctrl-C or an error. Your own cluster and client config, if any,
are left alone. Standard library only; everything else is the shoal commands.

    python examples/demo.py        (or: make demo)
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
SCRIPT = "llama-70b-pretrain.sbatch"
DEMO = EXAMPLES.parent / ".demo"
NODES, GPUS = 8, 8
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict[str, str]:
    """The demo cluster's own state and client config; examples/bin (the torchrun stand-in) first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_")) and k not in ("SHOAL_SERVER", "SHOAL_TOKEN",
                                                                                 "SHOAL_JOB_TOKEN")}
    env["SHOAL_STATE_DIR"] = str(DEMO / "state")
    env["SHOAL_CONFIG"] = str(DEMO / "client.yaml")
    bins = [str(EXAMPLES / "bin"), os.path.dirname(sys.executable)]
    env["PATH"] = os.pathsep.join(bins + [env.get("PATH", "")])
    return env


class Demo:
    def __init__(self) -> None:
        self.env = environment()
        self.t0 = time.monotonic()
        self.started = False

    # ------------------------------------------------------------------ output

    def section(self, title: str) -> None:
        print(f"\n\033[1m== {title}\033[0m" if sys.stdout.isatty() else f"\n== {title}", flush=True)

    def say(self, text: str = "") -> None:
        print(text, flush=True)

    def show(self, text: str, indent: str = "   ") -> None:
        for line in text.rstrip("\n").splitlines():
            print(f"{indent}{line}")
        sys.stdout.flush()

    def run(self, argv: list[str], *, cwd: Path | None = None, echo: bool = True,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run a shoal command; with echo, print it as typed and its output indented."""
        if echo:
            where = f"{cwd.relative_to(EXAMPLES.parent)}$ " if cwd else "$ "
            self.say(f" {where}{shlex.join(argv)}")
        out = subprocess.run(argv, env=self.env, cwd=cwd or EXAMPLES.parent, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=120)
        if echo:
            self.show(out.stdout + out.stderr)
        if check and out.returncode != 0:
            raise DemoError(f"{argv[0]} exited with {out.returncode}" + ("" if echo else f":\n{out.stderr}"))
        return out

    # ------------------------------------------------------------------ the story

    def up(self) -> None:
        self.section(f"1. Start a local cluster: {NODES} nodes x {GPUS} GPUs, on this machine")
        self.say(f"   (its state and client config live in {DEMO}, so your own cluster is not touched)")
        DEMO.mkdir(exist_ok=True)
        (DEMO / ".gitignore").write_text("*\n")
        argv = ["shoal", "up", "--nodes", str(NODES), "--gpus-per-node", str(GPUS), "--cpus-per-node", "128",
                "--memory-per-node", "2T", "--port", str(free_port()), "--agent-port", str(free_port()),
                "--address-base", "127.0.100.2"]
        out = self.run(argv, check=False)
        if out.returncode != 0:
            if "already running" in out.stderr:
                raise DemoError("a demo cluster is already running (another demo?). Stop it with:\n"
                                f"   SHOAL_STATE_DIR={DEMO / 'state'} shoal down", stop=False)
            raise DemoError("shoal up failed (see above)")
        self.started = True

    def sinfo(self) -> None:
        self.section("2. The nodes, as Slurm users see them")
        self.run(["sinfo"])
        self.run(["sinfo", "-N", "-o", "%N %P %c %m %G %t"])

    def submit(self) -> int:
        self.section("3. Submit a team's existing 8-node Llama-70B pre-training script, unchanged")
        self.show((EXAMPLES / SCRIPT).read_text())
        self.say("   (torchrun here is examples/bin/torchrun, a stand-in that plays one worker per srun task:\n"
                 "    64 real launchers x 8 workers would not fit a laptop. See examples/README.md.)\n")
        out = self.run(["sbatch", SCRIPT], cwd=EXAMPLES)
        m = re.search(r"Submitted batch job (\d+)", out.stdout)
        if not m:
            raise DemoError(f"could not read the job id from sbatch's output: {out.stdout!r}")
        return int(m.group(1))

    def follow(self, job_id: int) -> str:
        self.section(f"4. Follow job {job_id} in squeue")
        t0 = time.monotonic()
        header, last, state = None, None, "PENDING"
        while time.monotonic() - t0 < 300:
            out = self.run(["squeue", "-j", str(job_id)], echo=False, check=False)
            lines = [line for line in out.stdout.splitlines() if line.strip()]
            rows = [line for line in lines[1:] if line.split()[0] == str(job_id)]
            if header is None and lines:
                header = lines[0]
                self.say(f"   {'':8}{header}")
            if not rows:
                break
            st = rows[0].split()[4] if len(rows[0].split()) > 4 else "?"
            if st != last:
                self.say(f"   {time.monotonic() - t0:5.1f}s  {rows[0]}")
                last = st
            time.sleep(0.2)
        state = self.job_state(job_id)
        self.say(f"   {time.monotonic() - t0:5.1f}s  job {job_id} left the queue: {state}")
        return state

    def job_state(self, job_id: int) -> str:
        for _ in range(50):
            out = self.run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State"], echo=False, check=False)
            state = out.stdout.strip().split()[0] if out.stdout.strip() else ""
            if state in ENDED:
                return state
            time.sleep(0.1)
        return state or "UNKNOWN"

    def output(self, job_id: int) -> None:
        path = EXAMPLES / f"slurm-{job_id}.out"
        self.section("5. The job's output")
        self.say(f"   {path}")
        try:
            text = path.read_text()
        except OSError as e:
            self.say(f"   (cannot read it: {e})")
            return
        lines = text.splitlines()
        tasks = sorted((line for line in lines if line.startswith("rank=")),
                       key=lambda line: int(line.split()[0].split("=")[1]))
        ok = [line for line in tasks if line.endswith(" ok")]
        module = [line for line in lines if "module: command not found" in line]
        warned = [line for line in lines if line.startswith("torchrun (stand-in): warning")]
        if module:
            self.say("   The script's `module load` fails (no environment modules here) and the job carries on:")
            self.show(module[0], "     ")
        self.say(f"   {len(ok)} of 64 tasks checked their ranks, GPUs and master address and printed ok, e.g.:")
        for line in tasks[:3] + ["..."] + tasks[-2:]:
            self.show(line, "     ")
        self.show("\n".join(line for line in lines if line.startswith("rank 0:")), "     ")
        bad = [line for line in tasks if not line.endswith(" ok")]
        if bad:
            self.say(f"   {len(bad)} tasks found a problem, e.g.:")
            self.show(bad[0], "     ")
        if warned:
            self.say(f"   Note: {len(warned)} nodes warn that torchrun got --node_rank=0: the batch shell expands\n"
                     "   $SLURM_NODEID once, on the first node, in Slurm as here. Real torchrun would fail;\n"
                     "   examples/README.md shows the one-line fix.")

    def accounting(self, job_id: int) -> None:
        self.section("6. Accounting")
        self.run(["sacct", "-j", str(job_id)])

    def down(self) -> None:
        if not self.started:
            return
        self.started = False
        self.section("7. Stop the cluster")
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave nodes running
        try:
            self.run(["shoal", "down"], check=False)
        finally:
            signal.signal(signal.SIGINT, old)

    def main(self) -> int:
        if shutil.which("shoal", path=self.env["PATH"]) is None:
            print("demo: the shoal commands are not on PATH; install Shoal first: pip install -e .", file=sys.stderr)
            return 2
        try:
            self.up()
            self.sinfo()
            job_id = self.submit()
            state = self.follow(job_id)
            self.output(job_id)
            self.accounting(job_id)
            ok = state == "COMPLETED"
        except KeyboardInterrupt:
            print("\ndemo: interrupted", file=sys.stderr)
            ok = False
        except (DemoError, subprocess.TimeoutExpired) as e:
            print(f"\ndemo: {e}", file=sys.stderr)
            if isinstance(e, DemoError) and not e.stop:
                return 1
            ok = False
        finally:
            self.down()
        took = time.monotonic() - self.t0
        self.say(f"\nDone in {took:.0f}s." if ok else f"\nThe demo did not finish as it should ({took:.0f}s).")
        if ok:
            self.say("Next: your own scripts on your own cluster: shoal up; sbatch job.sh; squeue; shoal down")
        return 0 if ok else 1


class DemoError(Exception):
    """Something a newcomer can act on; stop=False when the cluster is not ours to stop."""

    def __init__(self, message: str, stop: bool = True) -> None:
        super().__init__(message)
        self.stop = stop


if __name__ == "__main__":
    sys.exit(Demo().main())
