// indexshare diff: the HY V4 bounds of judge/hyv4_bounds.h (the derivation is there).
#include "tools/judge/hyv4_bounds.h"

#include <algorithm>
#include <cmath>

#include "ref/bounds.h"
#include "ref/error.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"

namespace indexshare::diff::hyb {

namespace {

constexpr double kU = 0x1p-24;
double gamma(double n) { return n * kU / (1.0 - n * kU); }

std::vector<float> as_bounds(const std::vector<double>& e) {
  std::vector<float> b(e.size());
  for (size_t i = 0; i < e.size(); ++i) b[i] = cmp::bound_f32(e[i]);
  return b;
}

}  // namespace

std::vector<float> k_norm_bounds(const Tensor<float>& k, const Tensor<float>& w, const Tensor<float>& b) {
  require(k.rank() == 2 && w.numel() == k.dim(1) && b.numel() == k.dim(1), "hyv4 k_norm_bounds: expected k [s_kv, D], w and b [D]");
  const int64_t S = k.dim(0), D = k.dim(1);
  const float eps = ref::hyv4::Config().norm_eps;
  std::vector<double> e(size_t(S * D));
  for (int64_t s = 0; s < S; ++s) {
    const float* x = &k[s * D];
    double sum = 0, sabs = 0, ssq = 0;
    for (int64_t d = 0; d < D; ++d) sum += x[d], sabs += std::fabs(double(x[d])), ssq += double(x[d]) * double(x[d]);
    const double mu = sum / double(D);
    double var = 0;
    for (int64_t d = 0; d < D; ++d) var += (double(x[d]) - mu) * (double(x[d]) - mu);
    var /= double(D);
    const double r = 1.0 / std::sqrt(var + double(eps));
    const double e_mu = gamma(double(D) + 1) * sabs / double(D);
    const double e_var = gamma(double(D) + 2) * ssq / double(D) + 2.0 * std::fabs(mu) * e_mu;
    const double e_r = r * r * r / 2.0 * e_var + 4.0 * kU * r;
    for (int64_t d = 0; d < D; ++d) {
      const double c = std::fabs(double(x[d]) - mu), wd = std::fabs(double(w[d]));
      const double e_c = e_mu + kU * c;
      e[size_t(s * D + d)] = 2.0 * (wd * (r * e_c + c * e_r) + gamma(3) * (c * r * wd + std::fabs(double(b[d]))));
    }
  }
  return as_bounds(e);
}

std::vector<float> rope_bounds(const Tensor<float>& x, const std::vector<float>& in_bound, int64_t first_pos,
                               const ref::hyv4::IndexerParams& p) {
  require(in_bound.empty() || int64_t(in_bound.size()) == x.numel(), "hyv4 rope_bounds: in_bound must be empty or one per element");
  const int64_t D = x.shape.back(), rows = x.dim(0), per_row = x.numel() / std::max<int64_t>(rows, 1);
  const std::vector<float> f = ref::rope_inv_freq(int(p.rope), p.theta);
  const int64_t off = p.slice == ref::hyv4::RopeSlice::trailing ? D - p.rope : 0;
  std::vector<double> e(size_t(x.numel()), 0.0);
  if (!in_bound.empty())
    for (size_t i = 0; i < e.size(); ++i) e[i] = in_bound[i];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < per_row / D; ++h)
      for (int64_t j = 0; j < p.rope / 2; ++j) {
        const size_t a = size_t(r * per_row + h * D + off + 2 * j), b = a + 1;
        const double eps_cs = 8.0 * kU * (double(first_pos + r) * std::fabs(double(f[size_t(j)])) + 1.0);
        const double mag = std::fabs(double(x[int64_t(a)])) + std::fabs(double(x[int64_t(b)]));
        e[a] = e[b] = e[a] + e[b] + 2.0 * (eps_cs + gamma(2)) * mag;
      }
  return as_bounds(e);
}

