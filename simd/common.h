// indexshare simd/: target-independent pieces shared by the per-target code (plain C++, no
// Highway): problem views passed through the dispatch boundary, the e4m3 decode table, and the
// 64-bit top-k key.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>

#include <omp.h>

#include "ref/numerics.h"
#include "ref/tensor.h"

namespace indexshare::simd {
struct AttentionPhases;  // simd/simd.h
}  // namespace indexshare::simd

namespace indexshare::simd::detail {

// e4m3 code -> exact double value (ref decodes the same way: double(e4m3_to_f32(code))).
inline const double* e4m3_table() {
  static const std::array<double, 256> table = [] {
    std::array<double, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = double(e4m3_to_f32(e4m3_t{uint8_t(c)}));
    return t;
  }();
  return table.data();
}

// bf16 code -> exact double.
inline double bf16_to_double(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return double(f);
}

// The indexer problem as raw pointers (shapes already checked by ref::check_indexer_inputs).
// q [s_q, H, D] and k [s_kv, D] are e4m3 codes (fp8 = true) or f32 values.
struct IndexerView {
  const void* q = nullptr;
  const void* k = nullptr;
  bool fp8 = true;
  bool bf16_out = false;           // each logit rounded once from double to bf16 (ref::fp4::bf16_of)
  const float* k_scale = nullptr;  // [s_kv]
  const float* weights = nullptr;  // [s_q, H]
  const int32_t* ks = nullptr;     // [s_q]
  const int32_t* ke = nullptr;     // [s_q]
  int64_t s_q = 0, H = 0, D = 0, s_kv = 0;
};

// Top-k key: a bigger key is a better (score, index) pair under ref::topk_before.
//   bits 63..32  the score's f32 bits mapped to an unsigned integer with the same order
//                (negative: all bits flipped; positive: sign bit set); -0.0 is first made +0.0
//                because ref treats them as equal scores;
//   bits 31..0   0xFFFFFFFF - local index, so the lower index wins a tie.
// Keys of one row are distinct (distinct indices), so every selection algorithm that keeps the
// k largest keys returns the same set, and sorting it descending gives ref's order.
inline uint64_t topk_key(float score, int64_t local) {
  if (score == 0.0f) score = 0.0f;
  uint32_t b;
  std::memcpy(&b, &score, sizeof b);
  const uint32_t ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t(ordered) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(local));
}
inline int32_t topk_key_local(uint64_t key) {
  return int32_t(0xFFFFFFFFu - uint32_t(key & 0xFFFFFFFFu));
}

// Attention inputs as raw pointers (shapes checked by the wrapper). q [s_q, h_q, d_qk] bf16,
// kv [s_kv, d_qk] bf16 (the single kv head), V = kv[:, :d_v].
struct AttentionView {
  const uint16_t* q = nullptr;
  const uint16_t* kv = nullptr;
  int64_t s_q = 0, h_q = 0, d_qk = 0, s_kv = 0, d_v = 0;
  double sm_scale = 0.0;
  const float* sink = nullptr;  // [h_q] or null
  // Sparse: indices [s_q, topk] (+ optional topk_length [s_q]); dense: ks / ke [s_q].
  const int32_t* indices = nullptr;
  const int32_t* topk_length = nullptr;
  int64_t topk = 0;
  const int32_t* ks = nullptr;
  const int32_t* ke = nullptr;
  bool dense = false;
};

// The view of q, kv, sm_scale, d_v and the sink (shapes checked by the caller); the sparse or dense
// fields are the caller's to set.
inline AttentionView attention_view(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, float sm_scale, int64_t d_v,
                                    const Tensor<float>* attn_sink) {
  static_assert(sizeof(bf16_t) == sizeof(uint16_t));
  AttentionView v;
  v.q = reinterpret_cast<const uint16_t*>(q.ptr());
  v.kv = reinterpret_cast<const uint16_t*>(kv.ptr());
  v.s_q = q.dim(0);
  v.h_q = q.dim(1);
  v.d_qk = q.dim(2);
  v.s_kv = kv.dim(0);
  v.d_v = d_v;
  v.sm_scale = double(sm_scale);
  v.sink = attn_sink ? attn_sink->ptr() : nullptr;
  return v;
}

// The same, with the sparse indices [s_q, 1, topk] and optional topk_length [s_q].
inline AttentionView sparse_view(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                 float sm_scale, int64_t d_v, const Tensor<int32_t>* topk_length, const Tensor<float>* attn_sink) {
  AttentionView v = attention_view(q, kv, sm_scale, d_v, attn_sink);
  v.indices = indices.ptr();
  v.topk = indices.dim(2);
  v.topk_length = topk_length ? topk_length->ptr() : nullptr;
  return v;
}

// Query rows per chunk when s_q rows are spread over `threads` OpenMP threads: at most max_rows,
// fewer for small s_q so that every thread gets about four chunks (outputs are per row, so the
// chunking never changes a bit).
inline int64_t chunk_rows(int64_t s_q, int64_t max_rows, int threads) {
  const int64_t r = s_q / (4 * int64_t(threads));
  return r < 1 ? 1 : r > max_rows ? max_rows : r;
}

// fn(t0, t1) over chunks of query rows, spread over the OpenMP threads (independent outputs).
template <class Fn>
void over_rows(int64_t s_q, int64_t max_chunk, Fn&& fn) {
  const int64_t rows = detail::chunk_rows(s_q, max_chunk, omp_get_max_threads());
  const int64_t chunks = (s_q + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) fn(c * rows, std::min(s_q, (c + 1) * rows));
}

// Phase timing of one chunk of attention rows (see simd::AttentionPhases): a steady_clock read at
// each boundary when on, nothing when off.
struct PhaseClock {
  bool on = false;
  std::chrono::steady_clock::time_point last{};
  void start() {
    if (on) last = std::chrono::steady_clock::now();
  }
  // Adds the seconds since the previous lap (or start) to *slot.
  void lap(double* slot) {
    if (!on) return;
    const auto t = std::chrono::steady_clock::now();
    *slot += std::chrono::duration<double>(t - last).count();
    last = t;
  }
};

}  // namespace indexshare::simd::detail
