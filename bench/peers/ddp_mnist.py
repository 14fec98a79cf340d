"""PyTorch peer of bench/mn_mnist.cc: the MNIST MLP trained with DistributedDataParallel (gloo)
over --np processes on this machine (or plainly in one process with --np 1), 100 samples per
process per step, Adam. Prints samples/s and the time of an allreduce of all gradients."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gloo_workers import leave, run_workers


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(784, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1000),
                               torch.nn.ReLU(), torch.nn.Linear(1000, 10))


def run(rank, args, port, queue):
    torch.set_num_threads(args.threads)
    torch.manual_seed(rank)
    model = make_model()
    if args.np > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=args.np)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters())
    x = torch.rand(100, 784)
    t = torch.arange(100) % 10

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), t).backward()
        opt.step()

    for _ in range(5):
        step()
    if args.np > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.iterations):
        step()
    if args.np > 1:
        dist.barrier()
    elapsed = time.perf_counter() - start
    allreduce_ms = 0.0
    if args.np > 1:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        for _ in range(3):
            dist.all_reduce(flat)
        a = time.perf_counter()
        for _ in range(20):
            dist.all_reduce(flat)
        allreduce_ms = (time.perf_counter() - a) / 20 * 1e3
        dist.destroy_process_group()
    if rank == 0:
        queue.put((args.iterations * 100 * args.np / elapsed, allreduce_ms))
    if args.np > 1:
        leave(queue)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--iterations", type=int, default=200)
    args = p.parse_args()
    samples, allreduce_ms = run_workers(run, args, args.np, in_process=True)
    print("RESULT samples_per_sec", samples)
    print("RESULT allreduce_ms", allreduce_ms)


if __name__ == "__main__":
    main()
