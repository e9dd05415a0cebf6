// Tests of ref/train/indexer_loss (the DSA indexer's distillation loss and its gradients) against
// checks written here: a brute-force loss over full [s_q, s_kv] matrices (std::exp, boolean masks,
// a different loop structure), central finite differences of that loss in double for dq, dk and dw',
// invariants (KL >= 0, KL = 0 when the student is the teacher, sparse with every key = dense,
// served-layers with one layer = own-layer, an external lse of -inf = none), the row rules, errors,
// and simd's bits on every target with 1 and 2 threads.
#include <doctest/doctest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ref/indexer.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/topk.h"
#include "ref/train/indexer_loss.h"
#include "simd/simd.h"

using namespace indexshare;
using ref::train::IndexerLossOptions;
using ref::train::IndexerLossOut;
using ref::train::TeacherLayer;

namespace {

struct Case {
  int64_t s_q, s_kv, H, D, h_q, d_qk;
  Tensor<float> q, k, w;
  Tensor<int32_t> ks, ke;
  std::vector<Tensor<bf16_t>> aq, akv;  // one teacher per layer
  std::vector<Tensor<float>> lse;       // optional external lse per layer
  float scale;
};

// Causal rows (row t sees keys [0, s_kv - s_q + t]); `empty_row` >= 0 gets no key at all.
Case make_case(int64_t s_q, int64_t s_kv, int64_t H, int64_t D, int64_t h_q, int64_t d_qk, int layers, uint64_t seed,
               int64_t empty_row = -1) {
  Case c{s_q, s_kv, H, D, h_q, d_qk, Tensor<float>({s_q, H, D}), Tensor<float>({s_kv, D}), Tensor<float>({s_q, H}),
         Tensor<int32_t>({s_q}), Tensor<int32_t>({s_q}), {}, {}, {}, 0.4f};
  fill(c.q.ptr(), c.q.numel(), Dist::uniform, 1.0f, seed, 1);
  fill(c.k.ptr(), c.k.numel(), Dist::uniform, 1.0f, seed, 2);
  fill(c.w.ptr(), c.w.numel(), Dist::uniform, 1.0f, seed, 3);
  for (int64_t t = 0; t < s_q; ++t) c.ks[t] = 0, c.ke[t] = int32_t(s_kv - s_q + t + 1);
  if (empty_row >= 0) c.ks[empty_row] = c.ke[empty_row] = 2;
  for (int j = 0; j < layers; ++j) {
    Tensor<float> a({s_q, h_q, d_qk}), kv({s_kv, 1, d_qk});
    fill(a.ptr(), a.numel(), Dist::normal, 1.0f, seed, 10 + uint64_t(j));
    fill(kv.ptr(), kv.numel(), Dist::normal, 1.0f, seed, 20 + uint64_t(j));
    Tensor<bf16_t> ab(a.shape), kvb(kv.shape);
    for (int64_t i = 0; i < a.numel(); ++i) ab[i] = f32_to_bf16(a[i]);
    for (int64_t i = 0; i < kv.numel(); ++i) kvb[i] = f32_to_bf16(kv[i]);
    c.aq.push_back(ab), c.akv.push_back(kvb);
    Tensor<float> l({s_q, h_q});
    fill(l.ptr(), l.numel(), Dist::uniform, 3.0f, seed, 30 + uint64_t(j));
    c.lse.push_back(l);
  }
  return c;
}

std::vector<TeacherLayer> teachers_of(const Case& c, int layers, bool with_lse = false) {
  std::vector<TeacherLayer> t;
  for (int j = 0; j < layers; ++j) t.push_back({&c.aq[size_t(j)], &c.akv[size_t(j)], c.scale, with_lse ? &c.lse[size_t(j)] : nullptr});
  return t;
}

// ---- the brute force: whole matrices, masks, std::exp; written from the Megatron definition ----
struct Brute {
  bool relu = true, sparse = false, nclse = false, mean_of_kl = false;  // mean_of_kl: 1/(m+1) sum_j KL(p_j||q)
  double coeff = 1.0;
  int layers = 1;
};

double brute_loss(const Case& c, const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& w,
                  const Tensor<int32_t>* topk, const Brute& b) {
  const int64_t s_q = c.s_q, s_kv = c.s_kv;
  std::vector<char> mask(static_cast<size_t>(s_q * s_kv), 0);
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t s = 0; s < s_kv; ++s) {
      bool in = s >= c.ks[t] && s < c.ke[t];
      if (b.sparse && in) {
        bool picked = false;
        for (int64_t j = 0; j < topk->dim(1); ++j) picked |= topk->at(t, j) >= 0 && c.ks[t] + topk->at(t, j) == s;
        in = picked;
      }
      mask[size_t(t * s_kv + s)] = in;
    }
  double total = 0.0;
  int64_t valid = 0;
  for (int64_t t = 0; t < s_q; ++t) {
    if (c.ke[t] > c.ks[t]) ++valid;
    std::vector<double> I(static_cast<size_t>(s_kv), 0.0);
    for (int64_t s = 0; s < s_kv; ++s)
      for (int64_t h = 0; h < c.H; ++h) {
        double S = 0.0;
        for (int64_t d = 0; d < c.D; ++d) S += q[size_t((t * c.H + h) * c.D + d)] * k[size_t(s * c.D + d)];
        I[size_t(s)] += w[size_t(t * c.H + h)] * (b.relu ? std::max(S, 0.0) : S);
      }
    double z = 0.0;
    for (int64_t s = 0; s < s_kv; ++s) if (mask[size_t(t * s_kv + s)]) z += std::exp(I[size_t(s)]);
    if (z == 0.0) continue;
    std::vector<double> pbar(static_cast<size_t>(s_kv), 0.0);
    double kl_mean = 0.0;
    for (int j = 0; j < b.layers; ++j) {
      std::vector<double> p(static_cast<size_t>(s_kv), 0.0);
      for (int64_t h = 0; h < c.h_q; ++h) {
        std::vector<double> P(static_cast<size_t>(s_kv), 0.0);
        double zh = 0.0;
        for (int64_t s = 0; s < s_kv; ++s) {
          if (!mask[size_t(t * s_kv + s)]) continue;
          for (int64_t d = 0; d < c.d_qk; ++d)
            P[size_t(s)] += double(bf16_to_f32(c.aq[size_t(j)].at(t, h, d))) * double(bf16_to_f32(c.akv[size_t(j)].at(s, 0, d)));
          P[size_t(s)] *= double(c.scale);
          zh += std::exp(P[size_t(s)]);
        }
        if (b.nclse) zh += std::exp(double(c.lse[size_t(j)].at(t, h)));
        for (int64_t s = 0; s < s_kv; ++s) if (mask[size_t(t * s_kv + s)]) p[size_t(s)] += std::exp(P[size_t(s)]) / zh;
      }
      double sp = 0.0;
      for (double v : p) sp += v;
      double kl = 0.0;
      for (int64_t s = 0; s < s_kv; ++s) {
        p[size_t(s)] /= std::max(sp, 1e-10);
        pbar[size_t(s)] += p[size_t(s)] / b.layers;
        if (mask[size_t(t * s_kv + s)] && p[size_t(s)] > 0)
          kl += p[size_t(s)] * (std::log(p[size_t(s)]) - (I[size_t(s)] - std::log(z)));
      }
      kl_mean += kl / b.layers;
    }
    double kl = 0.0;
    for (int64_t s = 0; s < s_kv; ++s)
      if (mask[size_t(t * s_kv + s)] && pbar[size_t(s)] > 0)
        kl += pbar[size_t(s)] * (std::log(pbar[size_t(s)]) - (I[size_t(s)] - std::log(z)));
    total += b.mean_of_kl ? kl_mean : kl;
  }
  return b.coeff * total / double(std::max<int64_t>(valid, 1));
}

