// indexshare: decode-time paged layouts, byte for byte as the GPU decode kernels read them.
//
// The indexer and top-k produce LOGICAL indices: sequence-local token positions in [0, len), -1
// padded. The decode kernels read a paged cache of PHYSICAL token slots:
//     slot = block_table[b, pos / page] * page + pos % page
// (FlashMLA `flash_mla_with_kvcache` sparse decode takes these slots as `indices`; vLLM's
// `triton_convert_req_index_to_global_index` and FlashMLA's tests/quant.py
// `abs_indices2indices_in_kvcache` compute them). This file builds, for a decode golden set:
//   - a paged layout (block table, cache_seqlens) whose physical blocks are a shuffled, sparse
//     subset of the pool, so an index that was not translated lands on a different token;
//   - the translation logical -> physical;
//   - FlashMLA's V32 FP8 sparse KV cache (656 bytes per token) and its dequantization;
//   - DeepGEMM's paged indexer K cache (`fp8_paged_mqa_logits`, block-first bytes);
//   - the key bounds of the next_n query rows of paged decode.
// Every cache slot that holds no token is filled with NaN codes (FlashMLA's decode tests do the
// same), so a kernel that reads a wrong slot produces NaN instead of a plausible number.
//
// ---- Paged layout ------------------------------------------------------------------------------
//   page                 tokens per physical block (FlashMLA and DeepGEMM use 64)
//   num_blocks           physical blocks in the pool; slots are 0 .. num_blocks * page - 1
//   block_table  int32 [batch, max_blocks]
//                        block_table[b, j] = physical block holding the tokens
//                        [j * page, (j + 1) * page) of sequence b, for j < ceil(len_b / page);
//                        -1 for every column j >= ceil(len_b / page) (no block allocated).
//                        max_blocks = max(1, max_b ceil(len_b / page)). The caches below
//                        require each allocated block to be a distinct block of the pool.
//   cache_seqlens int32 [batch]  = len_b (tokens in the cache for sequence b, the query tokens of
//                        the decode step included)
// Used slots: block_table[b, pos / page] * page + pos % page for 0 <= pos < len_b. Every other
// slot (all slots of the spare blocks, and the tail of each sequence's last block) is unused.
//
// ---- FlashMLA V32 FP8 sparse KV cache (tests/quant.py "V32_FP8Sparse", d_qk = 576) -------------
//   uint8 [num_blocks, page, 1, 656]; the token in slot s occupies bytes [s * 656, s * 656 + 656)
//   of the flat buffer (FlashMLA requires stride(1) == 656, i.e. contiguous pages). Per token:
//     bytes [  0, 512)  512 e4m3fn codes of the latent (NoPE) part kv[0:512], in 4 tiles of 128:
//                       code[i] = e4m3(x[i] / scale[i / 128])  (numerics.h ScaleRule::flashmla_pow2;
//                       the IEEE division is exact; for bf16 inputs |x / scale| <= 448)
//     bytes [512, 528)  4 f32 scales, little endian, scale[t] at byte 512 + 4 t:
//                       scale[t] = 2^ceil(log2(max(amax_t / 448, 1e-4))), amax_t = max |x| over
//                       tile t (a power of two; an all-zero tile gives 2^-13)
//     bytes [528, 656)  64 bf16 RoPE values kv[512:576], little endian, copied (not quantized),
//                       rope[r] at byte 528 + 2 r
//   Unused slots: every latent byte 0x7F (e4m3 NaN), every scale 0x7FC00000 (bytes 00 00 C0 7F),
//   every rope value 0x7FC0 (bytes C0 7F).
//   Dequantization (FlashMLA tests/quant.py `dequantize_k_cache`, the values the reference
//   attention must use): latent[i] = bf16(f32(code[i]) * scale[i / 128]) (f32 multiply, one
//   round to nearest even), rope copied. Because the scales are powers of two the product is
//   exact and the bf16 round is a no-op (an e4m3 value has 4 significant bits), so FlashMLA's SM90
//   kernel path (fp8 -> bf16, then a bf16 multiply by bf16(scale)) and its SM100 path (scale
//   truncated to e8m0) give the same bf16 values.
//
// ---- DeepGEMM paged indexer K cache (`fp8_paged_mqa_logits`, deep_gemm tests) -----------------
//   uint8 [num_blocks, page, 1, D + 4]. Despite the per-token shape, each block of page * (D + 4)
//   bytes is BLOCK-FIRST, not interleaved per token:
//     block base B = blk * page * (D + 4)
//     bytes [B + off * D, B + off * D + D)          D e4m3fn codes of the token at offset off
//     bytes [B + page * D + 4 off, ... + 4)         its f32 scale, little endian
//   Unused slots: codes 0x7F, scale 0x7FC00000.
//
// ---- next_n query rows (paged decode, MTP) ------------------------------------------------------
//   A decode step of sequence b has next_n query tokens, the last next_n of its context_len
//   tokens: query row t (0 <= t < next_n) sits at position context_len - next_n + t and may use the
//   keys k <= context_len - next_n + t (inclusive; DeepGEMM `fp8_paged_mqa_logits`, vLLM
//   `topKPerRowDecode`: rowEnd = seq_len - next_n + t + 1). Flattened row r = b * next_n + t.
//
// All functions throw indexshare::Error on malformed input (message names the argument).
#pragma once

