"""PyTorch peer of bench/mn_sharding.cc: the same stack of --layers Linear(--width, --width) layers
with ReLU between them, trained with Adam in float32 over --np processes (gloo) on this machine's
CPUs, one thread each: DistributedDataParallel with torch.optim.Adam (the state replicated, the
allreduce overlapped in buckets), then DistributedDataParallel with ZeroRedundancyOptimizer over
Adam (ZeRO stage 1: the state sharded), each in a phase of its own. A step's time is the slowest
rank's, the figure the median over --steps steps after --warmup. Memory is glibc's bytes in use
(mallinfo2: arenas + mmapped blocks) sampled after backward and after the step, less what was in
use before the phase; the highest rank's. Prints RESULT lines."""
import argparse
import ctypes
import datetime
import gc
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from gloo_workers import leave, run_workers


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def heap_in_use():
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


def make_model(width, layers):
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def run(rank, args, port, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.np, timeout=datetime.timedelta(seconds=900))
    torch.manual_seed(100 + rank)
    x = torch.rand(args.batch, args.width)
    t = torch.rand(args.batch, args.width)
    result = {}
    for key, sharded in (("ddp", False), ("zero", True)):
        gc.collect()
        dist.barrier()
        before = heap_in_use()
        model = torch.nn.parallel.DistributedDataParallel(make_model(args.width, args.layers))
        if sharded:
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        times, peak = [], 0
        for s in range(args.warmup + args.steps):
            dist.barrier()
            a = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), t).backward()
            after_backward = heap_in_use()
            opt.step()
            took = torch.tensor([time.perf_counter() - a])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if s >= args.warmup:
                times.append(took.item())
                peak = max(peak, after_backward - before, heap_in_use() - before)
        top = torch.tensor([float(peak)], dtype=torch.float64)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        result[key + "_ms"] = statistics.median(times) * 1e3
        result[key + "_peak_bytes"] = top.item()
        del model, opt
    if rank == 0:
        queue.put(result)
    leave(queue)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    args = p.parse_args()
    result = run_workers(run, args, args.np)
    for key, value in result.items():
        print("RESULT", key, value)


if __name__ == "__main__":
    main()
