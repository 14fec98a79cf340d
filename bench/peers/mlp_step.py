"""PyTorch peer of bench/mlp_step.cc: MLP 784-1000-1000-10 forward + backward at batch 100."""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1000), torch.nn.ReLU(),
        torch.nn.Linear(1000, 1000), torch.nn.ReLU(),
        torch.nn.Linear(1000, 10))
    x = torch.rand(100, 784)
    t = torch.arange(100) % 10

    def step():
        for q in model.parameters():
            q.grad = None
        loss = F.cross_entropy(model(x), t)
        loss.backward()

    for _ in range(3):
        step()
    times = []
    for _ in range(args.repeats):
        a = time.perf_counter()
        step()
        times.append(time.perf_counter() - a)
    times.sort()
    print("RESULT ms_per_step", times[len(times) // 2] * 1e3)


if __name__ == "__main__":
    main()