#include <cstdint>
#include <vector>

#include "ref/tensor.h"

namespace indexshare::paged {

inline constexpr int64_t kFlashMlaDqk = 576;        // [latent 512 | rope 64]
inline constexpr int64_t kFlashMlaLatent = 512;
inline constexpr int64_t kFlashMlaRope = 64;
inline constexpr int64_t kFlashMlaTile = 128;
inline constexpr int64_t kFlashMlaTokenBytes = 656;  // 512 + 4 * 4 + 64 * 2
inline constexpr int64_t kFlashMlaScaleOffset = 512;
inline constexpr int64_t kFlashMlaRopeOffset = 528;
inline constexpr uint8_t kE4m3NanCode = 0x7F;
inline constexpr uint32_t kF32NanBits = 0x7FC00000u;
inline constexpr uint16_t kBf16NanBits = 0x7FC0u;

struct PagedLayout {
  int64_t page = 64;
  Tensor<int32_t> block_table;    // [batch, max_blocks], -1 beyond each sequence's blocks
  Tensor<int32_t> cache_seqlens;  // [batch]
  int64_t num_blocks = 0;         // physical blocks in the pool

  int64_t batch() const { return cache_seqlens.numel(); }
  int64_t max_blocks() const { return block_table.rank() == 2 ? block_table.dim(1) : 0; }
};

// A layout for sequences of the given lengths (each >= 0) and page size (>= 1).
// Pool: used = sum_b ceil(len_b / page) blocks plus spare = 1 + used / 4 unused blocks, so
// num_blocks = used + spare. The physical blocks are a Fisher-Yates permutation of
// [0, num_blocks) drawn from Xoshiro256(seed ^ stream_tag("paged.block_table")) (exact integer
// draws, no std distributions); logical block (b, j), taken in order b then j, gets the next
// entry of the permutation, and the remaining entries are the spare blocks. If the first
// allocated block would be physical block 0 it is swapped with the last (spare) entry, so
// physical != logical for sequence 0's first token (the permutation can never be the identity
// on the used blocks). Requires num_blocks * page <= INT32_MAX (slots are int32).
PagedLayout make_layout(const std::vector<int64_t>& seqlens, int64_t page, uint64_t seed);

// The physical slot of sequence-local position pos of sequence b:
//   block_table[b, pos / page] * page + pos % page,
// and -1 when pos < 0, pos / page >= max_blocks, or the block-table entry is negative (vLLM
// `triton_convert_req_index_to_global_index` semantics). A position in an allocated block but
// >= cache_seqlens[b] maps to its (unused, NaN-filled) slot, as in vLLM. Throws for b outside
// [0, batch).
int32_t physical_index(const PagedLayout& layout, int64_t batch, int64_t pos);

// logical int32 [batch, s_q, topk] (sequence-local positions, -1 padded; e.g. ref::topk output
// of shape [batch * next_n, topk] with the shape relabelled) -> physical int32 [batch, s_q, topk]
// with physical_index applied elementwise (-1 stays -1). The result is FlashMLA sparse decode's
// `indices`.
Tensor<int32_t> logical_to_physical(const PagedLayout& layout, const Tensor<int32_t>& logical);

// FlashMLA V32 FP8 KV cache. kv_per_seq[b]: bf16 [cache_seqlens[b], 1, 576], all finite.
// Returns uint8 [num_blocks, page, 1, 656] (layout above), unused slots NaN-filled.
Tensor<uint8_t> flashmla_fp8_cache(const PagedLayout& layout,
                                   const std::vector<Tensor<bf16_t>>& kv_per_seq);

// Inverse of the cache: uint8 [num_blocks, page, 1, 656] -> bf16 [num_blocks * page, 1, 576],
// row s = dequantized token of slot s (formula above). Unused slots give all-NaN rows. The
// result is the flat `kv` that ref::sparse_attention reads with physical indices.
Tensor<bf16_t> flashmla_dequant(const Tensor<uint8_t>& cache);

// Quantize-then-dequantize of logical rows: bf16 [len, 1, 576] -> bf16 [len, 1, 576], row i equal
// to the row flashmla_dequant gives for that token's slot. This is FlashMLA's
// "quant_and_dequant" KV: the reference attention of a decode golden set uses these rows with
// logical indices (or the flat dequantized cache with physical indices; both give the same
// result).
Tensor<bf16_t> flashmla_quant_dequant(const Tensor<bf16_t>& kv);

// DeepGEMM paged indexer K cache. k_per_seq[b]: e4m3 [cache_seqlens[b], D] (no NaN codes),
// k_scale_per_seq[b]: f32 [cache_seqlens[b]] (finite), D >= 1. Returns uint8
// [num_blocks, page, 1, D + 4] in the block-first layout above, unused slots NaN-filled.
Tensor<uint8_t> deepgemm_index_cache(const PagedLayout& layout,
                                     const std::vector<Tensor<e4m3_t>>& k_per_seq,
                                     const std::vector<Tensor<float>>& k_scale_per_seq, int64_t D);

// Inverse reader of deepgemm_index_cache: per physical slot s, k[s, :] and scale[s]
// (unused slots: codes 0x7F and NaN scales).
struct IndexCacheRows {
  Tensor<e4m3_t> k;     // [num_blocks * page, D]
  Tensor<float> scale;  // [num_blocks * page]
};
IndexCacheRows deepgemm_index_read(const Tensor<uint8_t>& cache);

// Exclusive end of the keys query row t may use: context_len - next_n + t + 1.
// Requires 1 <= next_n <= context_len and 0 <= t < next_n.
int32_t next_n_key_end(int64_t context_len, int64_t next_n, int64_t t);

// Key windows of the flattened decode query rows r = b * next_n + t, in sequence-local key
// positions: ks[r] = 0, ke[r] = next_n_key_end(context_lens[b], next_n, t). context_lens int32
// [batch] (e.g. layout.cache_seqlens). With logits [batch * next_n, max_context_len] whose column
// c is key position c of the row's sequence, ref::topk(logits, ks, ke, topk) returns sequence-local
// positions, ready for logical_to_physical after relabelling the shape to [batch, next_n, topk].
struct DecodeBounds {
  Tensor<int32_t> ks;  // [batch * next_n]
  Tensor<int32_t> ke;  // [batch * next_n]
};
DecodeBounds decode_ks_ke(const Tensor<int32_t>& context_lens, int64_t next_n);

}  // namespace indexshare::paged
