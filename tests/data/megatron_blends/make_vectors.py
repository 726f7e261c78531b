#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Makes blends.json and the two datasets beside it with Megatron-Core's own code (run once; the
tests only read the output).

  MEGATRON_ROOT=path/to/Megatron-LM python3 make_vectors.py

Needs a Megatron-LM work tree (tested at d98e8a64ddf34856e74b24714e3bedb2f5a39553) with its
compiled `megatron/core/datasets/helpers_cpp`, torch and numpy; torch.distributed is not started.

A is tests/data/megatron_data/data/bytes_doc_u16 (600 documents of byte tokens, uint16). This
writes, with Megatron's IndexedDatasetBuilder:
  reversed_odd_u16  A's documents 599, 597, ..., 1 (uint16)
  first_100_i32     A's first 100 documents as int32 tokens
and, for each case below, BlendedMegatronDatasetBuilder's datasets: each built split's length and
its samples 0..19 and its last 5 (GPTDataset._query_document_sample_shuffle_indices's text,
through BlendedDataset's indices where blended).
"""
import json
import os
import shutil
import sys
import tempfile

import numpy

sys.path.insert(0, os.environ.get("MEGATRON_ROOT", "/tmp/megatron-lm"))
from megatron.core.datasets.blended_dataset import BlendedDataset  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import (  # noqa: E402
    BlendedMegatronDatasetBuilder)
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig  # noqa: E402
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder  # noqa
from megatron.core.datasets.utils import get_blend_from_list  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
a_prefix = os.path.join(here, "..", "megatron_data", "data", "bytes_doc_u16")
a = IndexedDataset(a_prefix)
paths = {"A": a_prefix}
for name, documents, dtype in [("reversed_odd_u16", range(599, 0, -2), numpy.uint16),
                               ("first_100_i32", range(100), numpy.int32)]:
    prefix = os.path.join(here, name)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for d in documents:
        builder.add_document(numpy.array(a[d], dtype=numpy.int64), [len(a[d])])
    builder.finalize(prefix + ".idx")
    paths["B" if dtype == numpy.uint16 else "C"] = prefix


class Tokenizer:  # what GPTDataset and its cache's hash read of a tokenizer
    vocab_size, eod, eos, pad = 257, 256, 256, -1
    unique_identifiers = {"class": "bytes", "vocab_size": 257, "eod": 256, "pad": -1}


cases = [
    {"data_path": ["0.3", "A", "0.7", "B"], "split": "90,8,2", "seq_length": 24, "seed": 77,
     "sizes": [500, 60, 9]},
    {"data_path": ["A", "B"], "split": "1", "seq_length": 40, "seed": 5,
     "sizes": [None, None, None]},
    {"data_path": ["A", "B", "C"], "split": "80,20", "seq_length": 16, "seed": 11,
     "sizes": [300, 40, 10]},
    {"data_path": ["1", "A", "2", "B", "0.5", "C"], "split": "90,7,3", "seq_length": 32,
     "seed": 1234, "sizes": [2000, 100, 20]},
    {"data_path": ["1", "A"], "split": "969,30,1", "seq_length": 32, "seed": 1234,
     "sizes": [7000, 100, 10]},
]
for case in cases:
    cache = tempfile.mkdtemp()
    try:
        config = GPTDatasetConfig(
            random_seed=case["seed"], sequence_length=case["seq_length"],
            blend=get_blend_from_list([paths.get(w, w) for w in case["data_path"]]),
            split=case["split"], path_to_cache=cache, tokenizer=Tokenizer(),
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        built = BlendedMegatronDatasetBuilder(GPTDataset, case["sizes"], lambda: True,
                                              config).build()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    case["splits"] = {}
    for name, ds in zip(["train", "valid", "test"], built):
        if ds is None:
            case["splits"][name] = None
            continue

        def text(i):
            if isinstance(ds, BlendedDataset):
                d = ds.datasets[int(ds.dataset_index[i])]
                return d._query_document_sample_shuffle_indices(int(ds.dataset_sample_index[i]))[0]
            return ds._query_document_sample_shuffle_indices(i)[0]

        n = len(ds)
        indices = sorted(set(list(range(min(20, n))) + list(range(max(0, n - 5), n))))
        case["splits"][name] = {
            "len": n, "blended": isinstance(ds, BlendedDataset),
            "samples": [{"index": i, "text": [int(x) for x in text(i)]} for i in indices]}
with open(os.path.join(here, "blends.json"), "w") as f:
    json.dump({"generator": "Megatron-LM d98e8a64 BlendedMegatronDatasetBuilder",
               "datasets": {"A": "../megatron_data/data/bytes_doc_u16", "B": "reversed_odd_u16",
                            "C": "first_100_i32"},
               "cases": cases}, f)
