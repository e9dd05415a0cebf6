// indexshare diff: the V4 bounds of judge/v4_bounds.h (the derivation is there).
#include "tools/judge/v4_bounds.h"

#include <algorithm>
#include <cmath>

#include "ref/bounds.h"
#include "ref/error.h"

namespace indexshare::diff::v4b {

namespace {

constexpr double kU = 0x1p-24;
double gamma(double n) { return n * kU / (1.0 - n * kU); }

// eps_cs of the header at angle pos * f.
double eps_cs(int64_t pos, float f) { return 8.0 * kU * (double(pos) * std::fabs(double(f)) + 1.0); }

}  // namespace

double softmax_pool_error(const double* z, const double* v, size_t n, double* pooled) {
  const double zmax = *std::max_element(z, z + n), zmin = *std::min_element(z, z + n);
  double sum = 0;
  for (size_t j = 0; j < n; ++j) sum += std::exp(z[j] - zmax);
  double acc = 0, mag = 0;
  for (size_t j = 0; j < n; ++j) {
    const double pj = std::exp(z[j] - zmax) / sum;
    acc += pj * v[j];
    mag += pj * std::fabs(v[j]);
  }
  const double eps_p = gamma(double(n) + 8) + 3.0 * kU * (zmax - zmin);
  *pooled = acc;
  return (eps_p + gamma(double(n))) * mag;
}

std::vector<float> compressor_bounds(const Tensor<float>& kv, const Tensor<float>& gate, const Tensor<float>& bias,
                                     const Tensor<float>& norm_weight, const ref::v4::CompressorParams& p) {
  ref::v4::check_compressor_inputs(kv, gate, bias, norm_weight, p);
  const int64_t T = kv.dim(0), width = kv.dim(1), D = norm_weight.dim(0), m = p.ratio, n_w = T / m;
  const std::vector<float> freq = ref::v4::inv_freq(p.rope);
  const int rd = p.rope.rope_dim;
  std::vector<float> out(size_t(n_w * D), 0.0f);
  const size_t nD = static_cast<size_t>(D);
  std::vector<double> P(nD), eP(nD), y(nD), ey(nD);
  std::vector<double> z, v;
  for (int64_t w = 0; w < n_w; ++w) {
    for (int64_t c = 0; c < D; ++c) {
      z.clear();
      v.clear();
      const int64_t slots = p.overlap ? 2 * m : m;
      for (int64_t j = 0; j < slots; ++j) {
        int64_t tok, col, brow;
        if (!p.overlap) tok = w * m + j, col = c, brow = j;
        else if (j < m) tok = (w - 1) * m + j, col = c, brow = j;
        else tok = w * m + j - m, col = D + c, brow = j - m;
        if (tok < 0) continue;  // w = 0: the previous window's slots do not exist
        z.push_back(double(float(gate[tok * width + col] + bias[brow * width + col])));
        v.push_back(double(kv[tok * width + col]));
      }
      eP[size_t(c)] = softmax_pool_error(z.data(), v.data(), z.size(), &P[size_t(c)]);
    }
    double ss = 0, sp = 0;
    for (int64_t c = 0; c < D; ++c) ss += P[size_t(c)] * P[size_t(c)], sp += std::fabs(P[size_t(c)]) * eP[size_t(c)];
    const double r = 1.0 / std::sqrt(ss / double(D) + double(p.eps));
    const double er = r * r * r / double(D) * sp + r * (gamma(double(D) + 2) / 2 + 4 * kU);
    for (int64_t c = 0; c < D; ++c) {
      const double wc = double(norm_weight[c]);
      y[size_t(c)] = P[size_t(c)] * r * wc;
      ey[size_t(c)] = std::fabs(wc) * (r * eP[size_t(c)] + std::fabs(P[size_t(c)]) * er) + gamma(2) * std::fabs(y[size_t(c)]);
    }
    std::vector<double> e = ey;
    for (int i = 0; i < rd / 2; ++i) {
      const size_t a = size_t(D - rd + 2 * i), b = a + 1;
      const double extra = (eps_cs(w * m, freq[size_t(i)]) + gamma(2)) * (std::fabs(y[a]) + std::fabs(y[b]));
      e[a] = e[b] = ey[a] + ey[b] + extra;
    }
    for (int64_t c = 0; c < D; ++c) out[size_t(w * D + c)] = cmp::bound_f32(2.0 * e[size_t(c)]);
  }
  return out;
}

std::vector<float> index_score_bounds(const Tensor<float>& q, const Tensor<float>& k_comp, const Tensor<float>& weights,
                                      int64_t ratio, const std::vector<float>& k_bound) {
  Tensor<int32_t> ke({q.dim(0)});
  for (int64_t t = 0; t < q.dim(0); ++t) ke[t] = int32_t(std::min((t + 1) / ratio, k_comp.dim(0)));
  return index_score_bounds(q, k_comp, weights, ke, k_bound);
}

std::vector<float> index_score_bounds(const Tensor<float>& q, const Tensor<float>& k_comp, const Tensor<float>& weights,
                                      const Tensor<int32_t>& ke_rows, const std::vector<float>& k_bound) {
  const int64_t T = q.dim(0), HI = q.dim(1), DI = q.dim(2), n_b = k_comp.dim(0);
  require(int64_t(k_bound.size()) == n_b * DI, "v4 index_score_bounds: k_bound must hold n_b * D_I values");
  const double scale = 1.0 / std::sqrt(double(DI));
  const double g_dot = gamma(double(DI) + 2.0 * std::log2(double(DI)) + 4.0), g_sum = gamma(double(HI) + 3.0);
  std::vector<double> knorm(size_t(n_b), 0.0);
  for (int64_t s = 0; s < n_b; ++s)
    for (int64_t d = 0; d < DI; ++d) knorm[size_t(s)] += double(k_comp[s * DI + d]) * double(k_comp[s * DI + d]);
  for (double& x : knorm) x = std::sqrt(x);
  // The keys and their bounds transposed to [DI][n_b] in double, so that the loop over the keys is
  // innermost: each key's sums still run over d ascending with one accumulator (the same bits as a
  // loop over d per key; every product is exact in double), and the compiler vectorises across keys.
  std::vector<double> kt(size_t(DI * n_b)), kbt(size_t(DI * n_b));
  for (int64_t s = 0; s < n_b; ++s)
    for (int64_t d = 0; d < DI; ++d) {
      kt[size_t(d * n_b + s)] = double(k_comp[s * DI + d]);
      kbt[size_t(d * n_b + s)] = double(k_bound[size_t(s * DI + d)]);
    }
  std::vector<float> out(size_t(T * n_b), 0.0f);
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t ke = std::min<int64_t>(ke_rows[t], n_b);
    std::vector<double> acc(size_t(ke), 0.0), dot(size_t(ke), 0.0), prop(size_t(ke), 0.0);
    for (int64_t h = 0; h < HI; ++h) {
      const float* qh = &q[(t * HI + h) * DI];
      double qn = 0;
      for (int64_t d = 0; d < DI; ++d) qn += double(qh[d]) * double(qh[d]);
      qn = std::sqrt(qn);
      const double wh = std::fabs(double(weights[t * HI + h]));
      std::fill(dot.begin(), dot.end(), 0.0);
      std::fill(prop.begin(), prop.end(), 0.0);
      double* __restrict dp = dot.data();
      double* __restrict pp = prop.data();
      for (int64_t d = 0; d < DI; ++d) {
        const double qd = double(qh[d]), aq = std::fabs(qd);
        const double* __restrict kd = &kt[size_t(d * n_b)];
        const double* __restrict bd = &kbt[size_t(d * n_b)];
        for (int64_t s = 0; s < ke; ++s) {
          dp[s] += qd * kd[s];
          pp[s] += aq * bd[s];
        }
      }
      for (int64_t s = 0; s < ke; ++s) {
        const double e = wh * (g_dot * qn * knorm[size_t(s)] + prop[size_t(s)]) + g_sum * wh * std::max(dot[size_t(s)], 0.0);
        acc[size_t(s)] += e * scale;
      }
    }
    for (int64_t s = 0; s < ke; ++s) out[size_t(t * n_b + s)] = cmp::bound_f32(2.0 * acc[size_t(s)]);
  }
  return out;
}

std::vector<float> rotated_bounds(const Tensor<float>& out, const std::vector<float>& out_bound, const ref::v4::RopeParams& rope) {
  const int64_t T = out.dim(0), H = out.dim(1), D = out.dim(2);
  const int rd = rope.rope_dim;
  const std::vector<float> freq = ref::v4::inv_freq(rope);
  std::vector<float> b = out_bound;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int i = 0; i < rd / 2; ++i) {
        const int64_t a = (t * H + h) * D + D - rd + 2 * i, c = a + 1;
        const double mag = std::fabs(double(out[a])) + std::fabs(double(out[c]));
        const double e = double(out_bound[size_t(a)]) + double(out_bound[size_t(c)]) +
                         2.0 * (eps_cs(t, freq[size_t(i)]) + gamma(2)) * mag;
        b[size_t(a)] = b[size_t(c)] = cmp::bound_f32(e);
      }
  return b;
}

}  // namespace indexshare::diff::v4b
