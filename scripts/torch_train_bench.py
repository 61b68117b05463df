#!/usr/bin/env python3
"""PyTorch eager reference for `axon-bench train`: the same models, batch and
thread count, timing forward + cross-entropy + backward + SGD step on random
inputs. Prints one line in the same format as axon-bench.

  python3 scripts/torch_train_bench.py --model resnet20 --batch 128 --threads 2
  python3 scripts/torch_train_bench.py --model bert --batch 8 --seq 128
  python3 scripts/torch_train_bench.py --model bert --batch 32 --device cuda
  python3 scripts/torch_train_bench.py --model gpt --layers 4 --seq 256 --vocab 50257 --batch 8 --bf16

The BERT encoder layer is written out to match axon's (models/bert.c,
models/layers/tf_encoder.c, tf_attn.c): fused QKV projection, softmax of
the scaled, masked scores, dropout on the probabilities, output projection,
dropout, post-LN; then dense -> GELU -> dense, dropout, post-LN (no dropout
between the two dense layers, unlike nn.TransformerEncoderLayer). --attn
sdpa replaces the explicit attention by F.scaled_dot_product_attention (the
same function, PyTorch's fused kernels; PyTorch >= 2.0).

The GPT is axon's (models/gpt.c, the decoder layer of models/layers/):
token and learned position embeddings, dropout, pre-LN blocks (causal
attention with dropout on the probabilities, output projection, dropout,
residual; LayerNorm, dense -> exact GELU -> dense, dropout, residual), a
final LayerNorm and a head tied to the token embedding. --bf16 runs the
forward under torch.autocast(dtype=torch.bfloat16) on the CPU (or CUDA),
PyTorch's mixed precision. The last line's peak_rss_mb is the process's
peak resident memory (getrusage) and cpu_s_per_step its CPU time per timed
step (every thread's), as axon-bench reports its own.

On CUDA, timing synchronises the device (torch.cuda.synchronize) before the
first and after the last timed step. Precision is plain FP32 unless --tf32
(TF32 matmuls and cuDNN convolutions; axon's counterpart is AXON_TF32=1);
cuDNN picks convolution algorithms by heuristics unless --cudnn-benchmark
(axon's counterpart is AXON_CUDNN_BENCHMARK=1).
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.sc = None
        if stride != 1 or cin != cout:
            self.sc = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                    nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.sc is None else self.sc(x)))


class ResNet20(nn.Module):
    def __init__(self, cin=1, classes=10):
        super().__init__()
        layers = [nn.Conv2d(cin, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
        c = 16
        for i, w in enumerate([16, 32, 64]):
            for j in range(3):
                layers.append(BasicBlock(c, w, 2 if (j == 0 and i > 0) else 1))
                c = w
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class EncoderLayer(nn.Module):
    """axon's post-LN encoder layer (models/layers/tf_encoder.c)."""

    def __init__(self, hidden, heads, ff, p, attn):
        super().__init__()
        self.heads, self.p, self.attn = heads, p, attn
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ff1 = nn.Linear(hidden, ff)
        self.ff2 = nn.Linear(ff, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def attention(self, x, mask):
        b, s, h = x.shape
        a, dh = self.heads, h // self.heads
        q, k, v = self.qkv(x).view(b, s, 3, a, dh).permute(2, 0, 3, 1, 4)
        keep = (mask != 0)[:, None, None, :]  # (B, 1, 1, S)
        p = self.p if self.training else 0.0
        if self.attn == "sdpa":
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
        else:
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
            probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
            ctx = F.dropout(probs, p, self.training) @ v
        return self.proj(ctx.transpose(1, 2).reshape(b, s, h))

    def forward(self, x, mask):
        x = self.ln1(x + F.dropout(self.attention(x, mask), self.p, self.training))
        y = self.ff2(F.gelu(self.ff1(x)))
        return self.ln2(x + F.dropout(y, self.p, self.training))


class DecoderLayer(nn.Module):
    """axon's pre-LN decoder layer (GPT-2)."""

    def __init__(self, hidden, heads, ff, p):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
        self.ff1 = nn.Linear(hidden, ff)
        self.ff2 = nn.Linear(ff, hidden)

    def attention(self, x):
        b, s, h = x.shape
        a, dh = self.heads, h // self.heads
        q, k, v = self.qkv(x).view(b, s, 3, a, dh).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        ctx = F.dropout(probs, self.p, self.training) @ v
        return self.proj(ctx.transpose(1, 2).reshape(b, s, h))

    def forward(self, x):
        x = x + F.dropout(self.attention(self.ln1(x)), self.p, self.training)
        y = self.ff2(F.gelu(self.ff1(self.ln2(x))))
        return x + F.dropout(y, self.p, self.training)


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, ff, vocab, seq, p):
        super().__init__()
        self.p = p
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(DecoderLayer(hidden, heads, ff, p)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        h = F.dropout(self.tok(ids) + self.pos(pos), self.p, self.training)
        for block in self.blocks:
            h = block(h)
        return (self.ln(h) @ self.tok.weight.t()).flatten(0, 1)


class Bert(nn.Module):
    def __init__(self, layers, hidden, heads, ff, vocab, seq, attn="explicit"):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.seg = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.enc = nn.ModuleList(EncoderLayer(hidden, heads, ff, 0.1, attn)
                                 for _ in range(layers))
        self.mlm = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.LayerNorm(hidden, eps=1e-12), nn.Linear(hidden, vocab))
        self.pool = nn.Linear(hidden, hidden)
        self.nsp = nn.Linear(hidden, 2)

    def forward(self, ids, segs, mask):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        h = F.dropout(self.ln(self.tok(ids) + self.pos(pos) + self.seg(segs)), 0.1, self.training)
        for layer in self.enc:
            h = layer(h, mask)
        return self.mlm(h).flatten(0, 1), self.nsp(torch.tanh(self.pool(h[:, 0])))


