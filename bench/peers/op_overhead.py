"""PyTorch peer of bench/op_overhead.cc: the same 8-element mul/add chains, eager mode."""
import argparse
import time

import torch


def median(f, repeats, warmup=3):
    for _ in range(warmup):
        f()
    t = []
    for _ in range(repeats):
        a = time.perf_counter()
        f()
        t.append(time.perf_counter() - a)
    t.sort()
    return t[len(t) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--chains", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(1)
    length = 100
    x = torch.rand(8, requires_grad=True)
    w = torch.rand(8, requires_grad=True)

    def chain():
        y = x
        for _ in range(length // 2):
            y = y * w + x
        return y

    n = args.chains // 10

    def fwd():
        for _ in range(n):
            chain()

    def fwd_bwd():
        for _ in range(n):
            chain().sum().backward()

    f = median(fwd, 10) / (n * length) * 1e6
    fb = median(fwd_bwd, 10) / (n * length) * 1e6
    print("RESULT forward_us", f)
    print("RESULT forward_backward_us", fb)
    print("RESULT torch_version_major", int(torch.__version__.split(".")[0]))


if __name__ == "__main__":
    main()
