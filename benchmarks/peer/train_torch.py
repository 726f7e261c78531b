#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The training program megamoe-train in PyTorch (the peer): same model, batches and optimizer, fp32.

    /usr/bin/python3 benchmarks/peer/train_torch.py [--preset tiny|small|fine|medium] [--steps 40]
        [--threads 2] [--omp-wait-policy passive|default] [--seq-len S] [--micro-batch B]
        [--lr 3e-3] [--seed 1234] [--data /usr/share/games/fortunes] [--warmup-steps 3]
        [--init torch|megamoe] [--metrics steps.jsonl]

What it runs, as a competent PyTorch user writes it (nn.Module classes, autograd):
  * The model of megamoe-train's preset (examples/presets.hpp; `medium` as issue 24 defines it):
    a byte-level decoder, vocabulary 256: token embedding, pre-norm blocks (RMSNorm eps 1e-5,
    causal attention with RoPE "rotate half", base 10000, qkv weight [3H, H] with rows q|k|v and
    head h in columns h*d.., no biases anywhere), then the MoE layer (layers i % moe_layer_freq
    == 0) or a dense SwiGLU FFN, final RMSNorm, untied output layer, mean cross-entropy.
    SwiGLU: fc1 [2F, H] with the gate half first, act = silu(gate) * linear (times the router
    prob in an expert), fc2 [H, F].
  * MoE layer: router Linear(H -> E); experts an nn.ModuleList of SwiGLU FFNs; dropless; tokens
    grouped per expert (stable argsort of the chosen experts), index_select per expert, outputs
    index_add_ back. Routers: tiny/small/medium `top_k<2, aux_loss<1e-2>, z_loss<1e-3>>` (top-k of
    the logits, softmax over the k; switch aux loss coeff * E / (k T^2) * sum_e P_e c_e over the
    micro-batch with P the full softmax; z-loss coeff * mean logsumexp^2); fine
    `aux_loss_free<4, seq_aux_loss<1e-4>>` (sigmoid scores, top-4 of score + expert bias, probs the
    selected scores renormalised over the 4; the same switch loss per sequence on the scores
    normalised over E, averaged over the sequences; the fp32 expert bias updated after every
    global batch by bias += 1e-3 * sign(mean(c) - c) from the tokens each expert received).
    The attached losses enter the backward with scale 1 (one micro-batch per step), as megamoe's.
  * Batches: the same bytes as megamoe-train: the corpus (every regular file of --data in name
    order, *.dat and *.u8 skipped; the last ceil(5 %) held out) and sequence g of step k starting
    at splitmix64(splitmix64(seed ^ splitmix64(k)) ^ g) % (training bytes - S); one micro-batch
    of B sequences per step (the global batch of one rank), laid out [B, S].
  * Optimizer: torch.optim.AdamW(foreach=True), betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
    matrices only (norm weights none), global-norm clipping at 1.0 (clip_grad_norm_), learning
    rate per step: linear warmup over max(1, steps / 20) steps to --lr, cosine to --lr / 10 at the
    last step (optim::lr_schedule as megamoe-train builds it). Every parameter keeps a gradient
    tensor (zeroed each step, not set to None), so an expert that received no token is still
    updated (moments, weight decay, step count) as megamoe's optimizer updates it; AdamW skips a
    parameter whose gradient is None, and that alone made the two runs part at step 4.
  * Weights N(0, 0.02^2), norms 1: with torch's normal_ (--init torch, the default: the same
    distribution as megamoe's initialize, not the same numbers), or exactly megamoe's numbers
    (--init megamoe: its counter-based Box-Muller draw per parameter and element, in numpy), for
    cross-checking. With --init megamoe the per-step losses equal megamoe-train's to about 1e-6
    nats over the first steps (tiny: within 1.5e-4 over 60 steps; fine: 1e-4 over 20 steps; small
    parts after about 12 steps, as a 1e-7 perturbation of the weights parts this program from
    itself there); --metrics writes them.

Timing: each step from zero_grad and building the batch to the end of optimizer.step() and the
expert-bias update, as megamoe-train times trainer.step() (its held-out evaluations are outside
the step there too and not run here). The first --warmup-steps steps are run but not timed.
Reported: tokens_per_s = timed tokens / timed seconds, tokens_per_s_median = tokens per step /
median step time, step_ms_median. Defaults per preset as megamoe-train's: seq 128, micro-batch
16; medium seq 256, micro-batch 8.

