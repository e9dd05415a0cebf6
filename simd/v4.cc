// indexshare simd/: DeepSeek-V4's compressor (ref/v4/compressor.h), bit-identical to ref::v4::compress.
//
// ref computes each channel c of an entry independently: z_j = f32(gate + bias), the max of the z_j,
// e_j = exp_portable(double(z_j) - max), their sum over ascending slots j, p_j = f32(e_j / sum),
// the pooled value f32(sum over ascending j of double(p_j) * double(kv_j)). Here each double lane is
// one channel and performs exactly those operations in that order: the f32 add in f32 lanes, the max
// (no NaN: check_compressor_inputs refuses non-finite gates and biases), ExpPortable (simd/exp-inl.h,
// ref's exp bit for bit), a double divide demoted to f32 (round to nearest even, as float(double)),
// a double multiply (exact: f32 x f32) and add. Channels past the last whole vector take the same
// scalar steps as ref. The RMSNorm and the RoPE of each entry are ref's functions on the pooled row.
// The hf_bf16 rounding runs ref's per-window sequence (compress_window) over windows in parallel.
// OpenMP splits over windows (independent entries).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd/v4.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "simd/exp-inl.h"

#include "hwy/aligned_allocator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/v4/compressor.h"
#include "simd/simd.h"

#ifndef INDEXSHARE_SIMD_V4_SLOT_
#define INDEXSHARE_SIMD_V4_SLOT_
namespace indexshare::simd::v4detail {
struct Slot {
  const float *kv, *gate, *bias;  // row pointers at the slot's column offset
};
}  // namespace indexshare::simd::v4detail
#endif

HWY_BEFORE_NAMESPACE();
namespace indexshare::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using v4detail::Slot;

// Pooled channel c over the slots, scalar: ref's operations.
inline float PooledScalar(const std::vector<Slot>& slots, int64_t c, std::vector<float>& z, std::vector<double>& e) {
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < slots.size(); ++j) {
    z[j] = slots[j].gate[c] + slots[j].bias[c];
    mx = std::max(mx, double(z[j]));
  }
  double sum = 0.0;
  for (size_t j = 0; j < slots.size(); ++j) {
    e[j] = indexshare::exp_portable(double(z[j]) - mx);
    sum += e[j];
  }
  double acc = 0.0;
  for (size_t j = 0; j < slots.size(); ++j) acc += double(float(e[j] / sum)) * double(slots[j].kv[c]);
  return float(acc);
}

// The pooled row of one window (D channels) into pooled[0, D).
void PooledRow(const Slot* slot_ptr, int64_t n_slots, int64_t D, float* pooled) {
  const hn::ScalableTag<double> d;
  const hn::Rebind<float, decltype(d)> df;
  const int64_t N = int64_t(hn::Lanes(d));
  const std::vector<Slot> slots(slot_ptr, slot_ptr + n_slots);
  const auto ev = hwy::AllocateAligned<double>(size_t(n_slots * N));
  int64_t c = 0;
  for (; c + N <= D; c += N) {
    auto mx = hn::Set(d, -std::numeric_limits<double>::infinity());
    for (int64_t j = 0; j < n_slots; ++j) {
      const auto zf = hn::Add(hn::LoadU(df, slots[size_t(j)].gate + c), hn::LoadU(df, slots[size_t(j)].bias + c));
      const auto z = hn::PromoteTo(d, zf);
      hn::Store(z, d, ev.get() + j * N);
      mx = hn::Max(mx, z);
    }
    auto sum = hn::Zero(d);
    for (int64_t j = 0; j < n_slots; ++j) {
      const auto e = ExpPortable(d, hn::Sub(hn::Load(d, ev.get() + j * N), mx));
      hn::Store(e, d, ev.get() + j * N);
      sum = hn::Add(sum, e);
    }
    auto acc = hn::Zero(d);
    for (int64_t j = 0; j < n_slots; ++j) {
      const auto p = hn::PromoteTo(d, hn::DemoteTo(df, hn::Div(hn::Load(d, ev.get() + j * N), sum)));
      acc = hn::Add(acc, hn::Mul(p, hn::PromoteTo(d, hn::LoadU(df, slots[size_t(j)].kv + c))));
    }
    hn::StoreU(hn::DemoteTo(df, acc), df, pooled + c);
  }
  std::vector<float> z(static_cast<size_t>(n_slots));
  std::vector<double> e(static_cast<size_t>(n_slots));
  for (; c < D; ++c) pooled[c] = PooledScalar(slots, c, z, e);
}

}  // namespace indexshare::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace indexshare::simd {

HWY_EXPORT(PooledRow);

Tensor<float> v4_compress(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& position_bias,
                          const Tensor<float>& norm_weight, const ref::v4::CompressorParams& p) {
  ref::v4::check_compressor_inputs(kv, gate, position_bias, norm_weight, p);
  const int64_t m = p.ratio, D = norm_weight.dim(0), width = kv.dim(1), n_w = kv.dim(0) / m;
  const std::vector<float> freq = ref::v4::inv_freq(p.rope);
  Tensor<float> out({n_w, D});
  if (p.rounding != ref::v4::CompressorRounding::f32) {
    // transformers' bf16 rounding points: ref's scalar sequence per window, windows in parallel.
#pragma omp parallel for schedule(dynamic, 1) if (n_w >= 2)
    for (int64_t w = 0; w < n_w; ++w)
      ref::v4::compress_window(kv, gate, position_bias, norm_weight, p, freq, w, out.ptr() + w * D);
    return out;
  }
#pragma omp parallel for schedule(dynamic, 1) if (n_w >= 2)
  for (int64_t w = 0; w < n_w; ++w) {
    // ref's slots: the previous window's Ca (overlap, w > 0), then this window's Cb (or tokens).
    std::vector<v4detail::Slot> slots;
    auto add = [&](int64_t tok, int64_t col0, int64_t row) {
      slots.push_back({kv.ptr() + tok * width + col0, gate.ptr() + tok * width + col0,
                       position_bias.ptr() + row * width + col0});
    };
    if (p.overlap && w > 0)
      for (int64_t j = 0; j < m; ++j) add((w - 1) * m + j, 0, j);
    for (int64_t j = 0; j < m; ++j) add(w * m + j, p.overlap ? D : 0, j);
    std::vector<float> pooled(static_cast<size_t>(D));
    HWY_DYNAMIC_DISPATCH(PooledRow)(slots.data(), int64_t(slots.size()), D, pooled.data());
    float* row = out.ptr() + w * D;
    ref::rms_norm(pooled.data(), row, D, norm_weight.ptr(), p.eps);
    ref::apply_rope(row + (D - p.rope.rope_dim), p.rope.rope_dim, w * m, freq, ref::RopeLayout::interleaved);
  }
  return out;
}

}  // namespace indexshare::simd
#endif  // HWY_ONCE
