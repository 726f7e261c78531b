#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Makes the tokenizer test files in this folder (run once; the tests only read its output).

Needs Hugging Face `tokenizers` and `sentencepiece` from PyPI (scripts/setup --bench's virtual
environment, or any other); the build and the tests never run it.

  python3 make_vectors.py /usr/share/games/fortunes

Writes:
  gpt2/vocab.json, gpt2/merges.txt   a byte-level BPE of 600 tokens in the formats of OpenAI's
                                     GPT-2 encoder.json and vocab.bpe, <|endoftext|> included
  gpt2/tokenizer.json                the same BPE as a Hugging Face tokenizer.json
  split_nfc/tokenizer.json           a byte-level BPE behind an NFC normalizer and a Split
                                     pre-tokenizer with Qwen2's pattern, two special tokens
  llama3_like/tokenizer.json, tokenizer_config.json
                                     Llama 3's kind: Split, ignore_merges, a BOS template, an
                                     eos_token, an added token stripping white space around it
  deepseek_like/tokenizer.json       DeepSeek-V3's kind: three Splits before the byte level
  prefix_digits/tokenizer.json       the GPT-2 BPE behind NFKC, single digits and a prefix space
  sentencepiece/bpe.model            a SentencePiece BPE of 700 pieces with byte fallback
  encodings.json                     every tokenizer's ids for the texts below and fortunes