std::vector<float> weights_bounds(const Tensor<float>& weights) {
  std::vector<double> e(size_t(weights.numel()));
  for (int64_t i = 0; i < weights.numel(); ++i) e[size_t(i)] = 6.0 * kU * std::fabs(double(weights[i]));
  return as_bounds(e);
}

std::vector<float> score_bounds(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& w,
                                const Tensor<int32_t>& ke, const std::vector<float>& q_bound,
                                const std::vector<float>& k_bound, const std::vector<float>& w_bound) {
  const int64_t sq = q.dim(0), H = q.dim(1), D = q.dim(2), skv = k.dim(0);
  require(int64_t(q_bound.size()) == q.numel() && int64_t(k_bound.size()) == k.numel() && int64_t(w_bound.size()) == w.numel(),
          "hyv4 score_bounds: one input bound per element of q, k and w");
  const double g_dot = gamma(double(D) + 2), g_sum = gamma(double(H) + 2);
  std::vector<float> out(size_t(sq * skv), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < sq; ++t) {
    const int64_t end = std::clamp<int64_t>(ke[t], 0, skv);
    for (int64_t s = 0; s < end; ++s) {
      const float* ks = &k[s * D];
      const float* kb = &k_bound[size_t(s * D)];
      double e = 0, mag = 0;
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = &q[(t * H + h) * D];
        const float* qb = &q_bound[size_t((t * H + h) * D)];
        double dot = 0, prod = 0, prop = 0;
        for (int64_t d = 0; d < D; ++d) {
          dot += double(qh[d]) * double(ks[d]);
          prod += std::fabs(double(qh[d]) * double(ks[d]));
          prop += double(qb[d]) / 2 * std::fabs(double(ks[d])) + std::fabs(double(qh[d])) * double(kb[d]) / 2;
        }
        const double relu = std::max(dot, 0.0), wh = std::fabs(double(w[t * H + h]));
        e += wh * (g_dot * prod + prop) + double(w_bound[size_t(t * H + h)]) / 2 * relu;
        mag += wh * relu;
      }
      out[size_t(t * skv + s)] = cmp::bound_f32(2.0 * (e + g_sum * mag));
    }
  }
  return out;
}

std::vector<float> o_v_bounds(const Tensor<float>& out, const std::vector<float>& out_bound, const Tensor<float>& w_uv) {
  const int64_t sq = out.dim(0), hq = out.dim(1), dv = out.dim(2), V = w_uv.dim(1);
  require(w_uv.rank() == 3 && w_uv.dim(0) == hq && w_uv.dim(2) == dv, "hyv4 o_v_bounds: w_uv must be [h_q, V, dv]");
  const double g = gamma(double(dv) + 1);
  std::vector<double> e(size_t(sq * hq * V));
  for (int64_t t = 0; t < sq; ++t)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t j = 0; j < V; ++j) {
        const float* W = &w_uv[(h * V + j) * dv];
        const int64_t o = (t * hq + h) * dv;
        double prop = 0, mag = 0;
        for (int64_t c = 0; c < dv; ++c) {
          prop += std::fabs(double(W[c])) * double(out_bound[size_t(o + c)]);
          mag += std::fabs(double(W[c]) * double(out[o + c]));
        }
        e[size_t((t * hq + h) * V + j)] = prop + 2.0 * g * mag;
      }
  return as_bounds(e);
}

std::vector<float> gated_bounds(const Tensor<float>& o_v, const std::vector<float>& o_v_bound, const Tensor<float>& gate) {
  require(gate.numel() == o_v.numel() && int64_t(o_v_bound.size()) == o_v.numel(), "hyv4 gated_bounds: o_v, its bounds and gate differ in size");
  std::vector<double> e(size_t(o_v.numel()));
  for (int64_t i = 0; i < o_v.numel(); ++i) {
    const double sig = 1.0 / (1.0 + exp_portable(-double(gate[i]))), ov = std::fabs(double(o_v[i]));
    e[size_t(i)] = sig * double(o_v_bound[size_t(i)]) + 2.0 * (8.0 * kU * sig * ov + gamma(2) * sig * ov);
  }
  return as_bounds(e);
}

}  // namespace indexshare::diff::hyb
