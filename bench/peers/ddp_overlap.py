"""PyTorch peer of bench/mn_overlap.cc: torchvision's ResNet-18 trained data-parallel over --np
processes (gloo) on this machine's CPUs, one thread each, momentum SGD. Times, in rounds of one
step each, the step without communication, the step with one allreduce of all gradients after
backward, the step under DistributedDataParallel (gradients overlapped in buckets of
--bucket-mb MB during backward), and that allreduce alone; each step's time is the slowest
rank's, and each figure the median over the rounds; the communication a step shows is taken
against the step without communication of the same round. Prints RESULT lines."""
import argparse
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

from gloo_workers import leave, run_workers


def run(rank, args, port, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.np, timeout=datetime.timedelta(seconds=300))
    models = []
    for _ in range(3):
        torch.manual_seed(0)
        models.append(torchvision.models.resnet18())
    local, off, on = models
    on = torch.nn.parallel.DistributedDataParallel(on, bucket_cap_mb=args.bucket_mb)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (local, off, on)]
    torch.manual_seed(100 + rank)
    x = torch.rand(args.batch, 3, args.size, args.size)
    t = (torch.arange(args.batch) * 37 + rank) % 1000
    size = float(args.np)

    def step(model, opt, allreduce_after):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), t).backward()
        if allreduce_after:
            grads = [p.grad for p in model.parameters()]
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat /= size
            for g, r in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                g.copy_(r)
        opt.step()

    def allreduce_alone():
        flat = torch._utils._flatten_dense_tensors([p.grad for p in off.parameters()])
        dist.all_reduce(flat)

    def timed(f):
        dist.barrier()
        a = time.perf_counter()
        f()
        took = torch.tensor([time.perf_counter() - a])
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return took.item()

    rows = {"off_ms": [], "on_ms": [], "local_ms": [], "allreduce_ms": []}
    for r in range(args.warmup + args.steps):
        got = {
            "off_ms": timed(lambda: step(off, opts[1], True)),
            "on_ms": timed(lambda: step(on, opts[2], False)),
            "local_ms": timed(lambda: step(local, opts[0], False)),
            "allreduce_ms": timed(allreduce_alone),
        }
        if r >= args.warmup:
            for k, v in got.items():
                rows[k].append(v * 1e3)
    if rank == 0:
        result = {k: statistics.median(v) for k, v in rows.items()}
        # What a step shows over the step without communication of the same round.
        result["shown_off_ms"] = statistics.median(a - b for a, b in zip(rows["off_ms"], rows["local_ms"]))
        result["shown_on_ms"] = statistics.median(a - b for a, b in zip(rows["on_ms"], rows["local_ms"]))
        queue.put(result)
    leave(queue)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=25)
    args = p.parse_args()
    result = run_workers(run, args, args.np)
    for key, value in result.items():
        print("RESULT", key, value)


if __name__ == "__main__":
    main()
