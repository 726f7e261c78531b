// SPDX-License-Identifier: Apache-2.0
// megamoe/compiled_once_tokenizers.cpp — the tokenizers' and preprocessing's definitions, compiled
// once per program under MEGAMOE_SEPARATE_COMPILATION (core/compiled_once.hpp). A unit of its own:
// its object is taken from the static library only by programs that tokenize, and it is the one
// that needs ICU's and SentencePiece's headers.
#if !defined(MEGAMOE_SEPARATE_COMPILATION)
#error "megamoe/compiled_once_tokenizers.cpp is compiled with MEGAMOE_SEPARATE_COMPILATION defined"
#endif

#include <megamoe/core/compiled_once.hpp>

#include <megamoe/data/bpe_tokenizer.ipp>
#include <megamoe/data/preprocess.ipp>
#include <megamoe/data/sentencepiece_tokenizer.ipp>
#include <megamoe/data/tokenizer.ipp>
