#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cross-checks megamoe's Hugging Face conversions with transformers itself (a PyPI package, in a
virtual environment: pip install torch transformers; the tests use tests/hf/hf_forward.py, which
needs only Debian's numpy).

  hf_transformers.py compare --model DIR --logits FILE
      AutoModelForCausalLM.from_pretrained(DIR) in float32 on the windows of FILE
      (megamoe-train --logits-out) against megamoe's logits: max |difference| / max |logit|.
  hf_transformers.py write --like DIR --out DIR [--seed K]
      a model of DIR's config.json with random weights (norms and DeepSeek-V3's expert bias
      perturbed too), saved by save_pretrained for megamoe-checkpoint import --format hf.
"""
import argparse
import os
import sys

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "hf"))
import hf_forward  # noqa: E402  (its safetensors reader)


def compare(args):
    saved = hf_forward.read_safetensors(args.logits)
    tokens, expected = saved["tokens"], saved["logits"].astype(np.float64)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    worst = 0.0
    with torch.no_grad():
        for n in range(tokens.shape[0]):
            ids = torch.tensor(tokens[n:n + 1].astype(np.int64))
            ours = model(ids).logits[0].double().numpy()
            worst = max(worst, np.abs(ours - expected[n]).max() / np.abs(expected[n]).max())
    print("transformers %s: %s, %d windows: max |difference| / max |logit| = %.3g"
          % (type(model).__name__, args.model, tokens.shape[0], worst))
    return 0 if worst <= args.tolerance else 1


def write(args):
    config = AutoConfig.from_pretrained(args.like)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        for name, b in list(model.named_parameters()) + list(model.named_buffers()):
            if "e_score_correction_bias" in name:
                b.copy_(0.01 * torch.randn_like(b))
    model.save_pretrained(args.out)
    print("transformers: %s with random weights in %s" % (type(model).__name__, args.out))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--model", required=True)
    c.add_argument("--logits", required=True)
    c.add_argument("--tolerance", type=float, default=1e-5)
    w = sub.add_parser("write")
    w.add_argument("--like", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    return {"compare": compare, "write": write}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
