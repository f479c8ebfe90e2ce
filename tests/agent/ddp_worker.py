# A real PyTorch DDP worker (gloo, CPU) for the agent's tests: init_process_group from the
# environment elasticrun gives (TORCHELASTIC_USE_AGENT_STORE=True: a client of the store the
# agent hosts), an all_reduce whose sum is checked, a few DDP steps whose weights must agree
# across ranks. With DDP_FAIL_RANK=r, rank r fails on purpose during attempt 0.
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def say(fd, text):
    os.write(fd, (text + "\n").encode())  # one write(2) per line: the workers share the console


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    expected = world * (world + 1) / 2

    fail_rank = os.environ.get("DDP_FAIL_RANK")
    if fail_rank is not None and attempt == 0 and rank == int(fail_rank):
        say(2, f"rank {rank} fails on purpose in attempt {attempt}")
        sys.stderr.flush()
        os._exit(3)

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.ones(2, 4) * (rank + 1)).sum().backward()
        optimizer.step()
    weight = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(weight) for _ in range(world)]
    dist.all_gather(gathered, weight)
    same = all(torch.equal(gathered[0], w) for w in gathered)

    dist.barrier()
    say(1, f"ddp rank={rank} world={world} attempt={attempt} sum={total.item():g} "
           f"expected={expected:g} same={same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
