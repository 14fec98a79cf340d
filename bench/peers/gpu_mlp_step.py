"""PyTorch peer of bench/gpu_mlp_step.cc: the same training step on one GPU, eager; with forward
and backward captured in a CUDA graph (torch.cuda.graph) and Adam run eagerly after each
replay; and, when --compile is given and it works, with torch.compile (default mode and
"reduce-overhead"). With --dtype float16, the mixed-precision step eagerly: autocast(float16)
and GradScaler (float32 parameters, float16 computation, dynamic loss scaling)."""
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


def make(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 1000),
                                torch.nn.ReLU(), torch.nn.Linear(1000, 10)).to(dev)
    return model, torch.optim.Adam(model.parameters())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    args = p.parse_args()
    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    x = torch.rand(100, 784, device=dev)
    t = (torch.arange(100, device=dev) % 10)

    if args.dtype == "float16":
        model, opt = make(dev)
        scaler = torch.amp.GradScaler("cuda")

        def amp_step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(x), t)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

        print("RESULT eager_ms", bench(amp_step, args.steps))
        return

    model, opt = make(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), t).backward()
        opt.step()

    print("RESULT eager_ms", bench(step, args.steps))

    # Forward and backward in a CUDA graph (warm-up on a side stream, as torch.cuda.graph asks);
    # the gradients are static tensors of the graph, so they are not zeroed between steps.
    model, opt = make(dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), t).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.cross_entropy(model(x), t).backward()

    def graph_step():
        graph.replay()
        opt.step()

    print("RESULT graph_ms", bench(graph_step, args.steps))

    if args.compile:
        for mode, key in ((None, "compiled_ms"), ("reduce-overhead", "compiled_ro_ms")):
            try:
                model, opt = make(dev)
                cmodel = torch.compile(model, mode=mode)

                def cstep():
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(cmodel(x), t).backward()
                    opt.step()

                print("RESULT", key, bench(cstep, args.steps))
            except Exception as e:  # noqa: BLE001 - report and go on
                print("torch.compile", mode, "failed:", e)


if __name__ == "__main__":
    main()
