"""python -m my_device.demo --distributed: the demo model trained with DDP on 2 processes over mccl.

Each rank trains my_device.demo.SmallNet on its half of every batch with
DistributedDataParallel on its own mydev device (init_process_group() with no backend: mccl).
A single process then trains the same model on the full batches: its loss at a step is the mean
of the two halves' losses, each half forwarded on its own, since DDP without SyncBatchNorm keeps
BatchNorm statistics per rank. The ranks' mean loss and the single-process loss must be equal,
and so must the final parameters."""
import os
import socket
import subprocess
import sys
import tempfile

import torch
from torch import nn

WORLD = 2


def _rank_main(steps, batch, seed, out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import my_device  # noqa: F401
    from my_device.demo import SmallNet, _batches

    rank = int(os.environ["RANK"])
    torch.mydev.set_device(rank)
    dist.init_process_group()
    torch.manual_seed(seed)
    model = DDP(SmallNet().to("mydev"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _batches(steps, batch, seed + 1):
        xs, ys = x.chunk(WORLD)[rank].to("mydev"), y.chunk(WORLD)[rank].to("mydev")
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.save({"losses": torch.stack(losses).cpu(),
                "params": [p.detach().cpu() for p in model.module.parameters()]}, out)
    dist.destroy_process_group()


def _single_process(steps, batch, seed):
    from my_device.demo import SmallNet, _batches

    torch.manual_seed(seed)
    model = SmallNet().to("mydev")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in _batches(steps, batch, seed + 1):
        opt.zero_grad(set_to_none=True)
        halves = [nn.functional.cross_entropy(model(xh.to("mydev")), yh.to("mydev"))
                  for xh, yh in zip(x.chunk(WORLD), y.chunk(WORLD))]
        loss = sum(halves) / WORLD
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def main(steps=8, batch=32, seed=0):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"rank{r}.pt") for r in range(WORLD)]
        code = (f"from my_device.demo_distributed import _rank_main; "
                f"_rank_main({steps}, {batch}, {seed}, {{out!r}})")
        procs = [subprocess.Popen([sys.executable, "-c", code.format(out=outs[r])],
                                  env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
                 for r in range(WORLD)]
        codes = [p.wait() for p in procs]
        if any(codes):
            print(f"ranks exited with {codes}")
            return 1
        ranks = [torch.load(o) for o in outs]
    single_losses, single_params = _single_process(steps, batch, seed)

    print(f"Training SmallNet with DDP over mccl on {WORLD} processes (one mydev device each), AdamW, "
          f"{steps} steps, batch {batch} ({batch // WORLD} per rank), seed {seed}")
    print(f"{'step':>4}  {'rank 0 loss':>12}  {'rank 1 loss':>12}  {'ranks mean':>12}  {'1 process':>12}")
    worst = 0.0
    for i in range(steps):
        r = [float(ranks[k]["losses"][i]) for k in range(WORLD)]
        mean = sum(r) / WORLD
        worst = max(worst, abs(mean - single_losses[i]))
        print(f"{i:>4}  {r[0]:12.6f}  {r[1]:12.6f}  {mean:12.6f}  {single_losses[i]:12.6f}")
    param_diff = max(float((a - b).abs().max()) for k in range(WORLD)
                     for a, b in zip(ranks[k]["params"], single_params))
    same = worst <= 1e-4 and param_diff <= 1e-4
    print(f"loss curves {'EQUAL' if same else 'DIFFER'} (largest loss difference {worst:.2e}, "
          f"largest parameter difference {param_diff:.2e})")
    return 0 if same else 1
