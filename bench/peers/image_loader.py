"""PyTorch peer of bench_image_loader.

Decode mode: DataLoader over torchvision's ImageFolder with the ImageNet training transforms
(PIL), the same files and worker count; prints images per second over `--batches` batches after
the first, and per CPU-second (the CPU time of this process and of the loader's worker
processes over those batches, from /proc).

    python3 image_loader.py --dir image_loader_photos --workers 2 --batch 64 --batches 30

Training mode (--train): a torchvision ResNet training step (SGD with momentum 0.9, autocast for
bfloat16, channels-last on request) on one random batch kept on the device, the same step fed by
the DataLoader (pin_memory, non-blocking copies), and the DataLoader alone; prints images per
second of each.

    python3 image_loader.py --train --dir photos --device cuda --arch resnet50 --dtype bfloat16 \\
        --channels-last --batch 256 --workers 16 --steps 50 --warmup 10
"""
import argparse
import contextlib
import os
import time

import torch
import torchvision
from torchvision import transforms


def image_folder(directory, size):
    tf = transforms.Compose([
        transforms.RandomResizedCrop(size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    return torchvision.datasets.ImageFolder(directory, transform=tf)


def cpu_seconds(pids):
    """CPU time (user + system) of this process and of the processes `pids` so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = time.process_time()
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def decode(args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(image_folder(args.dir, 224), batch_size=args.batch,
                                         shuffle=True, num_workers=args.workers,
                                         persistent_workers=False)
    it = iter(loader)
    next(it)  # starts the workers
    pids = [w.pid for w in getattr(it, "_workers", [])]
    cpu = cpu_seconds(pids)
    start = time.perf_counter()
    images = 0
    for _ in range(args.batches):
        x, _ = next(it)
        images += x.shape[0]
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(pids) - cpu
    print(f"RESULT images_per_second {images / elapsed:.3f}")
    print(f"RESULT images_per_cpu_second {images / cpu:.3f}")


def train(args):
    torch.manual_seed(0)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    bf16 = args.dtype == "bfloat16"

    def autocast():
        if not bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def make_step():
        model = getattr(torchvision.models, args.arch)().to(device, memory_format=fmt)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(x, t):
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(model(x), t)
            loss.backward()
            opt.step()
        return step

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def rate(f):
        for _ in range(args.warmup):
            f()
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            f()
        sync()
        return args.steps * args.batch / (time.perf_counter() - start)

    def batches():
        loader = torch.utils.data.DataLoader(image_folder(args.dir, args.size),
                                             batch_size=args.batch, shuffle=True,
                                             num_workers=args.workers, pin_memory=cuda,
                                             drop_last=True, persistent_workers=True)
        while True:
            for x, t in loader:
                yield (x.to(device, non_blocking=True).contiguous(memory_format=fmt),
                       t.to(device, non_blocking=True))

    step = make_step()
    x = torch.empty(args.batch, 3, args.size, args.size, device=device).uniform_(-2, 2)
    x = x.contiguous(memory_format=fmt)
    t = (torch.arange(args.batch, device=device) * 37) % 1000
    print(f"RESULT random {rate(lambda: step(x, t)):.3f}")
    step = make_step()
    it = batches()
    print(f"RESULT loader {rate(lambda: step(*next(it))):.3f}")
    it = batches()
    print(f"RESULT loader_only {rate(lambda: next(it)):.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    if args.train:
        train(args)
    else:
        decode(args)


if __name__ == "__main__":
    main()
