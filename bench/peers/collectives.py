"""PyTorch peer of bench/mn_collectives.cc: the cost of one small collective with gloo over --np
processes on this machine: all_reduce of one float64, barrier, broadcast of 8 bytes. Prints the
median over 5 rounds of microseconds per call."""
import argparse
import os
import time

import torch
import torch.distributed as dist

from gloo_workers import leave, run_workers


def per_call_us(f, repeats):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        f()
    return (time.perf_counter() - start) / repeats * 1e6


def run(rank, args, port, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.np)
    value = torch.ones(1, dtype=torch.float64)
    eight = torch.ones(8, dtype=torch.uint8)
    ops = {
        "allreduce": lambda: dist.all_reduce(value),
        "barrier": dist.barrier,
        "bcast": lambda: dist.broadcast(eight, 0),
    }
    results = {}
    for name, f in ops.items():
        rounds = sorted(per_call_us(f, args.repeats) for _ in range(5))
        results[name] = rounds[2]
    if rank == 0:
        queue.put(results)
    leave(queue)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2000)
    args = p.parse_args()
    results = run_workers(run, args, args.np)
    for name, us in results.items():
        print("RESULT {}_us {}".format(name, us))


if __name__ == "__main__":
    main()
