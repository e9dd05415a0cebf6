// indexshare: golden sets of kind "decode-model1": FlashMLA's MODEL1 (DeepSeek-V4) two-scope sparse
// decode (`flash_mla_with_kvcache` with `extra_k_cache`) on the MODEL1 FP8 cache
// (tools/lib/paged_model1.h has the bytes and the reference).
//
// What a set holds (one layer, layer 0):
//   main scope  = a sliding window: query row t of sequence i (position len_i - next_n + t) attends
//                 to the W positions pos, pos - 1, ..., pos - W + 1 (slot j = pos - j; -1 below 0),
//                 paged in blocks of `block` tokens (shuffled physical blocks, tools/lib/paged.h);
//                 topk_length[i] = W for even i, W - 32 for odd i (the oldest 32 dropped)
//   extra scope = compressed entries (DeepSeek-V4 CSA): sequence i holds elen_i = elen - 200 i
//                 entries, paged in blocks of `extra_block`; row t may use the first
//                 elen_i - (next_n - 1 - t) of them and selects min(extra_topk, that) distinct ones
//                 (a seeded partial Fisher-Yates, valid slots first, then -1);
//                 extra_topk_length[i] = extra_topk for even i, extra_topk - 64 for odd i
//   values      kv ~ normal / 10 clamped to [-1, 1] (FlashMLA's decode tests), q ~ normal clamped to
//                 [-1, 1], sink ~ normal (per head), all from the project's generator (ref/rng.h);
//                 sm_scale = 512^-0.55 (FlashMLA's decode tests' d_qk^-0.55)
//   sink=         normal (above, the default); strong: the same draw plus ln(win + ek), about a
//                 row's whole mass, so that a kernel dropping the sink moves every output; pinf /
//                 ninf: +inf (every out 0) or -inf (no effect) on every head, as FlashMLA's tests
//   kv=           the kv draw's standard deviation before the clamp (default 0.1, FlashMLA's tests;
//                 kv=1 gives logits of about 0.6 instead of 0.06, where a kernel rounding its q.k
//                 logits to bf16 shows in lse)
//   empty         the last sequence's topk_length and extra_topk_length are 0: its rows have no
//                 valid entry (out 0, lse +inf, max_logits -inf; FlashMLA's empty rows)
// Tensors (names after "layers.0."): the generic attention tensors diff judges (attn.q [b * next_n,
// h_q, 512], attn.kv = the gathered kv_cat [S_main + S_extra, 1, 512], attn.indices = idx_cat
// [b * next_n, 1, W + extra_topk], attn.sink, attn.out, attn.out_bf16, attn.lse, attn.max_logits),
// and the kernel's own inputs: attn.model1.k_cache U8 [num_blocks, block_bytes], attn.model1.indices
// I32 [b, next_n, W], attn.model1.topk_length I32 [b], attn.model1.extra_k_cache,
// attn.model1.extra_indices, attn.model1.extra_topk_length; set-wide block_table, cache_seqlens,
// extra_block_table, extra_cache_seqlens.
//
// The spec's text (the manifest's `problem`, `golden --problem`):
//   model1 b2 nextn2 hq64 len1024 win128 blk256 ek512 eblk64 elen640 seed31 [sink=strong] [kv=1] [empty]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/lib/golden.h"
#include "tools/lib/impl.h"

namespace indexshare::golden {

struct Model1DecodeSpec {
  int64_t b = 2, next_n = 2, h_q = 64;
  int64_t len = 1024, window = 128, block = 256;           // main scope
  int64_t extra_topk = 512, extra_block = 64, extra_len = 640;  // extra scope
  uint64_t seed = 31;
  std::string sink = "normal";  // normal | strong | pinf | ninf
  std::string kv = "0.1";       // the kv draw's standard deviation (a float's text)
  bool empty = false;           // the last sequence's rows have no valid entry
};
bool is_model1_spec(const std::string& text);  // the text starts with the word "model1"
Model1DecodeSpec parse_model1_spec(const std::string& text);  // Error naming the bad token
std::string to_string(const Model1DecodeSpec& s);

// The kernel's constraints (the registry's flashmla-sparse-decode-model1 entry: h_q 64 or 128, topk =
// the window and extra_topk multiples of 64) on a spec, one sentence per violation.
std::vector<std::string> model1_violations(const Model1DecodeSpec& s);

// The set (see above); `replay` is the manifest's command line. impl: the attention's kernels.
GoldenSet build_model1_decode(const Model1DecodeSpec& s, const std::string& replay, Impl impl);

// A decode-model1 set's attn.indices rebuilt from its kernel inputs (model1.indices, extra_indices
// and their lengths, the manifest's model1.main_slots): row b * next_n + t = the window's slots
// j < topk_length[b], then main_slots + the compressed entries' j < extra_topk_length[b], -1 elsewhere.
// Each rule can be broken as a kernel might break it (the judge's hypotheses, calibrate's catalogue).
struct Model1Mapping {
  bool main_length = true, extra_length = true;  // topk_length / extra_topk_length honoured
  bool extra_scope = true;                       // the compressed entries attended at all
  bool extra_offset = true;                      // their slots offset by main_slots (else read in the main cache)
};
Tensor<int32_t> model1_attn_indices(const Loaded& g, const Model1Mapping& m = {});

// The `kernel` block of kernel k (flashmla-sparse-decode-model1) for a set built from s, with the
// kernel's strided views of both caches (shape and byte strides) under "views".
void for_kernel_model1(GoldenSet& set, const kreg::Kernel& k, const Model1DecodeSpec& s);

// golden::read's check of a decode-model1 set (after its tensors' dtypes, shapes and hashes): the
// manifest's `model1` block, each cache's block size, every used slot of both caches a finite token
// (paged::model1_check_cache over block_table / cache_seqlens and their extra_ twins), and attn.kv and
// attn.indices exactly the two scopes' mapping (paged::model1_gather). Error naming the manifest, the
// field or the tensor.
void check_model1_set(const Loaded& g, const std::string& mpath);

// The replay line (without " --out DIR").
std::string model1_replay(const Model1DecodeSpec& s, const std::string& for_kernel, Impl impl);

}  // namespace indexshare::golden
