#!/usr/bin/env python3
"""PyTorch eager reference for `axon-bench train`: the same models, batch and
thread count, timing forward + cross-entropy + backward + SGD step on random
inputs. Prints one line in the same format as axon-bench.

  python3 scripts/torch_train_bench.py --model resnet20 --batch 128 --threads 2
  python3 scripts/torch_train_bench.py --model bert --batch 8 --seq 128
"""
import argparse
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


class Bert(nn.Module):
    def __init__(self, layers, hidden, heads, ff, vocab, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq, hidden)
        self.seg = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        layer = nn.TransformerEncoderLayer(hidden, heads, ff, 0.1, activation="gelu",
                                           batch_first=True, layer_norm_eps=1e-12)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mlm = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.LayerNorm(hidden, eps=1e-12), nn.Linear(hidden, vocab))
        self.pool = nn.Linear(hidden, hidden)
        self.nsp = nn.Linear(hidden, 2)

    def forward(self, ids, segs, mask):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        h = F.dropout(self.ln(self.tok(ids) + self.pos(pos) + self.seg(segs)), 0.1, self.training)
        h = self.enc(h, src_key_padding_mask=(mask == 0))
        return self.mlm(h).flatten(0, 1), self.nsp(torch.tanh(self.pool(h[:, 0])))


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
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    if a.model == "resnet20":
        b = a.batch or 128
        model = ResNet20().to(dev)
        x = (torch.randn(b, 1, 32, 32, device=dev),)
        y = torch.randint(0, 10, (b,), device=dev)
        loss_fn = lambda out: F.cross_entropy(out, y)
    else:
        b = a.batch or 8
        model = Bert(a.layers, a.hidden, a.heads, a.ff, a.vocab, a.seq).to(dev)
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
        opt.zero_grad()
        loss_fn(model(*x)).backward()
        opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    sps = a.steps * b / dt
    n = sum(p.numel() for p in model.parameters())
    extra = f" tokens_per_s={sps * a.seq:.1f}" if a.model == "bert" else ""
    print(f"torch train: model={a.model} batch={b} threads={a.threads} device={a.device} "
          f"params={n} step_ms={1000 * dt / a.steps:.2f} samples_per_s={sps:.2f}{extra}")


if __name__ == "__main__":
    main()
