#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The MoE layer of moe_layer_bench in PyTorch (the peer), fp32 or bf16 autocast, forward + backward.

    /usr/bin/python3 benchmarks/peer/moe_layer_torch.py --shape A|B|C --threads N [--iters N]
                                                       [--warmup W] [--precision fp32|bf16]
                                                       [--omp-wait-policy passive|default]

Same shapes (BENCHMARKS.md), seed number and JSON keys as moe_layer_bench: router Linear(H->E),
top-k of the logits then softmax over the k (softmax after top-k), dropless, SwiGLU experts
y = W2 (silu(W1 x) * (W3 x) * p) (one weight tensor per expert), tokens grouped by expert (stable sort), outputs scatter-added
back; backward by autograd from a fresh output gradient, down to dx and every weight. bf16: the
forward under torch.autocast("cpu", bfloat16) (fp32 master weights and gradients, the GEMMs in
BF16 through oneDNN), as a PyTorch user trains in bf16 on a CPU. Run at its best: the thread count
given to OpenMP, OpenBLAS and torch, and --omp-wait-policy passive (OMP_WAIT_POLICY=PASSIVE) or
default (OpenMP's own), whichever is faster on the machine (compare.py runs both; set here
before torch is imported). Prints one JSON line.
"""
import argparse
import json
import resource
import sys
import time

from peer_threads import load_torch

SHAPES = {"A": (4096, 1024, 2816, 8, 2), "B": (4096, 1024, 704, 32, 8), "C": (1024, 256, 512, 16, 4)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="A")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--omp-wait-policy", default="passive", choices=("passive", "default"),
                        help="passive: OMP_WAIT_POLICY=PASSIVE; default: OpenMP's own (spinning)")
    args = parser.parse_args()
    if args.shape not in SHAPES or args.threads < 1 or args.iters < 1:
        print(f"moe_layer_torch: unknown shape {args.shape!r} or bad counts", file=sys.stderr)
        return 2
    torch = load_torch(args.threads, args.omp_wait_policy)
    import torch.nn.functional as F
    T, H, Fw, E, k = SHAPES[args.shape]
    gen = torch.Generator().manual_seed(args.seed)
    router = (0.02 * torch.randn(E, H, generator=gen)).requires_grad_()
    # One tensor per expert, as an nn.ModuleList of experts holds them (slicing one [E, ...] tensor
    # would make every expert's backward add a zero-padded gradient of all experts).
    w1 = [(0.02 * torch.randn(2 * Fw, H, generator=gen)).requires_grad_() for _ in range(E)]
    w2 = [(0.02 * torch.randn(H, Fw, generator=gen)).requires_grad_() for _ in range(E)]
    tokens_of = torch.arange(T).repeat_interleave(k)

    def forward(x):
        logits = x @ router.t()
        top_logits, top_experts = logits.topk(k, dim=1)
        probs = torch.softmax(top_logits, dim=1)
        flat_experts = top_experts.reshape(-1)
        order = torch.argsort(flat_experts, stable=True)
        rows_token = tokens_of[order]
        rows_prob = probs.reshape(-1)[order]
        counts = torch.bincount(flat_experts, minlength=E).tolist()
        rows = x[rows_token]
        outputs, start = [], 0
        for e in range(E):
            n = counts[e]
            if n == 0:
                continue
            h = rows[start:start + n] @ w1[e].t()
            gate, linear = h.split(Fw, dim=1)
            act = F.silu(gate) * linear * rows_prob[start:start + n, None]
            outputs.append(act @ w2[e].t())
            start += n
        # Under autocast the expert outputs are BF16; tokens add them up in fp32, as megamoe does.
        return torch.zeros_like(x).index_add_(0, rows_token, torch.cat(outputs).to(x.dtype))

    fwd, bwd = [], []
    for step in range(args.warmup + args.iters):
        x = torch.randn(T, H, generator=gen).requires_grad_()
        dy = torch.randn(T, H, generator=gen)
        for p in [router, *w1, *w2]:
            p.grad = None
        t0 = time.perf_counter()
        if args.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = forward(x)
        else:
            y = forward(x)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        if step >= args.warmup:
            fwd.append(1e3 * (t1 - t0))
            bwd.append(1e3 * (t2 - t1))

    def median(values):
        return sorted(values)[len(values) // 2]

    steps = [a + b for a, b in zip(fwd, bwd)]
    step_ms = median(steps)
    flops = 18.0 * T * k * H * Fw
    print(json.dumps({
        "shape": args.shape, "threads": args.threads, "backend": "pytorch",
        "kernel": "openblas" if args.precision == "fp32" else "onednn",
        "precision": args.precision, "omp_wait_policy": args.omp_wait_policy,
        "tokens_per_s": T / (step_ms / 1e3), "gflops": flops / (step_ms / 1e3) / 1e9,
        "step_ms_median": step_ms, "step_ms_min": min(steps), "step_ms_max": max(steps),
        "fwd_ms": median(fwd), "bwd_ms": median(bwd), "check_rel_err": None,
        "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
