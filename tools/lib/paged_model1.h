// indexshare: FlashMLA's MODEL1 (DeepSeek-V4) FP8 sparse KV cache, byte for byte, and the two-scope
// sparse decode reference (`flash_mla_with_kvcache` with `extra_k_cache`).
//
// ---- MODEL1 FP8 sparse KV cache (FlashMLA tests/quant.py "MODEL1_FP8Sparse", d_qk = 512) --------
// A token is kv[0:512] = [NoPE 448 | RoPE 64] (one kv head, K = V). Per physical block of B tokens
// (B = the scope's page_block_size), with the block starting at byte blk * block_bytes(B):
//     byte 576 t + [  0, 448)  token t's 448 e4m3fn NoPE codes, in 7 tiles of 64:
//                              code[i] = e4m3(x[i] / scale[i / 64])
//     byte 576 t + [448, 576)  token t's 64 bf16 RoPE values kv[448:512], little endian, copied
//                              (not quantized): rope[r] at byte 576 t + 448 + 2 r
//     byte 576 B + 8 t + [0, 7) token t's 7 e8m0 scales (ue8m0: value 2^(byte - 127), 0xFF NaN)
//     byte 576 B + 8 t + 7      one pad byte (0x00 in a used slot; FlashMLA never reads it)
//     bytes [584 B, block_bytes(B))  the block's tail padding (0x7F here)
//   block_bytes(B) = ceil(584 B / 576) * 576, e.g. B = 256: 149504 + 0 = 149760 (exact: 584*256 =
//   149504 -> 260 * 576 = 149760); B = 64: 37376 -> 65 * 576 = 37440; B = 2: 1168 -> 1728.
//   Scale rule (numerics.h ScaleRule::flashmla_pow2, tile 64): scale = 2^ceil(log2(max(amax / 448,
//   1e-4))) over the tile's 64 values, stored as its e8m0 exponent byte (biased 127; an all-zero tile
//   gives 2^-13, byte 114).
//
//   The kernel's tensor: FlashMLA allocates [num_blocks, block_bytes] and hands the kernel the
//   VIEW [num_blocks, B, 1, 584] with strides (block_bytes, 584, 584, 1) (bytes), made from the
//   first 584 B bytes of each block. The view's element [b, t, 0, i] is byte
//   b * block_bytes + 584 t + i, which is NOT token t's i-th byte (token t's data starts at 576 t;
//   its scales sit in the footer). The golden set stores the real bytes as U8 [num_blocks,
//   block_bytes]; a torch caller builds the view with
//     cache.as_strided((num_blocks, B, 1, 584), (block_bytes, 584, 584, 1)).
//
//   Unused slots (NaN-poisoned, as FlashMLA's decode tests poison unused kv): NoPE bytes 0x7F
//   (e4m3 NaN), RoPE values 0x7FC0 (bytes C0 7F, bf16 NaN), the 7 scale bytes 0xFF (e8m0 NaN) and
//   the pad byte 0xFF.
//
//   Dequantization (FlashMLA tests/quant.py dequantize_k_cache, the values the reference attention
//   uses): nope[i] = bf16(bf16(code[i]) * bf16(e8m0(scale[i / 64]))), rope copied. In f32:
//   f32_to_bf16(e4m3_to_f32(code) * 2^(byte - 127)). e4m3 -> bf16 and e8m0 -> bf16 are exact (2^-127
//   is a bf16 subnormal), the f32 product of a 4-significant-bit value and a power of two is exact,
//   so the only rounding is the final one to bf16 (torch's bf16 multiply), and it is a no-op unless
//   the product falls below bf16's normal range (2^-126), impossible for bytes this quantizer writes
//   (scale >= 2^-13, |code| >= 2^-9). So the dequantized value is exactly code * scale, and the
//   SM90 kernel path (fp8 -> bf16, bf16 multiply) gives the same bf16 values.
//
// ---- Two-scope sparse decode (FlashMLA tests/ref.py ref_sparse_attn_decode) -----------------------
//   q bf16 [b * s_q, h_q, 512] (the kernel's [b, s_q, h_q, 512]); per scope (main: k_cache, indices,
//   topk_length; extra: extra_k_cache, extra_indices_in_kvcache, extra_topk_length, with its own
//   block size) physical slot indices int32 [b, s_q, topk] and an optional topk_length int32 [b].
//   Slot j of scope X in row (b, t) is invalid when indices[b, t, j] == -1 or j >= topk_length[b];
//   every valid slot of both scopes joins ONE softmax over (main slots, then extra slots), with the
//   per-head sink [h_q]; NaN in a gathered kv row is replaced by 0 (FlashMLA's ref does this so that
//   invalid, clamped slots cannot poison P.V); V = all 512 columns; lse natural log WITHOUT the sink;
//   out *= 1 / (1 + exp(sink - lse)); a row with no valid slot: out 0, lse +inf.
//   Mapping onto ref::sparse_attention (ref/attention.h), so ref/ and simd/ give the same bits:
//     kv_cat  [S_main + S_extra, 1, 512] = dequant(main cache) slots 0..S_main-1, then
//             dequant(extra cache) slots (S_main = num_blocks * B of the main scope), NaN -> +0
//     idx_cat [b * s_q, 1, topk + extra_topk]: main slot j -> indices[b, t, j] (or -1 if invalid),
//             extra slot j -> S_main + extra_indices[b, t, j] (or -1 if invalid)
//   and sparse_attention(q, kv_cat, idx_cat, sm_scale, 512, nullptr, sink). Its lse is [b * s_q,
//   h_q]; the kernel returns it as [b, h_q, s_q] (a transposed view).
//   An index other than -1 outside [0, num_blocks * B) is an input error (FlashMLA's ref would
//   clamp a negative one to slot 0 and fail on a too large one).
//
// All functions throw indexshare::Error on malformed input, naming the tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/attention.h"
#include "ref/kernels.h"
#include "ref/tensor.h"
#include "tools/lib/paged.h"