Threads: --threads is given to OpenMP, OpenBLAS and MKL before torch loads, and to
torch.set_num_threads. --omp-wait-policy passive sets OMP_WAIT_POLICY=PASSIVE before torch loads,
default leaves it unset, so the caller can take the better of the two (a peer at its best,
docs BENCHMARKS.md). Prints one JSON line on stdout; progress goes to stderr.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

from peer_threads import load_torch

# megamoe's presets (examples/presets.hpp). Router kinds:
# "top_k" = top_k<K, aux_loss<aux>, z_loss<z>> (softmax after top-k); "aux_loss_free" =
# aux_loss_free<K, seq_aux_loss<seq_aux>> (sigmoid scores, expert bias).
PRESETS = {
    "tiny": dict(hidden=64, layers=2, heads=4, vocab=256, experts=4, ffn=128, top_k=2,
                 dense_ffn=256, moe_every=2, router="top_k", aux=1e-2, z=1e-3,
                 seq_len=128, micro_batch=16),
    "small": dict(hidden=128, layers=4, heads=4, vocab=256, experts=8, ffn=256, top_k=2,
                  dense_ffn=512, moe_every=2, router="top_k", aux=1e-2, z=1e-3,
                  seq_len=128, micro_batch=16),
    "fine": dict(hidden=128, layers=4, heads=4, vocab=256, experts=16, ffn=96, top_k=4,
                 dense_ffn=0, moe_every=1, router="aux_loss_free", seq_aux=1e-4, bias_rate=1e-3,
                 seq_len=128, micro_batch=16),
    "medium": dict(hidden=512, layers=8, heads=8, vocab=256, experts=16, ffn=1024, top_k=2,
                   dense_ffn=2048, moe_every=2, router="top_k", aux=1e-2, z=1e-3,
                   seq_len=256, micro_batch=8),
}
NORM_EPS = 1e-5
ROPE_BASE = 10000.0
INIT_STD = 0.02
BETAS, ADAM_EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0
HELDOUT_FRACTION = 0.05

MASK64 = (1 << 64) - 1


