"""PyTorch peer of bench/resnet50.cc: training steps (forward, backward, SGD with momentum 0.9)
of a torchvision ResNet on random data, for one row (float32 or bfloat16 autocast, NCHW or
channels-last) and one mode (eager, or torch.compile). One row and mode per process, so that the
peak memory (torch.cuda.max_memory_allocated, or ru_maxrss on a CPU) is that row's.

Without torchvision the same network is defined here (torchvision's layout: v1.5 bottlenecks,
same parameter count). Prints "RESULT key value" lines that the C++ side reads.
"""
import argparse
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import torchvision

    def make_resnet(arch):
        return getattr(torchvision.models, arch)()

    SOURCE = "torchvision"
except ImportError:
    SOURCE = "script"

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin, c, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.downsample = shortcut(cin, c, stride)

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            h = self.bn2(self.conv2(h))
            return F.relu(h + (self.downsample(x) if self.downsample is not None else x))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, c, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, c, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.conv3 = nn.Conv2d(c, 4 * c, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(4 * c)
            self.downsample = shortcut(cin, 4 * c, stride)

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            h = F.relu(self.bn2(self.conv2(h)))
            h = self.bn3(self.conv3(h))
            return F.relu(h + (self.downsample(x) if self.downsample is not None else x))

    def shortcut(cin, cout, stride):
        if stride == 1 and cin == cout:
            return None
        return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    class ResNet(nn.Module):
        def __init__(self, block, counts, num_classes=1000):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            cin, stages = 64, []
            for s, n in enumerate(counts):
                blocks = []
                for b in range(n):
                    blocks.append(block(cin, 64 << s, 2 if s > 0 and b == 0 else 1))
                    cin = (64 << s) * block.expansion
                stages.append(nn.Sequential(*blocks))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.fc = nn.Linear(cin, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def forward(self, x):
            h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
            h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
            return self.fc(h.mean((2, 3)))

    ARCHS = {"resnet18": (Basic, [2, 2, 2, 2]), "resnet34": (Basic, [3, 4, 6, 3]),
             "resnet50": (Bottleneck, [3, 4, 6, 3]), "resnet101": (Bottleneck, [3, 4, 23, 3]),
             "resnet152": (Bottleneck, [3, 8, 36, 3])}

    def make_resnet(arch):
        return ResNet(*ARCHS[arch])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--row", default="f32-nchw", choices=["f32-nchw", "f32-cl", "bf16-nchw", "bf16-cl"])
    p.add_argument("--mode", default="eager", choices=["eager", "compile"])
    p.add_argument("--tf32", default="default", choices=["default", "on", "off"])
    p.add_argument("--profile", action="store_true",
                   help="after the warm-up, one step between profiler start and stop, then end")
    p.add_argument("--memory-phases", action="store_true",
                   help="after the timed steps, the peak GPU memory of each phase of one more step")
    args = p.parse_args()

    cuda = args.device == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
        if args.tf32 != "default":  # PyTorch's defaults: cuDNN TF32 on, matmul TF32 off
            torch.backends.cudnn.allow_tf32 = args.tf32 == "on"
            torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    dev = torch.device("cuda" if cuda else "cpu")
    if args.mode == "compile" and not hasattr(torch, "compile"):
        print("RESULT compile_unavailable 1")
        print(f"torch {torch.__version__} has no torch.compile", file=sys.stderr)
        return
    fmt = torch.channels_last if args.row.endswith("-cl") else torch.contiguous_format
    bf16 = args.row.startswith("bf16")

    torch.manual_seed(0)
    model = make_resnet(args.arch).to(dev).to(memory_format=fmt)
    params = sum(q.numel() for q in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.rand(args.batch, 3, args.size, args.size, device=dev).to(memory_format=fmt)
    t = torch.randint(0, 1000, (args.batch,), device=dev)
    forward = torch.compile(model) if args.mode == "compile" else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(forward(x), t)
        loss.backward()
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if args.profile:
        torch.cuda.profiler.start()
        step()
        sync()
        torch.cuda.profiler.stop()
        return
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    ms = (time.perf_counter() - start) / args.steps * 1e3
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT ms", ms)
    print("RESULT peak_bytes", peak)
    if cuda and args.memory_phases:
        # The step above, phase by phase: each phase's peak and what is live after it.
        state = {}

        def phase(name, run):
            sync()
            torch.cuda.reset_peak_memory_stats()
            run()
            sync()
            print(f"RESULT mem_{name}_peak", torch.cuda.max_memory_allocated())
            print(f"RESULT mem_{name}_end", torch.cuda.memory_allocated())

        def forward_phase():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                state["loss"] = F.cross_entropy(forward(x), t)

        def backward_phase():
            state.pop("loss").backward()

        phase("forward", forward_phase)
        phase("backward", backward_phase)
        phase("update", opt.step)
    print("RESULT params", params)
    print("RESULT torchvision", 1 if SOURCE == "torchvision" else 0)


if __name__ == "__main__":
    main()