namespace indexshare::paged {

inline constexpr int64_t kModel1Dqk = 512;             // [NoPE 448 | RoPE 64]
inline constexpr int64_t kModel1Nope = 448;
inline constexpr int64_t kModel1Rope = 64;
inline constexpr int64_t kModel1Tile = 64;
inline constexpr int64_t kModel1Tiles = 7;              // 448 / 64
inline constexpr int64_t kModel1DataBytes = 576;        // 448 + 64 * 2, token t at 576 t
inline constexpr int64_t kModel1FooterBytes = 8;        // 7 e8m0 scales + 1 pad, at 576 B + 8 t
inline constexpr int64_t kModel1BytesPerToken = 584;    // the view's last dim
inline constexpr int64_t kModel1BlockAlign = 576;
inline constexpr uint8_t kE8m0NanCode = 0xFF;
inline constexpr uint8_t kModel1TailByte = 0x7F;

// ceil(584 B / 576) * 576: the bytes of one block (its stride in the kernel's view). B >= 1.
int64_t model1_block_bytes(int64_t B);

// The kernel's view of a cache of num_blocks blocks of B tokens: shape [num_blocks, B, 1, 584]
// and strides in bytes (block_bytes(B), 584, 584, 1).
struct Model1View {
  std::vector<int64_t> shape, strides;
};
Model1View model1_view(int64_t num_blocks, int64_t B);

// The cache of a paged layout (tools/lib/paged.h; B = layout.page). kv_per_seq[b]: bf16
// [cache_seqlens[b], 1, 512], all finite. Returns U8 [num_blocks, block_bytes(B)] (the real bytes,
// layout above), unused slots NaN-poisoned. `what` names the cache in errors.
Tensor<uint8_t> model1_fp8_cache(const PagedLayout& layout, const std::vector<Tensor<bf16_t>>& kv_per_seq,
                                 const std::string& what = "model1_fp8_cache");

// Inverse: U8 [num_blocks, block_bytes(B)] -> bf16 [num_blocks * B, 1, 512], row s = the
// dequantized token of slot s (unused slots: all-NaN rows). Error naming `what` when the cache is
// not rank 2 or its row is not block_bytes(B) bytes.
Tensor<bf16_t> model1_dequant(const Tensor<uint8_t>& cache, int64_t B, const std::string& what);

// Checks a cache against its layout: the size, and that every USED slot (cache_seqlens) holds a
// finite token (no e8m0 0xFF scale, no e4m3 NaN code, no NaN / inf RoPE value) and a 0x00 pad byte.
// Error naming `what`, the block, the token and the field (a corrupted or wrongly written cache).
void model1_check_cache(const Tensor<uint8_t>& cache, const PagedLayout& layout, const std::string& what);

// Quantize-then-dequantize of logical rows: bf16 [len, 1, 512] -> bf16 [len, 1, 512] (each row as
// model1_dequant gives it for that token's slot).
Tensor<bf16_t> model1_quant_dequant(const Tensor<bf16_t>& kv);

// One scope of the two-scope decode.
struct Model1Scope {
  std::string name;              // "k_cache" or "extra_k_cache" (errors name it and its indices)
  Tensor<uint8_t> cache;         // U8 [num_blocks, block_bytes(block)]
  int64_t block = 0;             // page_block_size of this scope
  Tensor<int32_t> indices;       // [b, s_q, topk] physical slots, -1 padded
  Tensor<int32_t> topk_length;   // [b], or empty: every slot
};

// The mapping above: the concatenated dequantized kv and index list.
struct Model1Gathered {
  Tensor<bf16_t> kv;        // [S_main + S_extra, 1, 512], NaN -> +0
  Tensor<int32_t> indices;  // [b * s_q, 1, topk + extra_topk]
  int64_t main_slots = 0;   // S_main: the extra scope's rows start here
};
Model1Gathered model1_gather(const Model1Scope& main, const Model1Scope* extra);

// The two-scope decode: q bf16 [b * s_q, h_q, 512], sink f32 [h_q] or null; extra may be null
// (main only). Computed with kern.sparse_attention (ref's or simd's: the same bits).
ref::AttentionOut model1_decode(const Tensor<bf16_t>& q, const Model1Scope& main, const Model1Scope* extra,
                                float sm_scale, const Tensor<float>* sink, const ref::Kernels& kern = ref::Kernels());

}  // namespace indexshare::paged
