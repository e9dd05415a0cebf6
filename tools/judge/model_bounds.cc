// indexshare: a transformers model's own attention against the golden's latent output (the
// derivation is in judge/model_bounds.h, "A transformers model's own attention").
#include <cmath>
#include <string>
#include <vector>

#include "tools/judge/model_bounds.h"
#include "tools/judge/compare.h"
#include "ref/error.h"
#include "ref/numerics.h"

namespace indexshare::cmp {

namespace {
constexpr double kE = 0x1p-24;  // f32 unit roundoff
double b2d(bf16_t x) { return double(bf16_to_f32(x)); }
std::string sh(const Shape& s) { return shape_str(s); }
}  // namespace

Tensor<float> map_latent_output(const Tensor<float>& latent, const Tensor<bf16_t>& w_uv) {
  require(latent.shape.size() == 3 && w_uv.shape.size() == 3 && w_uv.shape[0] == latent.shape[1] &&
              w_uv.shape[2] == latent.shape[2],
          "map_latent_output: latent " + sh(latent.shape) + " and w_uv " + sh(w_uv.shape) +
              " do not match ([s_q, h, r] and [h, v, r])");
  const int64_t s_q = latent.shape[0], h = latent.shape[1], r = latent.shape[2], v = w_uv.shape[1];
  Tensor<float> out({s_q, h, v});
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t j = 0; j < v; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < r; ++c) acc += b2d(w_uv[(hh * v + j) * r + c]) * double(latent[(t * h + hh) * r + c]);
        out[(t * h + hh) * v + j] = float(acc);
      }
  return out;
}

