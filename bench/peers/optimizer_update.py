"""PyTorch peer of bench/optimizer_update.cc: one torch.optim update over ResNet-50's parameter
shapes (161 float32 tensors, 25,557,032 elements, gradients set once), SGD with momentum and
Adam, with foreach=False (a loop over the parameters) and foreach=True (multi-tensor kernels),
and fused=True on a GPU when the installed PyTorch has it. Prints the median ms per update."""
import argparse
import time

import torch


def resnet50_shapes():
    shapes = []

    def conv_bn(out, inp, k):
        shapes.extend([(out, inp, k, k), (out,), (out,)])

    conv_bn(64, 3, 7)
    inp = 64
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width = 64 << stage
        for b in range(blocks):
            conv_bn(width, inp, 1)
            conv_bn(width, width, 3)
            conv_bn(width * 4, width, 1)
            if b == 0:
                conv_bn(width * 4, inp, 1)
            inp = width * 4
    shapes.extend([(1000, 2048), (1000,)])
    return shapes


def median_ms(step, repeats, sync):
    for _ in range(2):
        step()
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--gpu", type=int, default=-1)
    args = p.parse_args()
    dev = torch.device("cuda", args.gpu) if args.gpu >= 0 else torch.device("cpu")
    sync = torch.cuda.synchronize if args.gpu >= 0 else (lambda: None)
    torch.manual_seed(0)
    shapes = resnet50_shapes()
    assert len(shapes) == 161 and sum(torch.Size(s).numel() for s in shapes) == 25557032
    params = []
    for s in shapes:
        t = (torch.randn(s, device=dev) * 0.01).requires_grad_()
        t.grad = torch.randn(s, device=dev) * 0.01
        params.append(t)

    makers = {
        "momentum_sgd": lambda **kw: torch.optim.SGD(params, lr=0.01, momentum=0.9, **kw),
        "adam": lambda **kw: torch.optim.Adam(params, lr=0.001, **kw),
    }
    with torch.no_grad():
        for name, make in makers.items():
            for variant, kw in (("loop", {"foreach": False}), ("foreach", {"foreach": True})):
                opt = make(**kw)
                print("RESULT", name + "_" + variant + "_ms", median_ms(opt.step, args.repeats, sync))
            if args.gpu >= 0:
                try:
                    opt = make(fused=True)
                except (TypeError, RuntimeError, ValueError):
                    continue  # (no fused variant of this optimizer in this PyTorch)
                print("RESULT", name + "_fused_ms", median_ms(opt.step, args.repeats, sync))


if __name__ == "__main__":
    main()
