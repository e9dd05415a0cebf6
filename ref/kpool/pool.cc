// indexshare: GLM-5.3's pooled indexer keys. The contract is in pool.h.
#include "ref/kpool/pool.h"

#include <algorithm>
#include <cmath>

#include "ref/error.h"
#include "ref/module_ops.h"

namespace indexshare::ref::kpool {

std::string rounding_name(PoolRounding r) { return r == PoolRounding::f32 ? "f32" : "hf-bf16"; }

PoolRounding parse_rounding(const std::string& name) {
  if (name == "f32") return PoolRounding::f32;
  if (name == "hf-bf16") return PoolRounding::hf_bf16;
  throw Error("pool rounding: unknown '" + name + "' (known: f32, hf-bf16)");
}

int64_t complete_pools(int64_t T, int64_t P) {
  require(P >= 1, "pool size P must be >= 1, got " + std::to_string(P));
  require(T >= 0, "key count T must be >= 0, got " + std::to_string(T));
  return T / P;
}

static void require_finite(const Tensor<float>& t, const std::string& what) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t[i]))
      throw Error(what + ": non-finite value at flat element " + std::to_string(i) + " (shape " +
                  shape_str(t.shape) + ")");
}

void check_pool_inputs(const Tensor<float>& k, const Tensor<float>& g, const Tensor<float>& ape) {
  require(k.rank() == 2, "kpool k: expected rank 2 [T, D], got " + shape_str(k.shape));
  require(ape.rank() == 2 && ape.dim(0) >= 1 && ape.dim(1) >= 1,
          "kpool ape: expected [P, D] with P, D >= 1, got " + shape_str(ape.shape));
  require(k.dim(1) == ape.dim(1), "kpool k: D = " + std::to_string(k.dim(1)) + " differs from ape's D = " +
                                      std::to_string(ape.dim(1)));
  require_shape(g, k.shape, "kpool g");
  require_finite(k, "kpool k");
  require_finite(g, "kpool g");
  require_finite(ape, "kpool ape");
}

Tensor<float> pool_logits(const Tensor<float>& g, const Tensor<float>& ape) {
  require(g.rank() == 2, "kpool g: expected rank 2 [T, D], got " + shape_str(g.shape));
  require(ape.rank() == 2 && ape.dim(1) == g.dim(1) && ape.dim(0) >= 1,
          "kpool ape: expected [P, " + std::to_string(g.dim(1)) + "], got " + shape_str(ape.shape));
  const int64_t P = ape.dim(0), D = g.dim(1), n = complete_pools(g.dim(0), P);
  Tensor<float> z({n, P, D});
  for (int64_t p = 0; p < n; ++p)
    for (int64_t j = 0; j < P; ++j)
      for (int64_t d = 0; d < D; ++d) z.at(p, j, d) = g.at(p * P + j, d) + ape.at(j, d);  // one f32 add
  return z;
}

float pool_channel(const float* z, const float* k, int64_t P, int64_t stride, PoolRounding rounding) {
  // The softmax's shift: the largest logit (a max is exact in any order).
  float m = z[0];
  for (int64_t j = 1; j < P; ++j) m = std::fmax(m, z[j * stride]);
  double den = 0.0;
  for (int64_t j = 0; j < P; ++j) den = den + exp_portable(double(z[j * stride]) - double(m));
  double acc = 0.0;
  for (int64_t j = 0; j < P; ++j) {
    const double a = exp_portable(double(z[j * stride]) - double(m)) / den;
    if (rounding == PoolRounding::f32) {
      acc = acc + a * double(k[j * stride]);
    } else {  // hf_bf16: bf16 probability, bf16 product (exact in f32, then rounded), sum of bf16 products
      const float a16 = round_bf16(float(a));
      acc = acc + double(round_bf16(a16 * round_bf16(k[j * stride])));
    }
  }
  return rounding == PoolRounding::f32 ? float(acc) : round_bf16(float(acc));
}

Tensor<float> pool_keys(const Tensor<float>& k, const Tensor<float>& z, PoolRounding rounding) {
  require(k.rank() == 2, "kpool k: expected rank 2 [T, D], got " + shape_str(k.shape));
  require(z.rank() == 3 && z.dim(0) == complete_pools(k.dim(0), std::max<int64_t>(z.dim(1), 1)) &&
              z.dim(2) == k.dim(1),
          "kpool z: expected [floor(T / P), P, " + std::to_string(k.dim(1)) + "] for k " + shape_str(k.shape) +
              ", got " + shape_str(z.shape));
  const int64_t n = z.dim(0), P = z.dim(1), D = k.dim(1);
  Tensor<float> kbar({n, D});
  for (int64_t p = 0; p < n; ++p)
    for (int64_t d = 0; d < D; ++d)
      kbar.at(p, d) = pool_channel(&z.at(p, 0, d), &k.at(p * P, d), P, D, rounding);
  return kbar;
}

PooledFp8 sglang_pooled_fp8(const Tensor<float>& kbar, bool pow2) {
  require(kbar.rank() == 2, "kpool kbar: expected rank 2 [n, D], got " + shape_str(kbar.shape));
  require_finite(kbar, "kpool kbar");
  const int64_t n = kbar.dim(0), D = kbar.dim(1);
  PooledFp8 r{Tensor<float>({n, D}), Tensor<e4m3_t>({n, D}), Tensor<float>({n})};
  for (int64_t p = 0; p < n; ++p) {
    float* x = &r.rotated.at(p, 0);
    for (int64_t d = 0; d < D; ++d) x[d] = round_bf16(kbar.at(p, d));
    hadamard_transform(x, int(D));  // Error unless D is a power of two
    float amax = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      x[d] = round_bf16(x[d]);
      amax = std::fmax(amax, std::fabs(x[d]));
    }
    float s = std::fmax(amax, 1e-4f) / kE4m3Max;
    if (pow2) s = pow2_ceil(s);
    r.scale[p] = s;
    for (int64_t d = 0; d < D; ++d) r.codes.at(p, d) = f32_to_e4m3(std::fmin(std::fmax(x[d] / s, -kE4m3Max), kE4m3Max));
  }
  return r;
}

}  // namespace indexshare::ref::kpool