std::vector<float> model_attention_bounds(const Tensor<bf16_t>& q, const Tensor<bf16_t>& kv, const Tensor<int32_t>& indices,
                                           float sm_scale, const Tensor<bf16_t>& q_nope, const Tensor<bf16_t>& w_uk,
                                           const Tensor<bf16_t>& w_uv, const Tensor<float>& latent,
                                           const Tensor<float>& expected, bool logits_rounded) {
  require(q.shape.size() == 3 && kv.shape.size() == 3 && kv.shape[1] == 1 && kv.shape[2] == q.shape[2] &&
              w_uv.shape.size() == 3 && w_uk.shape.size() == 3 && q_nope.shape.size() == 3,
          "model_attention_bounds: q " + sh(q.shape) + ", kv " + sh(kv.shape) + ", w_uk " + sh(w_uk.shape) + ", w_uv " +
              sh(w_uv.shape) + ", q_nope " + sh(q_nope.shape) + " are not [s_q, h, d], [s_kv, 1, d], [h, n, r], [h, v, r], [s_q, h, n]");
  const int64_t s_q = q.shape[0], h = q.shape[1], d = q.shape[2], s_kv = kv.shape[0];
  const int64_t r = w_uv.shape[2], v = w_uv.shape[1], n = w_uk.shape[1];
  require(w_uv.shape[0] == h && w_uk.shape[0] == h && w_uk.shape[2] == r && r < d && q_nope.shape[0] == s_q &&
              q_nope.shape[1] == h && latent.shape == Shape{s_q, h, r} && expected.shape == Shape{s_q, h, v} &&
              indices.shape.size() == 3 && indices.shape[0] == s_q,
          "model_attention_bounds: shapes do not agree (h " + std::to_string(h) + ", r " + std::to_string(r) + ")");
  const int64_t topk = indices.shape[2];
  const double u = kModelUnit, e = kE, sm = sm_scale;
  auto f = [](bf16_t x) { return b2d(x); };
  // Per (key, head): k_nope exact and its magnitude sum_r |W_uk| |c| [n]; V exact and M [v].
  std::vector<double> kno(static_cast<size_t>(s_kv * h * n)), kmag(kno.size()), vex(static_cast<size_t>(s_kv * h * v)),
      M(vex.size());
  // Row j of head hh's up-projection W [h, rows, r] times the latent row c: the exact sum (r
  // ascending) into out[0] and the sum of |products| into out[1].
  auto project = [&](const Tensor<bf16_t>& w, int64_t rows, int64_t hh, int64_t j, const bf16_t* row, double* a, double* m) {
    double sa = 0, sm_ = 0;
    for (int64_t c = 0; c < r; ++c) {
      const double wx = f(w[(hh * rows + j) * r + c]) * f(row[c]);
      sa += wx;
      sm_ += std::fabs(wx);
    }
    *a = sa;
    *m = sm_;
  };
  for (int64_t i = 0; i < s_kv; ++i) {
    const bf16_t* row = &kv[i * d];
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t nn = 0; nn < n; ++nn) {
        const size_t o = size_t((i * h + hh) * n + nn);
        project(w_uk, n, hh, nn, row, &kno[o], &kmag[o]);
      }
      for (int64_t j = 0; j < v; ++j) {
        const size_t o = size_t((i * h + hh) * v + j);
        project(w_uv, v, hh, j, row, &vex[o], &M[o]);
      }
    }
  }
  std::vector<float> bound(size_t(s_q * h * v), 0.0f);
  std::vector<int64_t> keys;
  std::vector<double> x, delta, p, ea;
  std::vector<double> s_lg(static_cast<size_t>(v)), s_vr(static_cast<size_t>(v)), s_w(static_cast<size_t>(v));
  const double S = double(s_kv);
  for (int64_t t = 0; t < s_q; ++t) {
    keys.clear();
    for (int64_t j = 0; j < topk; ++j) {
      const int32_t i = indices[t * topk + j];
      if (i >= 0 && i < s_kv) keys.push_back(i);
    }
    if (keys.empty()) continue;
    for (int64_t hh = 0; hh < h; ++hh) {
      const bf16_t* qr = &q[(t * h + hh) * d];
      const bf16_t* qn = &q_nope[(t * h + hh) * n];
      const size_t nk = keys.size();
      x.assign(nk, 0.0);
      delta.assign(nk, 0.0);
      double mx = -INFINITY;
      for (size_t a = 0; a < nk; ++a) {
        const bf16_t* kr = &kv[keys[a] * d];
        const size_t kb = size_t((keys[a] * h + hh) * n);
        double dot = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0;
        for (int64_t c = 0; c < d; ++c) dot += f(qr[c]) * f(kr[c]);
        for (int64_t c = 0; c < r; ++c) a1 += std::fabs(f(qr[c]) * f(kr[c]));
        for (int64_t c = r; c < d; ++c) a4 += std::fabs(f(qr[c]) * f(kr[c]));
        for (int64_t c = 0; c < n; ++c) {
          a2 += std::fabs(f(qn[c]) * kno[kb + size_t(c)]);
          a3 += std::fabs(f(qn[c])) * kmag[kb + size_t(c)];
        }
        x[a] = sm * dot;
        mx = std::max(mx, x[a]);
        delta[a] = sm * ((1 + u) * u * a1 + u * a2 + double(n + r) * e * a3 + double(d + 2) * e * (1 + u) * (a3 + a4)) +
                   (logits_rounded ? 2 * u + u * u : 4 * e) * std::fabs(x[a]);
      }
      p.assign(nk, 0.0);
      double z = 0;
      for (size_t a = 0; a < nk; ++a) z += (p[a] = std::exp(x[a] - mx));
      double lb = 0;
      for (size_t a = 0; a < nk; ++a) lb += (p[a] /= z) * std::exp(delta[a]);
      lb = std::log(lb);
      ea.assign(nk, 0.0);
      for (size_t a = 0; a < nk; ++a) ea[a] = std::exp(delta[a] + lb);
      std::fill(s_lg.begin(), s_lg.end(), 0.0);
      std::fill(s_vr.begin(), s_vr.end(), 0.0);
      std::fill(s_w.begin(), s_w.end(), 0.0);
      for (size_t a = 0; a < nk; ++a) {
        const size_t vb = size_t((keys[a] * h + hh) * v);
        for (int64_t j = 0; j < v; ++j) {
          const double V = std::fabs(vex[vb + size_t(j)]), m = M[vb + size_t(j)];
          const double vr = u * V + (1 + u) * double(r) * e * m;  // |V_model - V|
          s_lg[size_t(j)] += p[a] * (ea[a] - 1) * V;
          s_vr[size_t(j)] += p[a] * ea[a] * vr;
          s_w[size_t(j)] += p[a] * ea[a] * (V + vr);
        }
      }
      for (int64_t j = 0; j < v; ++j) {
        const double W = s_w[size_t(j)];
        double b = s_lg[size_t(j)] + s_vr[size_t(j)] + (u + (S + 8) * e) * W + (S + 2) * e * (1 + 2 * u) * (1 + u) * W;
        const double ex = std::fabs(double(expected[(t * h + hh) * v + j]));
        b += u * (ex + b);
        double wo = 0;
        for (int64_t c = 0; c < r; ++c)
          wo += std::fabs(f(w_uv[(hh * v + j) * r + c])) * std::fabs(double(latent[(t * h + hh) * r + c]));
        b += 2 * e * wo + e * ex;
        bound[size_t((t * h + hh) * v + j)] = bound_f32(b);
      }
    }
  }
  return bound;
}

}  // namespace indexshare::cmp