def set_tf32(on):
    """TF32 for cuBLAS matmuls and cuDNN convolutions on or off. PyTorch
    >= 2.9 has per-backend fp32_precision settings and refuses to mix them
    with the legacy allow_tf32 flags, so the new API is used when present."""
    matmul = torch.backends.cuda.matmul
    try:  # PyTorch < 2.9 raises AttributeError or (1.x) AssertionError
        new_api = matmul.fp32_precision is not None
    except (AttributeError, AssertionError):
        new_api = False
    if new_api:
        mode = "tf32" if on else "ieee"
        matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
        return
    matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ff", type=int, default=3072)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tf32", action="store_true",
                    help="TF32 matmuls and convolutions (default: plain FP32)")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="let cuDNN measure convolution algorithms")
    ap.add_argument("--attn", choices=["explicit", "sdpa"], default="explicit")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--bf16", action="store_true",
                    help="bf16 autocast (mixed precision)")
    a = ap.parse_args()
    if a.attn == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        ap.error(f"--attn sdpa needs PyTorch >= 2.0 (this is {torch.__version__})")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    set_tf32(a.tf32)
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    if a.model == "resnet20":
        b = a.batch or 128
        model = ResNet20().to(dev)
        x = (torch.randn(b, 1, 32, 32, device=dev),)
        y = torch.randint(0, 10, (b,), device=dev)
        loss_fn = lambda out: F.cross_entropy(out, y)
    elif a.model == "gpt":
        b = a.batch or 8
        model = Gpt(a.layers, a.hidden, a.heads, a.ff, a.vocab, a.seq, a.dropout).to(dev)
        x = (torch.randint(0, a.vocab, (b, a.seq), device=dev),)
        y = torch.randint(0, a.vocab, (b * a.seq,), device=dev)
        loss_fn = lambda out: F.cross_entropy(out.float(), y)
    else:
        b = a.batch or 8
        model = Bert(a.layers, a.hidden, a.heads, a.ff, a.vocab, a.seq, a.attn).to(dev)
        ids = torch.randint(5, a.vocab, (b, a.seq), device=dev)
        segs = torch.randint(0, 2, (b, a.seq), device=dev)
        mask = torch.ones(b, a.seq, device=dev)
        x = (ids, segs, mask)
        mlm = torch.randint(0, a.vocab, (b * a.seq,), device=dev)
        mlm[torch.rand(b * a.seq, device=dev) >= 0.15] = -100
        nsp = torch.randint(0, 2, (b,), device=dev)
        loss_fn = lambda out: (F.cross_entropy(out[0], mlm, ignore_index=-100)
                               + F.cross_entropy(out[1], nsp))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    model.train()
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            c0 = time.process_time()
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
            out = model(*x)
        loss_fn(out).backward()
        opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    sps = a.steps * b / dt
    n = sum(p.numel() for p in model.parameters())
    extra = f" tokens_per_s={sps * a.seq:.1f}" if a.model in ("bert", "gpt") else ""
    extra += f" bf16={int(a.bf16)} cpu_s_per_step={cpu / a.steps:.3f}"
    extra += f" peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
    if dev.type == "cuda":
        extra += (f" tf32={int(a.tf32)} cudnn_benchmark={int(a.cudnn_benchmark)}"
                  + (f" attn={a.attn}" if a.model == "bert" else ""))
    print(f"torch train: model={a.model} batch={b} threads={a.threads} device={a.device} "
          f"params={n} step_ms={1000 * dt / a.steps:.2f} samples_per_s={sps:.2f}{extra}")


if __name__ == "__main__":
    main()
