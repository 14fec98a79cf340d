"""Peer of bench/gpt2.cc: the same GPT (GPT-2's architecture: learnt positions, pre-norm blocks,
gelu's tanh form, the output layer tied to the token embedding) and the same AdamW step in
PyTorch, eager with F.scaled_dot_product_attention (a masked softmax where PyTorch lacks it) or
under torch.compile; bf16 by autocast over float32 weights. With --attention it times causal
attention alone (forward + backward). Prints RESULT lines."""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {'tiny': (6, 6, 384, 256), 'small': (12, 12, 768, 1024), 'medium': (24, 16, 1024, 1024)}


def attention(q, k, v):
    if hasattr(F, 'scaled_dot_product_attention'):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return s.masked_fill(~mask, float('-inf')).softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.attn_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = attention(q, k, v).transpose(1, 2).reshape(b, t, c)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate='tanh'))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, c):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.h = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if name.endswith('proj.weight') else 0.02)
            elif name.endswith('bias'):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def timed(step, warmup, steps, cuda):
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--model', default='small')
    p.add_argument('--device', default='cuda')
    p.add_argument('--dtype', default='bfloat16')
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--seq', type=int, default=1024)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--head-dim', type=int, default=128)
    p.add_argument('--vocab', type=int, default=0)
    # kusari's embedding padding; PyTorch runs the vocabulary as it is (torch.compile pads its
    # products itself).
    p.add_argument('--vocab-multiple', type=int, default=0)
    p.add_argument('--attention', action='store_true')
    p.add_argument('--mode', choices=['eager', 'compile'], default='eager')
    a = p.parse_args()
    dev = torch.device('cuda' if a.device == 'cuda' else 'cpu')
    cuda = dev.type == 'cuda'
    bf16 = a.dtype == 'bfloat16'
    torch.manual_seed(0)
    if a.attention:
        heads = 2048 // a.head_dim
        dt = torch.bfloat16 if bf16 else torch.float32
        for t in (1024, 2048, 4096, 8192, 16384):
            b = max(1, 16384 // t)
            q, k, v = (torch.rand(b, heads, t, a.head_dim, device=dev, dtype=dt, requires_grad=True)
                       for _ in range(3))
            gy = torch.rand(b, heads, t, a.head_dim, device=dev, dtype=dt)

            def step():
                q.grad = k.grad = v.grad = None
                attention(q, k, v).backward(gy)
            ms = timed(step, 2, a.steps, cuda)
            flops = 4.0 * b * heads * t * t * a.head_dim * 2.5 * 0.5
            print('RESULT attn_tflops_%d' % t, flops / (ms * 1e-3) / 1e12, flush=True)
        return
    layers, heads, c, block = SIZES[a.model]
    vocab = a.vocab or (256 if a.model == 'tiny' else 50257)
    model = GPT(vocab, max(block, a.seq), layers, heads, c).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **({'fused': True} if cuda else {}))
    ids = (torch.arange(a.batch * (a.seq + 1), dtype=torch.int64) * 2654435761) % vocab
    ids = ids.view(a.batch, a.seq + 1).to(dev)
    x, t = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    fwd = torch.compile(model) if a.mode == 'compile' else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(x, t)
        loss.backward()
        opt.step()
    ms = timed(step, a.warmup, a.steps, cuda)
    print('RESULT step_ms', ms)
    if cuda:
        print('RESULT peak_bytes', torch.cuda.max_memory_allocated())
    else:
        import resource
        print('RESULT peak_bytes', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


if __name__ == '__main__':
    main()
