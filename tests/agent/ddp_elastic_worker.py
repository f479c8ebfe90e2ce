# A real PyTorch DDP (gloo, CPU, float64) training that survives membership changes the way the
# torchrun docs recommend: rank 0 checkpoints (step, model, optimizer) atomically after every
# step, and every start resumes from the checkpoint, whatever the world size now is.
#
# The result of a step does not depend on the world size: the global batch of a step is fixed
# (BATCH rows of a fixed synthetic dataset), rank r takes rows r, r+W, r+2W, ... of it, its loss
# is the sum of its rows' squared errors divided by BATCH, and a DDP communication hook sums the
# gradients (instead of DDP's default mean). The summed gradient is the full batch's, so the
# final parameters must equal a plain one-process run (reference()) up to float64 rounding.
#
# Usage: ddp_elastic_worker.py --checkpoint PATH --phases 5,10,15
# The phases are the steps where a world stops training: a start at step S trains up to the
# first phase end > S. At a phase end that is not the last, every rank prints an `idle` line
# and waits for a signal (the agents SIGTERM it when the membership changes; SIGTERM keeps its
# default action, so the worker ends at once, and the checkpoint is whole thanks to
# os.replace). At the last phase end the job finishes, rank 0 compares with reference() and
# every rank exits 0. Lines (one write(2) each, the test reads them):
#   ddp-elastic start rank=R world=W step=S restart_count=C pid=P
#   ddp-elastic idle rank=R world=W step=S
#   ddp-elastic final weight=[...] bias=[...]            (rank 0)
#   ddp-elastic final match=True maxdiff=D near=False    (rank 0; near: steps-1 or steps+1 match)
#   ddp-elastic done rank=R world=W steps=N same=True    (every rank; same: weights agree)
import argparse
import datetime
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 4
ROWS = 64      # the dataset
BATCH = 16     # the global batch of every step, whatever the world size
LR = 0.05


def say(text):
    os.write(1, (text + "\n").encode())  # one write(2) per line: the workers share the console


def dataset():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(ROWS, FEATURES, generator=g, dtype=torch.float64)
    true_w = torch.tensor([[1.5, -2.0, 0.5, 3.0]], dtype=torch.float64)
    y = x @ true_w.T + 0.7 + 0.1 * torch.randn(ROWS, 1, generator=g, dtype=torch.float64)
    return x, y


def batch_rows(step):
    # Each step its own window of the dataset: a resume from a wrong step would show.
    return [(step * BATCH + i) % ROWS for i in range(BATCH)]


def fresh_model():
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 1).double()


def train_step(model, optimizer, x, y, rows):
    optimizer.zero_grad()
    loss = ((model(x[rows]) - y[rows]) ** 2).sum() / BATCH
    loss.backward()
    optimizer.step()


def reference(steps):
    """The same training in one process on the whole global batch, without DDP."""
    x, y = dataset()
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        train_step(model, optimizer, x, y, batch_rows(step))
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def sum_hook(state, bucket):
    # DDP's default hook averages over the world; summing keeps a step independent of it.
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def save_checkpoint(path, step, model, optimizer):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic: a reader (or a kill) sees the old or the new one, whole


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--phases", required=True, help="comma-separated phase end steps, increasing")
    args = parser.parse_args()
    phases = [int(p) for p in args.phases.split(",")]

    # A hung collective fails loudly instead of waiting for gloo's 30 minutes.
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    rank = dist.get_rank()
    world = dist.get_world_size()

    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    step = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        step = state["step"]
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    # Every rank has read the checkpoint before rank 0 may write the next one.
    dist.barrier()
    say(f"ddp-elastic start rank={rank} world={world} step={step} "
        f"restart_count={os.environ.get('TORCHELASTIC_RESTART_COUNT', 'unset')} pid={os.getpid()}")

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, sum_hook)
    x, y = dataset()
    target = next((p for p in phases if p > step), phases[-1])
    while step < target:
        rows = batch_rows(step)[rank::world]
        train_step(ddp, optimizer, x, y, rows)
        step += 1
        if rank == 0:
            save_checkpoint(args.checkpoint, step, model, optimizer)

    # Every rank past this barrier knows the checkpoint of `step` is on disk.
    dist.barrier()
    if target != phases[-1]:
        say(f"ddp-elastic idle rank={rank} world={world} step={step}")
        while True:
            signal.pause()  # until the agent's SIGTERM (default action: end at once)

    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(params) for _ in range(world)]
    dist.all_gather(gathered, params)
    same = all(torch.equal(gathered[0], p) for p in gathered)
    if rank == 0:
        expected = reference(step)
        maxdiff = (params - expected).abs().max().item()
        match = maxdiff <= 1e-12
        near = any(torch.allclose(params, reference(s), rtol=0, atol=1e-12) for s in (step - 1, step + 1))
        say(f"ddp-elastic final weight={model.weight.detach().flatten().tolist()} "
            f"bias={model.bias.detach().tolist()}")
        say(f"ddp-elastic final match={match} maxdiff={maxdiff:.3g} near={near}")
    dist.barrier()
    say(f"ddp-elastic done rank={rank} world={world} steps={step} same={same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