std::vector<double> to_double(const Tensor<float>& t) { return std::vector<double>(t.ptr(), t.ptr() + t.numel()); }

// Largest |analytic - fd| / (|fd| + floor) over every element of one input, the brute-force loss
// differenced centrally with step h (relative to the element).
double fd_error(const Case& c, const Tensor<int32_t>* topk, const Brute& b, int which, const Tensor<float>& grad) {
  std::vector<double> v[3] = {to_double(c.q), to_double(c.k), to_double(c.w)};
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < grad.numel(); ++i) scale = std::max(scale, std::fabs(double(grad[i])));
  for (size_t i = 0; i < v[which].size(); ++i) {
    const double x = v[which][i], h = 1e-6 * std::max(1.0, std::fabs(x));
    v[which][i] = x + h;
    const double up = brute_loss(c, v[0], v[1], v[2], topk, b);
    v[which][i] = x - h;
    const double down = brute_loss(c, v[0], v[1], v[2], topk, b);
    v[which][i] = x;
    const double fd = (up - down) / (2 * h);
    worst = std::max(worst, std::fabs(double(grad[int64_t(i)]) - fd) / (scale + 1e-30));
  }
  return worst;
}

bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape == b.shape && (a.numel() == 0 || std::memcmp(a.ptr(), b.ptr(), size_t(a.numel()) * sizeof(float)) == 0);
}

