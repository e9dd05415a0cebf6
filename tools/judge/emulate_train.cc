#include "tools/judge/emulate_train.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "ref/error.h"
#include "ref/numerics.h"
#include "ref/rng.h"

namespace indexshare::emul {

namespace {

// v in an order drawn from g (Fisher-Yates, last position first).
template <class T>
std::vector<T> shuffled(std::vector<T> v, Xoshiro256& g) {
  for (size_t i = v.size(); i-- > 1;) std::swap(v[i], v[size_t(g.below(uint64_t(i + 1)))]);
  return v;
}
std::vector<int64_t> shuffled(int64_t n, Xoshiro256& g) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return shuffled(std::move(v), g);
}

}  // namespace

std::map<std::string, Tensor<float>> indexer_loss_f32(const golden::Loaded& g, int l, uint64_t seed) {
  Xoshiro256 rng(seed);
  const std::string P = "layers." + std::to_string(l) + ".";
  const nlohmann::json& tr = g.manifest["train"];
  require(tr.value("kl_form", std::string("kl-of-mean")) == "kl-of-mean",
          "emul::indexer_loss_f32: the set's loss holds mean_j KL(p_j || q); this kernel computes KL(p-bar || q)");
  std::vector<int> teachers;
  for (const nlohmann::json& e : tr["indexer_losses"])
    if (e["layer"] == l) teachers = e["teachers"].get<std::vector<int>>();
  require(!teachers.empty(), "emul::indexer_loss_f32: layer " + std::to_string(l) + " has no indexer loss");
  const Tensor<bf16_t> q = g.tensor<bf16_t>(P + "indexer.q"), k = g.tensor<bf16_t>(P + "indexer.k");
  const Tensor<float> w = g.tensor<float>(P + "indexer.weights");
  const Tensor<int32_t> ks = g.tensor<int32_t>(P + "indexer.ks"), ke = g.tensor<int32_t>(P + "indexer.ke");
  const Tensor<int32_t> top = g.tensor<int32_t>(P + "indexer.topk");
  const bool sparse = tr["loss"] == "sparse", relu = tr["relu"].get<bool>();
  const float sm = g.manifest["config"]["sm_scale"].get<float>(), coeff = float(tr["loss_coeff"].get<double>());
  const int64_t s_q = q.dim(0), H = q.dim(1), D = q.dim(2), s_kv = k.dim(0), K = top.dim(1);
  auto bf = [](bf16_t x) { return bf16_to_f32(x); };
  Tensor<float> p({s_q, s_kv}, 0.0f), logq({s_q, s_kv}, 0.0f), kl({s_q}, 0.0f), dI({s_q, s_kv}, 0.0f);
  Tensor<float> dq({s_q, H, D}, 0.0f), dk({s_kv, D}, 0.0f), dw({s_q, H}, 0.0f);
  std::vector<float> S(size_t(s_q * H * s_kv), 0.0f);
  int64_t valid = 0;
  for (int64_t t = 0; t < s_q; ++t) valid += ke[t] > ks[t];
  const float gsc = coeff / float(std::max<int64_t>(valid, 1));
  std::vector<std::vector<int64_t>> R(static_cast<size_t>(s_q));  // each row's support, ascending
  for (int64_t t = 0; t < s_q; ++t) {
    std::vector<bool> in(size_t(s_kv), !sparse);
    if (sparse)
      for (int64_t j = 0; j < K; ++j)
        if (top[t * K + j] >= 0 && ks[t] + top[t * K + j] < ke[t]) in[size_t(ks[t] + top[t * K + j])] = true;
    for (int64_t s = ks[t]; s < ke[t]; ++s)
      if (in[size_t(s)]) R[size_t(t)].push_back(s);
    const std::vector<int64_t> r = shuffled(R[size_t(t)], rng);
    if (r.empty()) continue;
    std::vector<float> I(size_t(s_kv), 0.0f);  // the student's scores
    for (int64_t s : r) {
      for (int64_t h : shuffled(H, rng)) {
        float acc = 0;
        for (int64_t d : shuffled(D, rng)) acc += bf(q[(t * H + h) * D + d]) * bf(k[s * D + d]);
        S[size_t((t * H + h) * s_kv + s)] = acc;
      }
      float acc = 0;
      for (int64_t h : shuffled(H, rng)) {
        const float x = S[size_t((t * H + h) * s_kv + s)];
        acc += w[t * H + h] * (relu ? std::max(x, 0.0f) : x);
      }
      I[size_t(s)] = acc;
    }
    std::vector<float> pt(size_t(s_kv), 0.0f);  // the teachers' mean of normalised summed head softmaxes
    for (int m : teachers) {
      const std::string T = "layers." + std::to_string(m) + ".";
      const Tensor<bf16_t> aq = g.tensor<bf16_t>(T + "attn.q"), akv = g.tensor<bf16_t>(T + "attn.kv");
      const int64_t hq = aq.dim(1), dqk = aq.dim(2);
      std::vector<float> ps(size_t(s_kv), 0.0f);
      for (int64_t h : shuffled(hq, rng)) {
        std::vector<float> lg(static_cast<size_t>(s_kv));
        float mx = -INFINITY, sum = 0;
        for (int64_t s : r) {
          float acc = 0;
          for (int64_t d : shuffled(dqk, rng)) acc += bf(aq[(t * hq + h) * dqk + d]) * bf(akv[s * dqk + d]);
          lg[size_t(s)] = acc * sm;
          mx = std::max(mx, lg[size_t(s)]);
        }
        for (int64_t s : r) sum += std::exp(lg[size_t(s)] - mx);
        for (int64_t s : r) ps[size_t(s)] += std::exp(lg[size_t(s)] - mx) / sum;
      }
      float sum = 0;
      for (int64_t s : r) sum += ps[size_t(s)];
      for (int64_t s : r) pt[size_t(s)] += ps[size_t(s)] / std::max(sum, 1e-10f);
    }
    for (int64_t s : r) pt[size_t(s)] /= float(teachers.size());
    float mx = -INFINITY, sum = 0, klt = 0, psum = 0;
    for (int64_t s : r) mx = std::max(mx, I[size_t(s)]);
    for (int64_t s : r) sum += std::exp(I[size_t(s)] - mx);
    const float lse = mx + std::log(sum);
    for (int64_t s : r) {
      p[t * s_kv + s] = pt[size_t(s)];
      logq[t * s_kv + s] = I[size_t(s)] - lse;
      klt += pt[size_t(s)] * (std::log(std::max(pt[size_t(s)], 1e-10f)) - logq[t * s_kv + s]);
      psum += pt[size_t(s)];
    }
    kl[t] = klt;
    for (int64_t s : r) dI[t * s_kv + s] = gsc * (std::exp(logq[t * s_kv + s]) * psum - pt[size_t(s)]);
  }
  float loss = 0;
  for (int64_t t : shuffled(s_q, rng)) loss += kl[t];
  loss = coeff * loss / float(std::max<int64_t>(valid, 1));
  auto dS = [&](int64_t t, int64_t h, int64_t s) {
    const float x = S[size_t((t * H + h) * s_kv + s)];
    return (relu && x <= 0) ? 0.0f : dI[t * s_kv + s] * w[t * H + h];
  };
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const std::vector<int64_t> r = shuffled(R[size_t(t)], rng);
      float a = 0;
      for (int64_t s : r) {
        const float x = S[size_t((t * H + h) * s_kv + s)];
        a += dI[t * s_kv + s] * (relu ? std::max(x, 0.0f) : x);
      }
      dw[t * H + h] = a;
      for (int64_t d = 0; d < D; ++d) {
        float b = 0;
        for (int64_t s : r) b += dS(t, h, s) * bf(k[s * D + d]);
        dq[(t * H + h) * D + d] = b;
      }
    }
  for (int64_t s = 0; s < s_kv; ++s) {
    std::vector<std::pair<int64_t, int64_t>> terms;  // the (row, head) pairs whose support holds s
    for (int64_t t = 0; t < s_q; ++t)
      if (std::binary_search(R[size_t(t)].begin(), R[size_t(t)].end(), s))
        for (int64_t h = 0; h < H; ++h) terms.push_back({t, h});
    terms = shuffled(std::move(terms), rng);
    for (int64_t d = 0; d < D; ++d) {
      float a = 0;
      for (const auto& [t, h] : terms) a += dS(t, h, s) * bf(q[(t * H + h) * D + d]);
      dk[s * D + d] = a;
    }
  }
  return {{"p", p}, {"log_q", logq}, {"kl", kl}, {"loss", Tensor<float>({1}, loss)},
          {"d_scores", dI}, {"dq", dq}, {"dk", dk}, {"dw", dw}};
}

}  // namespace indexshare::emul
