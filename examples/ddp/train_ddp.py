"""A real two-node PyTorch DDP run on CPU (gloo): a tiny model, a few steps, all-reduced.

Every rank trains on its own data; DDP all-reduces the gradients, so every rank must end
with the same parameters. Each rank prints their checksum, and the ranks also compare
checksums among themselves (all_gather) and exit 1 if any differs.
"""

from __future__ import annotations

import os
import socket
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # a CPU-only env without numpy is fine
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

STEPS = 5


def main() -> int:
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torchrun (or srun + Pyxis)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights everywhere (DDP would broadcast rank 0's anyway)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                                        torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    for _step in range(STEPS):
        x = torch.randn(32, 8, generator=data)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # gradients are all-reduced across all ranks here
        opt.step()
    mine = sum(p.detach().double().sum() for p in model.parameters()).reshape(1)
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, mine)
    checksum, everyone = mine.item(), [t.item() for t in gathered]
    agree = len(set(everyone)) == 1
    node = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID"))  # torchrun's, else srun's
    line = (f"rank={rank} world={world} node={node} host={socket.gethostname()} "
            f"steps={STEPS} loss={loss.item():.4f} checksum={checksum:.10f} "
            f"{'ranks agree' if agree else 'MISMATCH: ' + ' '.join(f'{c:.10f}' for c in everyone)}\n")
    # One write per line: the node's two workers share one stdout, and print() may write
    # the text and its newline separately (PYTHONUNBUFFERED), interleaving their lines.
    sys.stdout.write(line)
    sys.stdout.flush()
    # Every rank reaches here before any tears gloo down: a rank that destroys its group while
    # a peer's last all_gather is still in flight can abort at exit in gloo's worker thread
    # ("terminate called without an active exception", exit 134). The model's reducer holds the
    # group too, so it goes first: else the group outlives destroy_process_group and is torn
    # down during the interpreter's own finalization.
    del model, opt
    dist.barrier()
    dist.destroy_process_group()
    return 0 if agree else 1


if __name__ == "__main__":
    code = main()
    # Out without the interpreter's finalization, where gloo's threads still aborted now and
    # then (134, in two CI runs of many) after every rank had printed: everything is written
    # and flushed, and there is nothing left to clean up but memory.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