bool same_out(const IndexerLossOut& a, const IndexerLossOut& b) {
  return same_bits(a.scores, b.scores) && same_bits(a.p, b.p) && same_bits(a.log_q, b.log_q) && same_bits(a.kl, b.kl) &&
         same_bits(a.d_scores, b.d_scores) && same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) &&
         same_bits(a.dw, b.dw) && std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0 && a.n_rows == b.n_rows;
}

IndexerLossOut run(const Case& c, const Tensor<int32_t>* topk, const IndexerLossOptions& o, int layers, bool lse = false) {
  return ref::train::indexer_loss(c.q, c.k, c.w, c.ks, c.ke, topk, teachers_of(c, layers, lse), o);
}

}  // namespace

TEST_CASE("indexer loss: the loss equals the brute force and the gradients equal finite differences") {
  for (bool relu : {true, false}) {
    CAPTURE(relu);
    const Case c = make_case(4, 7, 3, 5, 2, 16, 1, 11, /*empty_row=*/1);
    IndexerLossOptions o;
    o.relu = relu, o.loss_coeff = 0.7;
    const IndexerLossOut out = run(c, nullptr, o, 1);
    Brute b;
    b.relu = relu, b.coeff = 0.7;
    const double brute = brute_loss(c, to_double(c.q), to_double(c.k), to_double(c.w), nullptr, b);
    CHECK(out.loss == doctest::Approx(brute).epsilon(1e-12));
    CHECK(out.n_rows == 3);
    const double eq = fd_error(c, nullptr, b, 0, out.dq), ek = fd_error(c, nullptr, b, 1, out.dk),
                 ew = fd_error(c, nullptr, b, 2, out.dw);
    MESSAGE("fd max error / max |grad|: dq " << eq << ", dk " << ek << ", dw " << ew);
    CHECK(eq < 1e-6);
    CHECK(ek < 1e-6);
    CHECK(ew < 1e-6);
  }
}

TEST_CASE("indexer loss: the finite-difference check catches a wrong gradient") {
  const Case c = make_case(3, 5, 2, 4, 2, 8, 1, 12);
  IndexerLossOut out = run(c, nullptr, IndexerLossOptions{}, 1);
  Brute b;
  CHECK(fd_error(c, nullptr, b, 1, out.dk) < 1e-6);
  out.dk[3] *= 1.01f;  // a 1 % fault in one element
  CHECK(fd_error(c, nullptr, b, 1, out.dk) > 1e-4);
  out = run(c, nullptr, IndexerLossOptions{}, 1);
  for (int64_t i = 0; i < out.dw.numel(); ++i) out.dw[i] *= 2.0f;  // a missing 1/N would look like this
  CHECK(fd_error(c, nullptr, b, 2, out.dw) > 0.1);
}