def splitmix64(x):
    """megamoe::splitmix64 (core/random.hpp) on Python ints, masked to 64 bits."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def load_corpus(path):
    """The bytes of a file, or of every regular file of a folder in name order (*.dat and *.u8
    skipped); returns (training bytes, held-out bytes)."""
    if os.path.isdir(path):
        names = sorted(os.fsencode(n) for n in os.listdir(path))
        files = []
        for name in names:
            full = os.path.join(os.fsencode(path), name)
            ext = os.path.splitext(name)[1]
            if os.path.isfile(full) and ext not in (b".dat", b".u8"):
                files.append(full)
    elif os.path.exists(path):
        files = [path]
    else:
        sys.exit(f"train_torch: corpus {path} does not exist")
    data = b"".join(open(f, "rb").read() for f in files)
    if not data:
        sys.exit(f"train_torch: corpus {path} holds no bytes")
    split = len(data) - math.ceil(HELDOUT_FRACTION * len(data))
    return data[:split], data[split:]


def megamoe_normals(seed, count, std):
    """std * megamoe::standard_normal(seed, e) for e in [0, count), as float32 (core/random.hpp:
    Box-Muller on two splitmix64 uniforms), with numpy's wrapping uint64 arithmetic."""
    import numpy as np

    def mix(x):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    def uniform(key):
        return ((mix(key) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53

    base = np.uint64(splitmix64(seed & MASK64)) ^ (
        np.arange(count, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03))
    u1, u2 = uniform(base), uniform(base ^ np.uint64(0x6A09E667F3BCC909))
    return (std * (np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2))).astype(np.float32)


def lr_at(step, peak, minimum, warmup, total):
    """optim::lr_schedule::at: linear warmup, then cosine to the minimum at `total` (1-based)."""
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    if step >= total:
        return minimum
    progress = (step - warmup) / max(1, total - warmup)
    return minimum + 0.5 * (peak - minimum) * (1.0 + math.cos(math.pi * progress))


def blas_info():
    """The BLAS and LAPACK libraries this process has loaded (cheap: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps
                    if "blas" in line.lower() or "lapack" in line.lower() or "libmkl" in line}
        return sorted(os.path.basename(lib) if "/" in lib else lib for lib in libs) or None
    except OSError:
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (one batch each)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--omp-wait-policy", default="passive", choices=("passive", "default"))
    parser.add_argument("--seq-len", type=int, default=None,
                        help="bytes per sequence (default: 128; medium 256)")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="sequences per step (default: 16; medium 8)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=1234, help="seed of weights and batches")
    parser.add_argument("--data", default="/usr/share/games/fortunes")
    parser.add_argument("--warmup-steps", type=int, default=3,
                        help="leading steps run but not timed (not the learning-rate warmup)")
    parser.add_argument("--init", default="torch", choices=("torch", "megamoe"),
                        help="initial weights: torch's normal_ (default), or exactly megamoe's "
                             "(transformer::initialize, for cross-checking loss curves)")
    parser.add_argument("--metrics", default=None,
                        help="also write one JSON line per step (loss, lr, grad_norm) here")
    args = parser.parse_args()
    cfg = PRESETS[args.preset]
    S = args.seq_len if args.seq_len is not None else cfg["seq_len"]
    B = args.micro_batch if args.micro_batch is not None else cfg["micro_batch"]
    if args.steps < 1 or args.threads < 1 or S < 2 or B < 1 or args.warmup_steps < 0 \
            or not args.lr > 0 or not 0 <= args.seed <= MASK64:
        print("train_torch: --steps, --threads, --micro-batch, --lr must be positive, --seq-len "
              "at least 2, --warmup-steps not negative, --seed a 64-bit unsigned value",
              file=sys.stderr)
        return 2

    torch = load_torch(args.threads, args.omp_wait_policy)
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(args.seed & 0x7FFFFFFFFFFFFFFF)

    class RMSNorm(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class CausalSelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads, self.head_size = heads, hidden // heads
            # Rows as the reference lays them out: per head (one query group each) its q, k, v.
            self.linear_qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.linear_proj = nn.Linear(hidden, hidden, bias=False)

        def forward(self, x, cos, sin, mask):
            b, s, h = x.shape
            qkv = self.linear_qkv(x).view(b, s, self.heads, 3, self.head_size)
            q, k, v = qkv.permute(3, 0, 2, 1, 4)  # each [B, heads, S, d]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
                ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_size))
                probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
                ctx = probs @ v
            return self.linear_proj(ctx.transpose(1, 2).reshape(b, s, h))

    class SwiGLU(nn.Module):
        """fc1 [2F, H] (gate half first), fc2 [H, F]; an expert scales the activation by its prob."""

        def __init__(self, hidden, ffn):
            super().__init__()
            self.linear_fc1 = nn.Linear(hidden, 2 * ffn, bias=False)
            self.linear_fc2 = nn.Linear(ffn, hidden, bias=False)

        def forward(self, x, prob=None):
            gate, linear = self.linear_fc1(x).chunk(2, dim=-1)
            act = F.silu(gate) * linear
            if prob is not None:
                act = act * prob.unsqueeze(-1)
            return self.linear_fc2(act)

    class MoELayer(nn.Module):
        def __init__(self, hidden, c):
            super().__init__()
            self.experts_n, self.k, self.kind = c["experts"], c["top_k"], c["router"]
            self.c = c
            self.router = nn.Linear(hidden, c["experts"], bias=False)
            self.experts = nn.ModuleList(SwiGLU(hidden, c["ffn"]) for _ in range(c["experts"]))
            if self.kind == "aux_loss_free":
                self.register_buffer("expert_bias", torch.zeros(c["experts"]))
                self.register_buffer("tokens_per_expert", torch.zeros(c["experts"]))

        def forward(self, x):
            b, s, h = x.shape
            E, k = self.experts_n, self.k
            flat = x.reshape(-1, h)
            T = flat.shape[0]
            logits = self.router(flat)  # [T, E] fp32
            aux = logits.new_zeros(())
            z = logits.new_zeros(())
            if self.kind == "top_k":
                top_logits, idx = logits.topk(k, dim=-1)
                probs = torch.softmax(top_logits, dim=-1)
                # Switch aux loss on the full softmax; counts of the top-k (the same experts as
                # the top-k of the logits) over the micro-batch.
                scores = torch.softmax(logits, dim=-1)
                counts = torch.bincount(idx.reshape(-1), minlength=E).to(scores.dtype)
                aux = self.c["aux"] * E / (k * T * T) * (scores.sum(0) * counts).sum()
                z = self.c["z"] * torch.logsumexp(logits, dim=-1).square().mean()
            else:
                scores = torch.sigmoid(logits)
                with torch.no_grad():
                    idx = (scores + self.expert_bias).topk(k, dim=-1).indices
                    self.tokens_per_expert += torch.bincount(idx.reshape(-1), minlength=E)
                chosen = scores.gather(1, idx)
                probs = chosen / (chosen.sum(-1, keepdim=True) + 1e-20)
                # Sequence aux loss: scores normalised over E, their own top-k (no bias), per
                # sequence, averaged over the sequences.
                normed = (scores / (scores.sum(-1, keepdim=True) + 1e-20)).view(b, s, E)
                with torch.no_grad():
                    own = normed.topk(k, dim=-1).indices
                    seq_counts = torch.zeros_like(normed).scatter_(2, own, 1.0).sum(1)
                aux = self.c["seq_aux"] * E / (k * s * s) / b * (normed.sum(1) * seq_counts).sum()
            # Dropless dispatch: rows grouped per expert, each expert on its rows, added back.
            flat_idx = idx.reshape(-1)
            order = torch.argsort(flat_idx, stable=True)
            token_of = order // k
            prob_of = probs.reshape(-1)[order]
            counts = torch.bincount(flat_idx, minlength=E).tolist()
            out = torch.zeros_like(flat)
            start = 0
            for e, n in enumerate(counts):
                if n == 0:
                    continue
                tokens = token_of[start:start + n]
                y = self.experts[e](flat.index_select(0, tokens), prob_of[start:start + n])
                out.index_add_(0, tokens, y)
                start += n
            return out.view(b, s, h), aux, z

        @torch.no_grad()
        def finish_global_batch(self):
            """The aux-loss-free expert-bias update (router_state::finish_global_batch)."""
            if self.kind != "aux_loss_free":
                return
            c = self.tokens_per_expert
            self.expert_bias += self.c["bias_rate"] * torch.sign(c.mean() - c)
            c.zero_()

    class Block(nn.Module):
        def __init__(self, hidden, c, moe):
            super().__init__()
            self.input_layernorm = RMSNorm(hidden)
            self.self_attention = CausalSelfAttention(hidden, c["heads"])
            self.pre_mlp_layernorm = RMSNorm(hidden)
            self.mlp = MoELayer(hidden, c) if moe else SwiGLU(hidden, c["dense_ffn"])

        def forward(self, x, cos, sin, mask):
            x = x + self.self_attention(self.input_layernorm(x), cos, sin, mask)
            if isinstance(self.mlp, MoELayer):
                y, aux, z = self.mlp(self.pre_mlp_layernorm(x))
                return x + y, aux, z
            return x + self.mlp(self.pre_mlp_layernorm(x)), None, None

    class Decoder(nn.Module):
        def __init__(self, c):
            super().__init__()
            H = c["hidden"]
            self.head_size = H // c["heads"]
            self.word_embeddings = nn.Embedding(c["vocab"], H)
            self.layers = nn.ModuleList(
                Block(H, c, i % c["moe_every"] == 0) for i in range(c["layers"]))
            self.final_layernorm = RMSNorm(H)
            self.output_layer = nn.Linear(H, c["vocab"], bias=False)  # untied
            self._rope = None
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, INIT_STD)

        def rope(self, s):
            if self._rope is None or self._rope[0].shape[0] != s:
                d = self.head_size
                inv = ROPE_BASE ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
                angles = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
                angles = torch.cat((angles, angles), dim=-1)
                mask = torch.ones(s, s, dtype=torch.bool).triu(1)
                self._rope = (angles.cos().float(), angles.sin().float(), mask)
            return self._rope

        def forward(self, tokens, targets):
            cos, sin, mask = self.rope(tokens.shape[1])
            x = self.word_embeddings(tokens)
            aux_total, z_total = [], []
            for layer in self.layers:
                x, aux, z = layer(x, cos, sin, mask)
                if aux is not None:
                    aux_total.append(aux)
                    z_total.append(z)
            logits = self.output_layer(self.final_layernorm(x))
            ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
            aux = torch.stack(aux_total).sum() if aux_total else ce.new_zeros(())
            z = torch.stack(z_total).sum() if z_total else ce.new_zeros(())
            return ce, aux, z

        def finish_global_batch(self):
            for layer in self.layers:
                if isinstance(layer.mlp, MoELayer):
                    layer.mlp.finish_global_batch()

    training, heldout = load_corpus(args.data)
    if len(training) < S + 1 or len(heldout) < S + 1:
        sys.exit(f"train_torch: {len(training) + len(heldout)} corpus bytes are too few for "
                 f"windows of {S + 1} bytes")
    train_bytes = torch.frombuffer(bytearray(training), dtype=torch.uint8)
    positions = torch.arange(S + 1)
    starts_span = len(training) - S

    def batch(step):
        """corpus::training_batch: sequence g of step k from splitmix64 of (seed, k, g)."""
        key = splitmix64(args.seed ^ splitmix64(step))
        starts = [splitmix64(key ^ g) % starts_span for g in range(B)]
        windows = train_bytes[torch.tensor(starts)[:, None] + positions].long()
        return windows[:, :-1], windows[:, 1:]

    model = Decoder(cfg)
    if args.init == "megamoe":
        # transformer::initialize: parameter n of the model (counting from the embedding) draws
        # from seed + n, or layer_seed + n inside layer i (layer_seed = seed + 1000003 (i + 1));
        # an MoE layer numbers its own from layer_seed + 500000: router 1, fc1 of expert e 2 + e,
        # fc2 2 + E + e. Element numbers are row-major in the [out, in] weight.
        def fill(weight, seed):
            values = megamoe_normals(seed, weight.numel(), INIT_STD)
            with torch.no_grad():
                weight.copy_(torch.from_numpy(values).view_as(weight))

        index = 1
        fill(model.word_embeddings.weight, args.seed + index)
        for i, layer in enumerate(model.layers):
            layer_seed = args.seed + 1000003 * (i + 1)
            for w in (layer.self_attention.linear_qkv.weight,
                      layer.self_attention.linear_proj.weight):
                index += 1
                fill(w, layer_seed + index)
            if isinstance(layer.mlp, MoELayer):
                E = len(layer.mlp.experts)
                fill(layer.mlp.router.weight, layer_seed + 500000 + 1)
                for e, expert in enumerate(layer.mlp.experts):
                    fill(expert.linear_fc1.weight, layer_seed + 500000 + 2 + e)
                    fill(expert.linear_fc2.weight, layer_seed + 500000 + 2 + E + e)
            else:
                for w in (layer.mlp.linear_fc1.weight, layer.mlp.linear_fc2.weight):
                    index += 1
                    fill(w, layer_seed + index)
        index += 1
        fill(model.output_layer.weight, args.seed + index)
    num_parameters = sum(p.numel() for p in model.parameters())
    params = list(model.parameters())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=BETAS, eps=ADAM_EPS, foreach=True)
    # Every parameter holds a gradient (zeros where no token reached it: an expert without
    # tokens), so AdamW updates all of them every step as megamoe's optimizer does (moments
    # decaying, weight decay, one step count); a None gradient would make AdamW skip it.
    for p in params:
        p.grad = torch.zeros_like(p)
    schedule = (args.lr, args.lr / 10, max(1, args.steps // 20), args.steps)
    metrics = open(args.metrics, "w") if args.metrics else None

    seconds, losses = [], []
    for step in range(1, args.steps + 1):
        lr = lr_at(step, *schedule)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        tokens, targets = batch(step)
        ce, aux, z = model(tokens, targets)
        (ce + aux + z).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        model.finish_global_batch()
        loss = ce.item()
        seconds.append(time.perf_counter() - t0)
        losses.append(loss)
        if metrics:
            metrics.write(json.dumps({
                "step": step, "loss": loss, "train_bpb": loss / math.log(2),
                "aux_loss": aux.item(), "z_loss": z.item(), "lr": lr,
                "grad_norm": float(grad_norm), "seconds": seconds[-1]}) + "\n")
            metrics.flush()
        if step == 1 or step % 10 == 0 or step == args.steps:
            print(f"train_torch: step {step}/{args.steps} loss {loss:.4f} nats "
                  f"({loss / math.log(2):.3f} bits/byte), {1e3 * seconds[-1]:.0f} ms",
                  file=sys.stderr)
    if metrics:
        metrics.close()

    timed = seconds[args.warmup_steps:] or seconds
    tokens_per_step = S * B
    step_ms = [1e3 * t for t in timed]
    median_ms = statistics.median(step_ms)
    print(json.dumps({
        "preset": args.preset, "backend": "pytorch", "threads": args.threads,
        "omp_wait_policy": args.omp_wait_policy, "steps": args.steps,
        "timed_steps": len(timed), "seq_len": S, "micro_batch": B,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step * len(timed) / sum(timed),
        "tokens_per_s_median": tokens_per_step / (median_ms / 1e3),
        "step_ms_median": median_ms, "step_ms_min": min(step_ms), "step_ms_max": max(step_ms),
        "first_loss": losses[0], "loss": losses[-1], "train_bpb": losses[-1] / math.log(2),
        "num_parameters": num_parameters, "lr": args.lr, "seed": args.seed, "init": args.init,
        "torch": torch.__version__, "blas": blas_info(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
