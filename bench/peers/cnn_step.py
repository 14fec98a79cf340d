"""PyTorch peer of bench/cnn_step.cc: the small CNN, one MomentumSGD training step at batch 100."""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--channels-last", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.BatchNorm2d(32, eps=2e-5, momentum=0.1),
        torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64, eps=2e-5, momentum=0.1),
        torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 10))
    x = torch.rand(100, 1, 28, 28)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    t = torch.arange(100) % 10
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()

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
