"""Peer of bench/python_overhead.cc: the same chain of small ops (y = y * w + x, 8 elements)
called from Python, by kusari or by PyTorch, with autograd on (forward; forward + backward) and off
(no_backprop_mode / torch.no_grad). Prints RESULT lines in microseconds per op."""
import argparse
import time


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
    p.add_argument('--framework', choices=['kusari', 'torch'], required=True)
    p.add_argument('--device', default='cpu')
    p.add_argument('--chains', type=int, default=2000)
    args = p.parse_args()
    length = 100
    n = args.chains // 10
    if args.framework == 'torch':
        import torch
        torch.set_num_threads(1)
        dev = torch.device(args.device)
        x = torch.rand(8, device=dev, requires_grad=True)
        w = torch.rand(8, device=dev, requires_grad=True)
        no_grad = torch.no_grad
        sync = (lambda: torch.cuda.synchronize()) if dev.type == 'cuda' else (lambda: None)

        def backward(y):
            y.sum().backward()
    else:
        import numpy as np
        import kusari
        import kusari.functions as F
        kusari.set_num_threads(1)
        dev = kusari.Device(args.device)
        x = kusari.Variable(kusari.asarray(np.random.rand(8).astype(np.float32), device=dev))
        w = kusari.Variable(kusari.asarray(np.random.rand(8).astype(np.float32), device=dev))
        no_grad = kusari.no_backprop_mode
        sync = dev.synchronize

        def backward(y):
            F.sum(y).backward()

    def chain():
        y = x
        for _ in range(length // 2):
            y = y * w + x
        return y

    def fwd():
        for _ in range(n):
            chain()
        sync()

    def fwd_nograd():
        with no_grad():
            for _ in range(n):
                chain()
        sync()

    def fwd_bwd():
        for _ in range(n):
            backward(chain())
        sync()

    print('RESULT forward_us', median(fwd, 10) / (n * length) * 1e6)
    print('RESULT forward_nograd_us', median(fwd_nograd, 10) / (n * length) * 1e6)
    print('RESULT forward_backward_us', median(fwd_bwd, 10) / (n * length) * 1e6)


if __name__ == '__main__':
    main()
