"""PyTorch peer of bench/gpu_mlp_step.cc: the same training step on one GPU, eager and (when
--compile is given and it works) with torch.compile."""
import argparse
import time

import torch
import torch.nn.functional as F


def bench(step, steps):
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    dev = torch.device("cuda", args.device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1000),
                                torch.nn.ReLU(), torch.nn.Linear(1000, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters())
    x = torch.rand(100, 784, device=dev)
    t = (torch.arange(100, device=dev) % 10)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), t).backward()
        opt.step()

    print("RESULT eager_ms", bench(step, args.steps))
    if args.compile:
        try:
            cmodel = torch.compile(model)

            def cstep():
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(cmodel(x), t).backward()
                opt.step()

            print("RESULT compiled_ms", bench(cstep, args.steps))
        except Exception as e:  # noqa: BLE001 - report and go on
            print("torch.compile failed:", e)


if __name__ == "__main__":
    main()