"""
import json
import os
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)
import sentencepiece as spm

here = os.path.dirname(os.path.abspath(__file__))
fortunes = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/games/fortunes"
sources = ["linux", "science", "computers", "people", "wisdom"]
documents = []
for name in sources:
    with open(os.path.join(fortunes, name), encoding="utf-8", errors="replace") as f:
        documents += [d.strip("\n") for d in f.read().split("\n%\n") if d.strip()]
corpus = os.path.join(here, ".corpus.txt")
with open(corpus, "w", encoding="utf-8") as f:
    f.write("\n".join(documents))

texts = [
    "",
    "Hello world",
    " Hello  world ",
    "It's what they've said: we'll see, I'd say, you're right, I'm sure.",
    "IT'S LOUD'S",
    "numbers 1234567 and 3.14159, 2026-11-29",
    "tabs\tand\nnewlines\n\n  indented\r\n",
    "trailing spaces   ",
    "caf\u00e9 na\u00efve cafe\u0301 \u00c5ngstr\u00f6m",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587",
    "emoji \U0001F600\U0001F680 and \u2764\ufe0f",
    "one<|endoftext|>two <|endoftext|> three",
    "<|im_start|>user\nhi<|im_start|>",
    "fill <mask> in, <mask>and  <mask>  twice",
    "\u00bd \uff11\uff12\uff13 \u2460 \ufb01ne 12345678901",
    "x" * 300,
    "!!!??? ... --- ***",
] + documents[:: max(1, len(documents) // 25)][:25]

pattern_gpt2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
pattern_qwen2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
encodings = {"texts": texts, "tokenizers": {}}

# GPT-2's format: byte-level BPE, the GPT-2 pattern, <|endoftext|> the last id (as 50256 is
# GPT-2's) and an added special token.
gpt2 = Tokenizer(models.BPE())
gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
gpt2.decoder = decoders.ByteLevel()
gpt2.train([corpus], trainers.BpeTrainer(
    vocab_size=599, min_frequency=2,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
os.makedirs(os.path.join(here, "gpt2"), exist_ok=True)
gpt2.model.save(os.path.join(here, "gpt2"))
gpt2.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
vocab_path = os.path.join(here, "gpt2", "vocab.json")
with open(vocab_path, encoding="utf-8") as f:
    vocab = json.load(f)
vocab["<|endoftext|>"] = gpt2.token_to_id("<|endoftext|>")
with open(vocab_path, "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
gpt2.save(os.path.join(here, "gpt2", "tokenizer.json"))
encodings["tokenizers"]["gpt2"] = [gpt2.encode(t).ids for t in texts]

# A Qwen2-like tokenizer.json: NFC, a Split pre-tokenizer, byte level without its own regex.
split_nfc = Tokenizer(models.BPE())
split_nfc.normalizer = normalizers.NFC()
split_nfc.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pattern_qwen2), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
split_nfc.decoder = decoders.ByteLevel()
split_nfc.train([corpus], trainers.BpeTrainer(
    vocab_size=700, min_frequency=2, special_tokens=["<|endoftext|>", "<|im_start|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
os.makedirs(os.path.join(here, "split_nfc"), exist_ok=True)
split_nfc.save(os.path.join(here, "split_nfc", "tokenizer.json"))
encodings["tokenizers"]["split_nfc"] = [split_nfc.encode(t).ids for t in texts]
encodings["decoded"] = {
    "gpt2": [gpt2.decode(gpt2.encode(t).ids, skip_special_tokens=False) for t in texts],
    "split_nfc": [split_nfc.decode(split_nfc.encode(t).ids, skip_special_tokens=False)
                  for t in texts]}

# Llama 3's kind: a Split with its pattern, byte level without a regex, merges ignored for whole
# words in the vocabulary, a template adding <|begin_of_text|>, the eos named by
# tokenizer_config.json, and an added token that takes the white space around it.
pattern_llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                  r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
llama3 = Tokenizer(models.BPE(ignore_merges=True))
llama3.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pattern_llama3), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
llama3.decoder = decoders.ByteLevel()
llama3.train([corpus], trainers.BpeTrainer(
    vocab_size=650, min_frequency=2, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
llama3.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True)])
llama3.post_processor = processors.Sequence([
    processors.ByteLevel(trim_offsets=False),
    processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                  special_tokens=[("<|begin_of_text|>",
                                                   llama3.token_to_id("<|begin_of_text|>"))])])
os.makedirs(os.path.join(here, "llama3_like"), exist_ok=True)
llama3.save(os.path.join(here, "llama3_like", "tokenizer.json"))
with open(os.path.join(here, "llama3_like", "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)
encodings["tokenizers"]["llama3_like"] = [llama3.encode(t).ids for t in texts]
encodings["decoded"]["llama3_like"] = [llama3.decode(llama3.encode(t).ids,
                                                     skip_special_tokens=False) for t in texts]
encodings["llama3_like_eod"] = llama3.token_to_id("<|end_of_text|>")

# DeepSeek-V3's kind: three Splits (digits in threes, CJK runs, then its pattern), a prefix
# space and single digits in a third.
deepseek = Tokenizer(models.BPE())
deepseek.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated", invert=False),
    pre_tokenizers.Split(Regex("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
                         behavior="isolated", invert=False),
    pre_tokenizers.Split(Regex(
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
        r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
deepseek.decoder = decoders.ByteLevel()
deepseek.train([corpus], trainers.BpeTrainer(
    vocab_size=640, min_frequency=2, special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
prefixed = Tokenizer(models.BPE.from_file(os.path.join(here, "gpt2", "vocab.json"),
                                          os.path.join(here, "gpt2", "merges.txt")))
prefixed.normalizer = normalizers.NFKC()
prefixed.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Digits(individual_digits=True),
    pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
prefixed.decoder = decoders.ByteLevel()
prefixed.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
for name, t in [("deepseek_like", deepseek), ("prefix_digits", prefixed)]:
    os.makedirs(os.path.join(here, name), exist_ok=True)
    t.save(os.path.join(here, name, "tokenizer.json"))
    encodings["tokenizers"][name] = [t.encode(x).ids for x in texts]
    encodings["decoded"][name] = [t.decode(t.encode(x).ids, skip_special_tokens=False)
                                  for x in texts]

# SentencePiece BPE with byte fallback (Llama's kind).
os.makedirs(os.path.join(here, "sentencepiece"), exist_ok=True)
spm.SentencePieceTrainer.train(
    input=corpus, model_prefix=os.path.join(here, "sentencepiece", "bpe"), vocab_size=700,
    model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=1,
    normalization_rule_name="identity", minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=os.path.join(here, "sentencepiece", "bpe.model"))
encodings["tokenizers"]["sentencepiece"] = [sp.encode(t) for t in texts]
encodings["decoded"]["sentencepiece"] = [sp.decode(sp.encode(t)) for t in texts]
encodings["sentencepiece"] = {"vocab_size": sp.get_piece_size(), "eos": sp.eos_id(),
                              "bos": sp.bos_id(), "pad": sp.pad_id(), "unk": sp.unk_id()}
encodings["gpt2_eod"] = gpt2.token_to_id("<|endoftext|>")
encodings["gpt2_vocab_size"] = gpt2.get_vocab_size()
os.remove(corpus)
os.remove(os.path.join(here, "sentencepiece", "bpe.vocab"))
with open(os.path.join(here, "encodings.json"), "w", encoding="utf-8") as f:
    json.dump(encodings, f, ensure_ascii=True, indent=0)
