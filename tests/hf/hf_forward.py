#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An independent forward of three Hugging Face architectures, in numpy (float64), written from
their definitions in transformers (MixtralForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM),
to check megamoe's conversions against.

  hf_forward.py compare --model DIR --logits FILE [--fault F] [--tolerance T]
      loads the folder DIR (config.json, safetensors with or without an index, F32/BF16/F16),
      runs the windows FILE holds (megamoe-train --logits-out: tokens I32 [N, S], logits F32
      [N, S, V]) and exits 0 when max |ours - megamoe's| / max |megamoe's| <= T (default 1e-5)
      in every window. --fault plants a conversion mistake first: gate_up_swap (every expert's
      gate and up swapped), expert_shift (expert 0's gate rows rolled by one in every MoE layer)
      or rope_layout (the other RoPE pairing: interleaved for Mixtral and Qwen3, halves for
      DeepSeek-V3).
  hf_forward.py random --like CONFIG --out DIR [--seed K] [--dtype bf16|f16|f32] [--shard-bytes B]
      writes a folder of CONFIG's architecture and sizes with random weights, sharded with an
      index above B bytes (default: two files at least).
  hf_forward.py same-tensors A B [--bf16]
      exits 0 when the safetensors files A and B hold the same tensors (Adam's moments left out)
      with the same bytes (with --bf16: A's values rounded to BF16 are B's).

Only Debian's python3-numpy is needed.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# --- safetensors --------------------------------------------------------------------------------

_DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2),
           "F64": (np.float64, 8), "I32": (np.int32, 4), "I64": (np.int64, 8)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        kind, _ = _DTYPES[t["dtype"]]
        begin, end = t["data_offsets"]
        a = np.frombuffer(data[base + begin:base + end], dtype=kind).reshape(t["shape"])
        if t["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a
    return out


def write_safetensors(path, tensors, dtype):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "BF16":
            b = (round_to_bf16(a).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        elif dtype == "F16":
            b = a.astype(np.float16).tobytes()
        else:
            b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def read_folder(path):
    config = json.load(open(os.path.join(path, "config.json")))
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    weights = {}
    for f in files:
        for name, a in read_safetensors(os.path.join(path, f)).items():
            weights[name] = a.astype(np.float64)
    return config, weights


# --- the architectures' forward -----------------------------------------------------------------

def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def rotate_halves(x, theta, positions):
    """RoPE on the last axis, rotate-half form: pairs (i, i + d/2)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = positions[:, None] * inv_freq[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    rotated = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * cos + rotated * sin


def deinterleave(x):
    """transformers' apply_rotary_pos_emb_interleave: (u0, u1, u2, u3, ...) -> (u0, u2, ..., u1, u3, ...)."""
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


def attention_core(q, k, v, scale):
    """q [S, n, dq], k [S, n, dq], v [S, n, dv]: causal softmax attention, out [S, n * dv]."""
    s = q.shape[0]
    scores = np.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores + np.triu(np.full((s, s), -np.inf), 1)[None]
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", probs, v).reshape(s, -1)


def mlp(x, gate, up, down):
    return (silu(x @ gate.T) * (x @ up.T)) @ down.T


class Model:
    def __init__(self, config, w, fault=None):
        self.c, self.w, self.fault = config, w, fault
        t = config.get("model_type")
        self.arch = {"mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3"}[t]
        self.eps = config["rms_norm_eps"]
        self.theta = config.get("rope_theta", 10000.0)
        self.plant()

    def is_moe(self, i):
        c = self.c
        if self.arch == "mixtral":
            return True
        if self.arch == "qwen3_moe":
            return i not in c.get("mlp_only_layers", []) and (i + 1) % c.get("decoder_sparse_step", 1) == 0
        return i >= c.get("first_k_dense_replace", 0)

    def expert_names(self, i):
        block = "model.layers.%d.%s." % (i, "block_sparse_moe" if self.arch == "mixtral" else "mlp")
        names = ("w1", "w3", "w2") if self.arch == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        return block, names

    def plant(self):
        if self.fault in (None, "rope_layout"):
            return
        for i in range(self.c["num_hidden_layers"]):
            if not self.is_moe(i):
                continue
            block, (g, u, _) = self.expert_names(i)
            experts = self.c.get("num_local_experts") or self.c.get("num_experts") or self.c.get("n_routed_experts")
            if self.fault == "gate_up_swap":
                for e in range(experts):
                    a, b = "%sexperts.%d.%s.weight" % (block, e, g), "%sexperts.%d.%s.weight" % (block, e, u)
                    self.w[a], self.w[b] = self.w[b], self.w[a]
            elif self.fault == "expert_shift":
                name = "%sexperts.0.%s.weight" % (block, g)
                self.w[name] = np.roll(self.w[name], 1, axis=0)
            else:
                raise SystemExit("unknown fault " + self.fault)

    def rope(self, x, positions, interleaved):
        if self.fault == "rope_layout":
            interleaved = not interleaved
        return rotate_halves(deinterleave(x) if interleaved else x, self.theta, positions)

    def attention(self, i, x, positions):
        c, w, p = self.c, self.w, "model.layers.%d.self_attn." % i
        s, n = x.shape[0], c["num_attention_heads"]
        if self.arch == "deepseek_v3":
            dn, dr, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
            if c.get("q_lora_rank"):
                q = rms_norm(x @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], 1e-6)
                q = q @ w[p + "q_b_proj.weight"].T
            else:
                q = x @ w[p + "q_proj.weight"].T
            q = q.reshape(s, n, dn + dr)
            kv = x @ w[p + "kv_a_proj_with_mqa.weight"].T
            latent, k_rot = kv[:, :c["kv_lora_rank"]], kv[:, c["kv_lora_rank"]:]
            kv = rms_norm(latent, w[p + "kv_a_layernorm.weight"], 1e-6) @ w[p + "kv_b_proj.weight"].T
            kv = kv.reshape(s, n, dn + dv)
            k_nope, v = kv[..., :dn], kv[..., dn:]
            interleaved = c.get("rope_interleave", True)
            q_rot = self.rope(q[..., dn:].transpose(1, 0, 2), positions, interleaved).transpose(1, 0, 2)
            k_rot = self.rope(k_rot, positions, interleaved)
            queries = np.concatenate([q[..., :dn], q_rot], axis=-1)
            keys = np.concatenate([k_nope, np.broadcast_to(k_rot[:, None, :], (s, n, dr))], axis=-1)
            out = attention_core(queries, keys, v, (dn + dr) ** -0.5)
        else:
            g = c["num_key_value_heads"]
            d = c.get("head_dim") or c["hidden_size"] // n
            q = (x @ w[p + "q_proj.weight"].T).reshape(s, n, d)
            k = (x @ w[p + "k_proj.weight"].T).reshape(s, g, d)
            v = (x @ w[p + "v_proj.weight"].T).reshape(s, g, d)
            if self.arch == "qwen3_moe":
                q = rms_norm(q, w[p + "q_norm.weight"], self.eps)
                k = rms_norm(k, w[p + "k_norm.weight"], self.eps)
            q = self.rope(q.transpose(1, 0, 2), positions, False).transpose(1, 0, 2)
            k = self.rope(k.transpose(1, 0, 2), positions, False).transpose(1, 0, 2)
            k, v = np.repeat(k, n // g, axis=1), np.repeat(v, n // g, axis=1)
            out = attention_core(q, k, v, d ** -0.5)
        return out @ w[p + "o_proj.weight"].T

    def route(self, i, x):
        """The chosen experts [T, k] and their weights [T, k]."""
        c, w = self.c, self.w
        block, _ = self.expert_names(i)
        logits = x @ w[block + "gate.weight"].T
        k = c["num_experts_per_tok"]
        if self.arch == "deepseek_v3":
            scores = 1.0 / (1.0 + np.exp(-logits))
            choice = scores + w[block + "gate.e_score_correction_bias"][None, :]
            experts, groups = choice.shape[1], c.get("n_group", 1)
            grouped = choice.reshape(-1, groups, experts // groups)
            group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)
            chosen_groups = np.argsort(-group_scores, axis=-1, kind="stable")[:, :c.get("topk_group", 1)]
            mask = np.zeros_like(group_scores)
            np.put_along_axis(mask, chosen_groups, 1.0, axis=-1)
            mask = np.repeat(mask, experts // groups, axis=-1)
            choice = np.where(mask > 0, choice, 0.0)
            idx = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
            weights = np.take_along_axis(scores, idx, axis=-1)
            if c.get("norm_topk_prob", True):
                weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
            return idx, weights * c.get("routed_scaling_factor", 1.0)
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = probs / probs.sum(axis=-1, keepdims=True)
        idx = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        weights = np.take_along_axis(probs, idx, axis=-1)
        if self.arch == "mixtral" or c.get("norm_topk_prob", False):
            weights = weights / weights.sum(axis=-1, keepdims=True)
        return idx, weights

    def ffn(self, i, x):
        w, p = self.w, "model.layers.%d.mlp." % i
        if not self.is_moe(i):
            return mlp(x, w[p + "gate_proj.weight"], w[p + "up_proj.weight"], w[p + "down_proj.weight"])
        block, (g, u, dn) = self.expert_names(i)
        idx, weights = self.route(i, x)
        out = np.zeros_like(x)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            e_ = "%sexperts.%d." % (block, e)
            y = mlp(x[rows], w[e_ + g + ".weight"], w[e_ + u + ".weight"], w[e_ + dn + ".weight"])
            np.add.at(out, rows, y * weights[rows, slot][:, None])
        if self.arch == "deepseek_v3":
            s = block + "shared_experts."
            out = out + mlp(x, w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"])
        return out

    def logits(self, tokens):
        w = self.w
        x = w["model.embed_tokens.weight"][tokens]
        positions = np.arange(len(tokens), dtype=np.float64)
        for i in range(self.c["num_hidden_layers"]):
            p = "model.layers.%d." % i
            x = x + self.attention(i, rms_norm(x, w[p + "input_layernorm.weight"], self.eps), positions)
            x = x + self.ffn(i, rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps))
        x = rms_norm(x, w["model.norm.weight"], self.eps)
        head = w["model.embed_tokens.weight"] if "lm_head.weight" not in w else w["lm_head.weight"]
        return x @ head.T


# --- commands -----------------------------------------------------------------------------------

def compare(args):
    config, weights = read_folder(args.model)
    model = Model(config, weights, args.fault)
    saved = read_safetensors(args.logits)
    tokens, expected = saved["tokens"], saved["logits"].astype(np.float64)
    worst = 0.0
    for n in range(tokens.shape[0]):
        ours = model.logits(tokens[n].astype(np.int64))
        if ours.shape != expected[n].shape:
            raise SystemExit("logits of shape %s, megamoe's %s" % (ours.shape, expected[n].shape))
        relative = np.abs(ours - expected[n]).max() / np.abs(expected[n]).max()
        worst = max(worst, relative)
    ok = worst <= args.tolerance
    print("hf_forward %s (%s%s): %d windows of %d tokens, max |difference| / max |logit| = %.3g %s %.3g: %s"
          % (config["architectures"][0], args.model, ", fault " + args.fault if args.fault else "",
             tokens.shape[0], tokens.shape[1], worst, "<=" if ok else ">", args.tolerance,
             "agree" if ok else "DIFFER"))
    return 0 if ok else 1


def random_folder(args):
    config = json.load(open(args.like))
    rng = np.random.default_rng(args.seed)
    arch = config["model_type"]
    H, L, V, n = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"], config["num_attention_heads"]
    t = {}

    def linear(name, rows, cols):
        t[name] = rng.normal(0.0, 0.5 / np.sqrt(cols), (rows, cols))

    def norm(name, size):
        t[name] = 1.0 + 0.1 * rng.normal(size=size)

    def ffn(prefix, width, names=("gate_proj", "up_proj", "down_proj")):
        linear(prefix + names[0] + ".weight", width, H)
        linear(prefix + names[1] + ".weight", width, H)
        linear(prefix + names[2] + ".weight", H, width)

    t["model.embed_tokens.weight"] = rng.normal(0.0, 1.0, (V, H))
    model = Model(config, {}, None)
    mtp = config.get("num_nextn_predict_layers", 0) if arch == "deepseek_v3" else 0
    for i in range(L + mtp):
        p, a = "model.layers.%d." % i, "model.layers.%d.self_attn." % i
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
        if arch == "deepseek_v3":
            dn, dr, dv, rkv = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"], config["kv_lora_rank"]
            if config.get("q_lora_rank"):
                linear(a + "q_a_proj.weight", config["q_lora_rank"], H)
                norm(a + "q_a_layernorm.weight", config["q_lora_rank"])
                linear(a + "q_b_proj.weight", n * (dn + dr), config["q_lora_rank"])
            else:
                linear(a + "q_proj.weight", n * (dn + dr), H)
            linear(a + "kv_a_proj_with_mqa.weight", rkv + dr, H)
            norm(a + "kv_a_layernorm.weight", rkv)
            linear(a + "kv_b_proj.weight", n * (dn + dv), rkv)
            linear(a + "o_proj.weight", H, n * dv)
        else:
            g, d = config["num_key_value_heads"], config.get("head_dim") or H // n
            linear(a + "q_proj.weight", n * d, H)
            linear(a + "k_proj.weight", g * d, H)
            linear(a + "v_proj.weight", g * d, H)
            linear(a + "o_proj.weight", H, n * d)
            if arch == "qwen3_moe":
                norm(a + "q_norm.weight", d)
                norm(a + "k_norm.weight", d)
        if not model.is_moe(i):
            ffn(p + "mlp.", config["intermediate_size"])
            continue
        block, names = model.expert_names(i)
        experts = config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts")
        width = config.get("moe_intermediate_size") or config["intermediate_size"]
        linear(block + "gate.weight", experts, H)
        for e in range(experts):
            ffn("%sexperts.%d." % (block, e), width, names)
        if arch == "deepseek_v3":
            t[block + "gate.e_score_correction_bias"] = 0.01 * rng.normal(size=experts)
            ffn(block + "shared_experts.", width * config["n_shared_experts"])
    norm("model.norm.weight", H)
    linear("lm_head.weight", V, H)
    for i in range(L, L + mtp):  # DeepSeek-V3's multi-token prediction: its layer, its parts
        p = "model.layers.%d." % i
        t[p + "embed_tokens.weight"] = t["model.embed_tokens.weight"]
        norm(p + "enorm.weight", H)
        norm(p + "hnorm.weight", H)
        linear(p + "eh_proj.weight", H, 2 * H)
        norm(p + "shared_head.norm.weight", H)
        t[p + "shared_head.head.weight"] = t["lm_head.weight"]
    config["torch_dtype"] = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[args.dtype]
    os.makedirs(args.out, exist_ok=True)
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    names = list(t)
    total = sum(t[x].size for x in names) * (4 if args.dtype == "F32" else 2)
    shard = args.shard_bytes or (total + 1) // 2
    shards, size = [[]], 0
    for x in names:
        b = t[x].size * (4 if args.dtype == "F32" else 2)
        if shards[-1] and size + b > shard:
            shards.append([])
            size = 0
        shards[-1].append(x)
        size += b
    weight_map = {}
    for s, part in enumerate(shards):
        file = "model-%05d-of-%05d.safetensors" % (s + 1, len(shards))
        write_safetensors(os.path.join(args.out, file), {x: t[x] for x in part}, args.dtype)
        weight_map.update({x: file for x in part})
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(args.out, "model.safetensors.index.json"), "w"), indent=2)
    print("hf_forward: %s with random weights (%s, %d files) in %s" % (config["architectures"][0], args.dtype, len(shards), args.out))
    return 0


def round_to_bf16(a):
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def same_tensors(args):
    a, b = read_safetensors(args.a), read_safetensors(args.b)
    if args.bf16:  # A's values rounded to BF16 (nearest even) must be B's
        a = {k: round_to_bf16(v) if v.dtype == np.float32 else v for k, v in a.items()}
    ka = {k for k in a if not k.startswith("optimizer.")}
    kb = {k for k in b if not k.startswith("optimizer.")}
    differ = sorted(k for k in ka & kb if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes())
    ok = ka == kb and not differ
    print("hf_forward same-tensors: %d and %d tensors, %d only in %s, %d only in %s, %d differ%s: %s"
          % (len(ka), len(kb), len(ka - kb), args.a, len(kb - ka), args.b, len(differ),
             (" (" + ", ".join(differ[:3]) + ")") if differ else "", "same" if ok else "DIFFERENT"))
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--model", required=True)
    c.add_argument("--logits", required=True)
    c.add_argument("--fault", choices=["gate_up_swap", "expert_shift", "rope_layout"])
    c.add_argument("--tolerance", type=float, default=1e-5)
    r = sub.add_parser("random")
    r.add_argument("--like", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--dtype", choices=["BF16", "F16", "F32"], default="BF16")
    r.add_argument("--shard-bytes", type=int, default=0)
    s = sub.add_parser("same-tensors")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--bf16", action="store_true", help="compare A rounded to BF16 with B")
    args = parser.parse_args()
    return {"compare": compare, "random": random_folder, "same-tensors": same_tensors}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