TEST_CASE("indexer loss: I is the indexer's f32 logits, KL >= 0, dI sums to zero per row") {
  const Case c = make_case(6, 9, 4, 8, 2, 16, 1, 13);
  const IndexerLossOut out = run(c, nullptr, IndexerLossOptions{}, 1);
  const Tensor<float> ones({c.s_kv}, 1.0f);
  CHECK(same_bits(out.scores, ref::indexer_logits_f32(c.q, c.k, ones, c.w, c.ks, c.ke)));
  for (int64_t t = 0; t < c.s_q; ++t) {
    CHECK(out.kl[t] >= 0.0f);
    double ps = 0.0, ds = 0.0, qs = 0.0;
    for (int64_t s = c.ks[t]; s < c.ke[t]; ++s) ps += out.p.at(t, s), ds += out.d_scores.at(t, s), qs += std::exp(double(out.log_q.at(t, s)));
    CHECK(ps == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(qs == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(std::fabs(ds) < 1e-7);
  }
}

TEST_CASE("indexer loss: KL is 0 and the gradients vanish when the student is the teacher") {
  // One head each, no ReLU, w' = 1, scale 1, q = q_attn and k = kv on dyadic values: I = P exactly.
  const int64_t s_q = 4, s_kv = 6, D = 8;
  Case c = make_case(s_q, s_kv, 1, D, 1, D, 1, 14);
  Tensor<float> a({s_q, 1, D}), kv({s_kv, 1, D});
  fill(a.ptr(), a.numel(), Dist::dyadic, 1.0f, 14, 40);
  fill(kv.ptr(), kv.numel(), Dist::dyadic, 1.0f, 14, 41);
  for (int64_t i = 0; i < a.numel(); ++i) c.aq[0][i] = f32_to_bf16(a[i]), c.q[i] = a[i];
  for (int64_t i = 0; i < kv.numel(); ++i) c.akv[0][i] = f32_to_bf16(kv[i]), c.k[i] = kv[i];
  for (int64_t i = 0; i < c.w.numel(); ++i) c.w[i] = 1.0f;
  c.scale = 1.0f;
  IndexerLossOptions o;
  o.relu = false;
  const IndexerLossOut out = run(c, nullptr, o, 1);
  CHECK(std::fabs(out.loss) < 1e-14);
  for (int64_t i = 0; i < out.dq.numel(); ++i) CHECK(std::fabs(out.dq[i]) < 1e-13f);
  for (int64_t i = 0; i < out.dk.numel(); ++i) CHECK(std::fabs(out.dk[i]) < 1e-13f);
  // A different teacher makes it positive.
  c.scale = 0.5f;
  CHECK(run(c, nullptr, o, 1).loss > 1e-4);
}

TEST_CASE("indexer loss: sparse with every valid key selected equals dense, in any slot order") {
  const Case c = make_case(5, 8, 3, 4, 2, 8, 1, 15);
  IndexerLossOptions dense;
  const IndexerLossOut d = run(c, nullptr, dense, 1);
  IndexerLossOptions sparse;
  sparse.sparse = true;
  const Tensor<int32_t> all = ref::topk(d.scores, c.ks, c.ke, c.s_kv);
  CHECK(same_out(d, run(c, &all, sparse, 1)));
  // Reversed slots, a duplicate and out-of-window entries change nothing.
  Tensor<int32_t> messy({c.s_q, c.s_kv + 3}, -1);
  for (int64_t t = 0; t < c.s_q; ++t) {
    for (int64_t j = 0; j < c.s_kv; ++j) messy.at(t, j) = all.at(t, c.s_kv - 1 - j);
    messy.at(t, c.s_kv) = 0, messy.at(t, c.s_kv + 1) = c.ke[t] - c.ks[t], messy.at(t, c.s_kv + 2) = -5;
  }
  CHECK(same_out(d, run(c, &messy, sparse, 1)));
  // A real top-2 differs from dense and matches the brute force and its finite differences.
  const Tensor<int32_t> top2 = ref::topk(d.scores, c.ks, c.ke, 2);
  const IndexerLossOut s2 = run(c, &top2, sparse, 1);
  Brute b;
  b.sparse = true;
  CHECK(s2.loss == doctest::Approx(brute_loss(c, to_double(c.q), to_double(c.k), to_double(c.w), &top2, b)).epsilon(1e-12));
  CHECK(fd_error(c, &top2, b, 0, s2.dq) < 1e-6);
  CHECK(fd_error(c, &top2, b, 1, s2.dk) < 1e-6);
  for (int64_t t = 0; t < c.s_q; ++t)
    for (int64_t s = 0; s < c.s_kv; ++s) {
      bool picked = false;
      for (int64_t j = 0; j < 2; ++j) picked |= top2.at(t, j) >= 0 && c.ks[t] + top2.at(t, j) == s;
      if (!picked) CHECK((s2.p.at(t, s) == 0.0f && s2.log_q.at(t, s) == 0.0f && s2.d_scores.at(t, s) == 0.0f));
    }
}

TEST_CASE("indexer loss: a row without keys contributes nothing, N counts the valid rows") {
  const Case c = make_case(5, 6, 2, 4, 2, 8, 1, 16, /*empty_row=*/2);
  IndexerLossOptions o;
  const IndexerLossOut out = run(c, nullptr, o, 1);
  CHECK(out.n_rows == 4);
  CHECK(out.kl[2] == 0.0f);
  for (int64_t h = 0; h < c.H; ++h) {
    CHECK(out.dw.at(2, h) == 0.0f);
    for (int64_t d = 0; d < c.D; ++d) CHECK(out.dq.at(2, h, d) == 0.0f);
  }
  for (int64_t s = 0; s < c.s_kv; ++s) CHECK(out.scores.at(2, s) == -std::numeric_limits<float>::infinity());
  double sum = 0.0;
  for (int64_t t = 0; t < c.s_q; ++t) sum += double(out.kl[t]);
  CHECK(out.loss == doctest::Approx(sum / 4).epsilon(1e-6));
  o.all_rows = true;
  const IndexerLossOut all = run(c, nullptr, o, 1);
  CHECK(all.n_rows == 5);
  CHECK(all.loss == doctest::Approx(out.loss * 4 / 5).epsilon(1e-14));
  o.all_rows = false, o.per_token = true;
  const IndexerLossOut tok = run(c, nullptr, o, 1);
  CHECK(tok.loss == doctest::Approx(out.loss * 4).epsilon(1e-14));
  CHECK(tok.dq[5] == doctest::Approx(double(out.dq[5]) * 4).epsilon(1e-6));
  // A grid with no valid row at all: N clamps to 1, the loss is 0.
  Case none = make_case(2, 3, 2, 4, 2, 8, 1, 17);
  for (int64_t t = 0; t < 2; ++t) none.ks[t] = none.ke[t] = 1;
  const IndexerLossOut z = run(none, nullptr, IndexerLossOptions{}, 1);
  CHECK(z.n_rows == 1);
  CHECK(z.loss == 0.0);
}

TEST_CASE("indexer loss: served-layers (IndexCache training-aware target)") {
  const Case c = make_case(4, 6, 2, 4, 2, 8, 3, 18);
  IndexerLossOptions own, served;
  served.target = ref::train::Target::served_layers;
  CHECK(same_out(run(c, nullptr, own, 1), run(c, nullptr, served, 1)));
  CHECK(ref::train::parse_target("served-layers") == ref::train::Target::served_layers);
  CHECK(ref::train::target_name(ref::train::parse_target("own-layer")) == "own-layer");
  const IndexerLossOut out = run(c, nullptr, served, 3);
  // The gradient is that of the defined L = 1/(m+1) sum_j KL(p_j || q): the 1/(m+1) is right.
  Brute b;
  b.layers = 3, b.mean_of_kl = true;
  CHECK(fd_error(c, nullptr, b, 0, out.dq) < 1e-6);
  CHECK(fd_error(c, nullptr, b, 1, out.dk) < 1e-6);
  CHECK(fd_error(c, nullptr, b, 2, out.dw) < 1e-6);
  // The reported loss is KL(p-bar || q), below L by the Jensen gap (>= 0).
  b.mean_of_kl = false;
  const double kl_bar = brute_loss(c, to_double(c.q), to_double(c.k), to_double(c.w), nullptr, b);
  b.mean_of_kl = true;
  const double mean_kl = brute_loss(c, to_double(c.q), to_double(c.k), to_double(c.w), nullptr, b);
  CHECK(out.loss == doctest::Approx(kl_bar).epsilon(1e-12));
  CHECK(mean_kl > kl_bar);
  // kl_form mean-of-kl: the loss is the defined L (the brute force's mean of KLs), every row's kl
  // the mean of the own-layer KLs of each teacher alone; the gradients are the same bits.
  IndexerLossOptions mk = served;
  mk.kl_form = ref::train::KlForm::mean_of_kl;
  const IndexerLossOut m = run(c, nullptr, mk, 3);
  CHECK(m.loss == doctest::Approx(mean_kl).epsilon(1e-12));
  CHECK(m.loss > out.loss);
  CHECK(m.dq.data == out.dq.data);
  CHECK(m.dk.data == out.dk.data);
  CHECK(m.dw.data == out.dw.data);
  std::vector<IndexerLossOut> each;
  for (int j = 0; j < 3; ++j) {
    Case one = c;  // teacher j alone: its own-layer KL against the same student
    one.aq = {c.aq[size_t(j)]};
    one.akv = {c.akv[size_t(j)]};
    each.push_back(run(one, nullptr, own, 1));
  }
  for (int64_t t = 0; t < m.kl.numel(); ++t)
    CHECK(double(m.kl[t]) == doctest::Approx((double(each[0].kl[t]) + each[1].kl[t] + each[2].kl[t]) / 3).epsilon(1e-6));
  CHECK(ref::train::kl_form_name(ref::train::parse_kl_form("mean-of-kl")) == "mean-of-kl");
  CHECK_THROWS_AS(ref::train::parse_kl_form("mean"), Error);
}

TEST_CASE("indexer loss: non_compressed_lse teacher") {
  Case c = make_case(4, 6, 2, 4, 3, 8, 1, 19);
  IndexerLossOptions o;
  const IndexerLossOut plain = run(c, nullptr, o, 1);
  // An external lse of -inf (no mass outside) is the plain teacher, bit for bit.
  Tensor<float> saved = c.lse[0];
  for (int64_t i = 0; i < c.lse[0].numel(); ++i) c.lse[0][i] = -std::numeric_limits<float>::infinity();
  CHECK(same_out(plain, run(c, nullptr, o, 1, true)));
  c.lse[0] = saved;
  const IndexerLossOut out = run(c, nullptr, o, 1, true);
  Brute b;
  b.nclse = true;
  CHECK(out.loss == doctest::Approx(brute_loss(c, to_double(c.q), to_double(c.k), to_double(c.w), nullptr, b)).epsilon(1e-12));
  CHECK(fd_error(c, nullptr, b, 0, out.dq) < 1e-6);
  CHECK(fd_error(c, nullptr, b, 1, out.dk) < 1e-6);
  CHECK(!same_bits(out.p, plain.p));
}

TEST_CASE("indexer loss: bad inputs name the tensor") {
  const Case c = make_case(3, 5, 2, 4, 2, 8, 2, 20);
  IndexerLossOptions o;
  CHECK_THROWS_WITH_AS(run(c, nullptr, o, 2), doctest::Contains("own-layer takes exactly one layer"), Error);
  o.sparse = true;
  CHECK_THROWS_WITH_AS(run(c, nullptr, o, 1), doctest::Contains("indexer loss topk: required"), Error);
  const Tensor<int32_t> bad({2, 3}, 0);
  CHECK_THROWS_WITH_AS(run(c, &bad, o, 1), doctest::Contains("indexer loss topk: expected [s_q=3"), Error);
  CHECK_THROWS_WITH_AS(ref::train::parse_target("all-layers"), doctest::Contains("unknown name 'all-layers'"), Error);
  Case nan = c;
  nan.w[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(run(nan, nullptr, IndexerLossOptions{}, 1), doctest::Contains("indexer loss weights: non-finite"), Error);
  std::vector<TeacherLayer> t = teachers_of(c, 1);
  const Tensor<bf16_t> short_kv({4, 1, 8});
  t[0].kv = &short_kv;
  CHECK_THROWS_WITH_AS(ref::train::indexer_loss(c.q, c.k, c.w, c.ks, c.ke, nullptr, t, IndexerLossOptions{}),
                       doctest::Contains("teacher 0 kv: expected [s_kv=5"), Error);
}

TEST_CASE("indexer loss: bf16 q and k are the f32 call on their values") {
  const Case c = make_case(3, 5, 2, 4, 2, 8, 1, 21);
  Tensor<bf16_t> qb(c.q.shape), kb(c.k.shape);
  Case r = c;
  for (int64_t i = 0; i < c.q.numel(); ++i) qb[i] = f32_to_bf16(c.q[i]), r.q[i] = bf16_to_f32(qb[i]);
  for (int64_t i = 0; i < c.k.numel(); ++i) kb[i] = f32_to_bf16(c.k[i]), r.k[i] = bf16_to_f32(kb[i]);
  CHECK(same_out(ref::train::indexer_loss_bf16(qb, kb, c.w, c.ks, c.ke, nullptr, teachers_of(c, 1), IndexerLossOptions{}),
                 run(r, nullptr, IndexerLossOptions{}, 1)));
}

namespace {

// simd's outputs against ref's on every target with 1 and 2 threads, for four option sets (dense
// with ReLU, dense without ReLU with a non_compressed_lse, sparse top-5, sparse served-layers).
void check_simd_bits(const Case& c) {
  const int threads0 = omp_get_max_threads();
  const IndexerLossOut d = run(c, nullptr, IndexerLossOptions{}, 1);
  const Tensor<int32_t> top = ref::topk(d.scores, c.ks, c.ke, 5);
  hwy::SetSupportedTargetsForTest(0);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  REQUIRE(targets.size() >= 1);
  for (int variant = 0; variant < 4; ++variant) {
    CAPTURE(variant);
    IndexerLossOptions o;
    o.relu = variant != 1, o.sparse = variant >= 2, o.loss_coeff = 0.3;
    const int layers = variant == 3 ? 2 : 1;
    if (variant == 3) o.target = ref::train::Target::served_layers, o.kl_form = ref::train::KlForm::mean_of_kl;
    const std::vector<TeacherLayer> t = teachers_of(c, layers, variant == 1);
    const IndexerLossOut want = ref::train::indexer_loss(c.q, c.k, c.w, c.ks, c.ke, &top, t, o);
    for (int64_t target : targets) {
      hwy::SetSupportedTargetsForTest(target);
      CAPTURE(hwy::TargetName(target));
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        CHECK(same_out(want, simd::kernels().indexer_loss(c.q, c.k, c.w, c.ks, c.ke, &top, t, o)));
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  omp_set_num_threads(threads0);
}

}  // namespace

TEST_CASE("simd: indexer loss is bit-identical to ref on every target, 1 and 2 threads") {
  Case c = make_case(13, 37, 4, 19, 3, 24, 2, 22, /*empty_row=*/3);
  // The generator's values lie on fixed-point grids, where every dot product is exact in any order;
  // scaled by powers of two from 4 down to 2^-28 their products span more than 53 bits, so the
  // partial sums round and another summation order of I or of the teacher's logits shows in the
  // double loss (checked: d descending in the head scores, another fold of the 8 parts).
  for (int64_t i = 0; i < c.q.numel(); ++i) c.q[i] = std::ldexp(c.q[i], 2 - int(((i % c.D) * 5) % 31));
  for (int64_t i = 0; i < c.k.numel(); ++i) c.k[i] = std::ldexp(c.k[i], 2 - int(((i % c.D) * 3) % 31));
  for (int j = 0; j < 2; ++j) {  // the teacher's bf16 products have 16 bits: spread them over 2^2 .. 2^-70
    for (int64_t i = 0; i < c.aq[size_t(j)].numel(); ++i)
      c.aq[size_t(j)][i] = f32_to_bf16(std::ldexp(bf16_to_f32(c.aq[size_t(j)][i]), 1 - int(((i % c.d_qk) * 5) % 37)));
    for (int64_t i = 0; i < c.akv[size_t(j)].numel(); ++i)
      c.akv[size_t(j)][i] = f32_to_bf16(std::ldexp(bf16_to_f32(c.akv[size_t(j)][i]), 1 - int(((i % c.d_qk) * 3) % 37)));
  }
  c.scale = 2.0f;
  check_simd_bits(c);
}

TEST_CASE("simd: indexer loss gradients are bit-identical under cancellation") {
  // The gradients are f32: a last-bit change of their double sums shows only under cancellation.
  // Keys = one base row + 2^-22 noise: dq = w' sum_s dI k[s] cancels the base (sum_s dI = 0);
  // heads in pairs with q equal up to noise and weights w, -w: dk = sum dS q cancels likewise.
  Case c = make_case(13, 37, 4, 19, 3, 24, 2, 23, /*empty_row=*/3);
  for (int64_t s = 0; s < c.s_kv; ++s)
    for (int64_t d = 0; d < c.D; ++d) c.k.at(s, d) = c.k.at(0, d) + std::ldexp(c.k.at(s, d), -22);
  for (int64_t t = 0; t < c.s_q; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      if (h % 2) c.w.at(t, h) = -c.w.at(t, h - 1);
      for (int64_t d = 0; d < c.D; ++d) c.q.at(t, h, d) = c.q.at(0, 0, d) + std::ldexp(c.q.at(t, h, d), -22);
    }
  check_simd_bits(c);
}
