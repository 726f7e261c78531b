# SPDX-License-Identifier: Apache-2.0
"""Loads torch with a thread count and an OpenMP wait policy, for the peer scripts."""
import os


def load_torch(threads, wait_policy):
    """Gives OpenMP, OpenBLAS and MKL `threads` and the wait policy ("passive":
    OMP_WAIT_POLICY=PASSIVE; "default": OpenMP's own) before torch loads, since they read the
    environment once, then imports torch, sets its thread count and returns the module."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    if wait_policy == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        os.environ.pop("OMP_WAIT_POLICY", None)
    import torch
    torch.set_num_threads(threads)
    return torch
