#include "tools/judge/precision.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>

#include "ref/error.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "tools/judge/emulate.h"

namespace indexshare::prec {

const std::vector<Class>& classes(Kind kind) {
  static const std::vector<Class> logits = {
      {"f32", "exact FP8 products, f32 sums in any order"},
      {"fp8mma", "FP8 products summed by a tensor core that keeps about 14 bits (Hopper)"},
      {"f16", "logits rounded to f16"},
      {"bf16", "logits rounded to bf16"},
  };
  static const std::vector<Class> attention = {
      {"f32", "f32 logits and softmax, P in bf16, f32 P.V accumulation in any order"},
      {"bf16-logits", "q.k logits rounded to bf16 before the softmax"},
      {"bf16-products", "q.k products rounded to bf16 before the f32 sum"},
      {"bf16-acc", "P.V accumulated in bf16"},
  };
  static const std::vector<Class> values = {
      {"f32", "f32 arithmetic in any order"},
      {"f16", "values rounded to f16"},
      {"bf16", "values rounded to bf16"},
  };
  static const std::vector<Class> gradients = {
      {"bf16-p-ds", "f32 softmax, P and dS rounded to bf16 before their GEMMs, f32 accumulation in any order"},
      {"bf16-acc", "dq and dkv accumulated in bf16"},
  };
  return kind == Kind::logits ? logits : kind == Kind::attention ? attention : kind == Kind::gradients ? gradients : values;
}

const char* kind_key(Kind kind) {
  return kind == Kind::logits ? "logits" : kind == Kind::attention ? "attn" : kind == Kind::gradients ? "grad" : "values";
}

namespace {

std::string class_names(Kind kind) {
  std::string s;
  for (const Class& c : classes(kind)) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

size_t class_index(Kind kind, const std::string& name) {
  const auto& cs = classes(kind);
  for (size_t i = 0; i < cs.size(); ++i)
    if (cs[i].name == name) return i;
  return cs.size();
}

std::string g3(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2g", x);
  return b;
}

// One f32 ulp of |x| (the spacing of f32 values at x), in double.
double ulp_f32(double x) {
  const float f = std::fabs(float(x));
  if (!std::isfinite(f)) return 0;
  return double(std::nextafter(f, std::numeric_limits<float>::infinity())) - double(f);
}

// RMS of a - b over the pairs where both are finite, and the RMS of b there.
std::pair<double, double> rms_err(const std::vector<double>& a, const std::vector<double>& b) {
  double se = 0, sb = 0;
  int64_t n = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
    se += (a[i] - b[i]) * (a[i] - b[i]);
    sb += b[i] * b[i];
    ++n;
  }
  return n ? std::pair{std::sqrt(se / double(n)), std::sqrt(sb / double(n))} : std::pair{0.0, 0.0};
}

// The largest correlation between the candidate's error and a member's, over the pairs where all
// three are finite: how far the candidate repeats the class's own roundings.
double error_correlation(const std::vector<std::vector<double>>& members, const std::vector<double>& cand,
                         const std::vector<double>& golden) {
  double best = 0;
  for (const auto& m : members) {
    double cm = 0, cc = 0, mm = 0;
    for (size_t i = 0; i < golden.size(); ++i) {
      if (!std::isfinite(cand[i]) || !std::isfinite(m[i]) || !std::isfinite(golden[i])) continue;
      const double a = cand[i] - golden[i], b = m[i] - golden[i];
      cm += a * b;
      cc += a * a;
      mm += b * b;
    }
    if (cc > 0 && mm > 0) best = std::max(best, cm / std::sqrt(cc * mm));
  }
  return best;
}

// The largest relative RMS error of a class's members.
double class_e(const std::vector<std::vector<double>>& members, const std::vector<double>& golden, double golden_rms) {
  double e = 0;
  for (const auto& m : members) e = std::max(e, rms_err(m, golden).first / golden_rms);
  return e;
}

}  // namespace

std::string Contract::text() const {
  return std::string("logits=") + logits + (logits_declared ? " (declared)" : " (default)") + ", attn=" + attention +
         (attention_declared ? " (declared)" : " (default)") + (kl_form.empty() ? "" : ", kl=" + kl_form + " (declared)");
}

Contract parse_contract(const std::string& text) {
  Contract c;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "kl") {
      if (value != "kl-of-mean" && value != "mean-of-kl")
        throw Error("--precision: '" + item + "': kl takes kl-of-mean (KL(mean_j p_j || q)) or mean-of-kl (mean_j KL(p_j || q))");
      c.kl_form = value;
      continue;
    }
    Kind kind;
    if (key == "logits") kind = Kind::logits;
    else if (key == "attn") kind = Kind::attention;
    else throw Error("--precision: unknown item '" + item + "' in '" + text + "' (expected logits=CLASS, attn=CLASS and/or kl=FORM)");
    if (class_index(kind, value) == classes(kind).size())
      throw Error("--precision: '" + item + "': " + key + " has the classes " + class_names(kind));
    // The attention's bounds and FlashMLA's anchors are f32 arithmetic's: a coarser class fails
    // them whatever the precision test allows, so no lower attention contract can be declared.
    if (kind == Kind::attention && value != Contract{}.attention)
      throw Error("--precision: '" + item + "': the attention is judged against f32 arithmetic only (its per-element bounds and "
                  "FlashMLA's anchors are f32's; " + value + " exceeds them), so attn takes f32 alone");
    (kind == Kind::logits ? c.logits : c.attention) = value;
    (kind == Kind::logits ? c.logits_declared : c.attention_declared) = true;
  }
  return c;
}

std::vector<int64_t> spaced(int64_t count, int64_t max) {
  std::vector<int64_t> out;
  if (count <= 0 || max <= 0) return out;
  const int64_t n = std::min(count, max);
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(i * count / n);
  return out;
}

Finding test(const std::string& tensor, const std::vector<double>& golden, const std::vector<double>& cand, Kind kind,
             const Contract& contract, const ClassValues& values) {
  Finding f;
  f.contract_class = contract.of(kind);
  const auto [e_abs, golden_rms] = rms_err(cand, golden);
  f.samples = int64_t(golden.size());
  if (golden_rms == 0) return f;  // nothing to measure against
  f.ran = true;
  f.cand = e_abs / golden_rms;
  double floor_sq = 0;
  int64_t n = 0;
  for (double g : golden)
    if (std::isfinite(g)) { floor_sq += std::pow(kFloorUlps * ulp_f32(g), 2); ++n; }
  const double floor = std::sqrt(floor_sq / double(std::max<int64_t>(n, 1))) / golden_rms;
  const auto& cs = classes(kind);
  const size_t ci = class_index(kind, f.contract_class);
  f.contract = floor;
  if (f.cand > kPrecisionRatio * floor)  // at the floor nothing can be coarser: no emulation
    for (size_t i = 0; i <= ci; ++i) f.contract = std::max(f.contract, class_e(values(cs[i].name), golden, golden_rms));
  f.ratio = f.contract > 0 ? f.cand / f.contract : 0;
  if (f.cand <= kPrecisionRatio * f.contract) return f;
  const std::string contract_words = f.contract_class + (contract.of(kind) == Contract{}.of(kind) ? "" : ", declared");
  f.failed = true;
  double best = 0;
  for (size_t i = ci + 1; i < cs.size(); ++i) {
    const std::vector<std::vector<double>> members = values(cs[i].name);
    const double e = class_e(members, golden, golden_rms);
    if (e <= 0) continue;
    const double dist = std::fabs(std::log(f.cand / e));
    // Named only when the class's own test fits: the size (within kNameFactor) and the pattern
    // (the error repeats the class's roundings, kNameCorrelation). A bug whose error happens to
    // be the size of a class's (a sink on the wrong head, a norm's eps) is not that class.
    if (dist <= std::log(kNameFactor) && (f.named.empty() || dist < best) &&
        error_correlation(members, cand, golden) >= kNameCorrelation) {
      best = dist;
      f.named = cs[i].name;
      f.named_e = e;
    }
  }
  const std::string measured = "RMS " + g3(f.cand) + " relative over " + std::to_string(f.samples) + " sampled values; the contract's arithmetic (" +
                               contract_words + ": " + cs[ci].arithmetic + ") gives " + g3(f.contract);
  if (!f.named.empty())
    f.sentence = tensor + " carries " + f.named + "-level error (" + measured + ", " + f.named + " arithmetic " + g3(f.named_e) +
                 "): " + cs[class_index(kind, f.named)].arithmetic + "?";
  else
    f.sentence = measured + "; no named arithmetic class fits it";
  return f;
}

double max_scaled_deviation(const std::vector<double>& golden, const std::vector<double>& scale, Kind kind,
                            const Contract& contract, const ClassValues& values) {
  const auto& cs = classes(kind);
  const size_t ci = class_index(kind, contract.of(kind));
  double worst = 0;
  for (size_t c = 0; c <= ci && c < cs.size(); ++c)
    for (const auto& m : values(cs[c].name))
      for (size_t i = 0; i < golden.size(); ++i)
        if (scale[i] > 0 && std::isfinite(m[i]) && std::isfinite(golden[i]))
          worst = std::max(worst, std::fabs(m[i] - golden[i]) / scale[i]);
  return worst;
}

// ---- the classes' values ----

double round_bits(double x, int bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);
  return std::nearbyint(std::ldexp(x, bits - e)) * std::ldexp(1.0, e - bits);
}

namespace {

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

}  // namespace

std::vector<std::pair<int64_t, int64_t>> sample_logits(const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, int64_t s_kv) {
  const int64_t s_q = ks.dim(0);
  std::vector<int64_t> start(size_t(s_q) + 1, 0);  // cumulative window lengths
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t a = std::max<int64_t>(0, ks[t]), b = std::min<int64_t>(s_kv, ke[t]);
    start[size_t(t) + 1] = start[size_t(t)] + std::max<int64_t>(0, b - a);
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t t = 0;
  for (int64_t i : spaced(start.back(), kLogitsSamples)) {
    while (start[size_t(t) + 1] <= i) ++t;
    out.push_back({t, std::max<int64_t>(0, ks[t]) + (i - start[size_t(t)])});
  }
  return out;
}

namespace {

template <class In>
ClassValues logits_classes_impl(const Tensor<In>& q, const Tensor<In>& k, const Tensor<float>& k_scale, const Tensor<float>& weights,
                                std::vector<std::pair<int64_t, int64_t>> elems, std::vector<double> golden) {
  auto cache = std::make_shared<std::map<std::string, std::vector<std::vector<double>>>>();
  return [&q, &k, &k_scale, &weights, elems = std::move(elems), golden = std::move(golden), cache](const std::string& cls) {
    auto it = cache->find(cls);
    if (it != cache->end()) return it->second;
    std::vector<std::vector<double>> v;
    auto emulated = [&](emul::LogitsVariant lv) { v.push_back(widen(emul::logits_at(lv, q, k, k_scale, weights, elems))); };
    auto rounded = [&](int bits) {
      v.emplace_back();
      for (double g : golden) v.back().push_back(round_bits(g, bits));
    };
    if (cls == "f32") emulated({false, false, 0});
    else if (cls == "fp8mma") emulated({true, false, 0});
    else if (cls == "f16") rounded(11);
    else if (cls == "bf16") rounded(8);
    return (*cache)[cls] = v;
  };
}

}  // namespace

ClassValues logits_classes(const Tensor<e4m3_t>& q, const Tensor<e4m3_t>& k, const Tensor<float>& k_scale,
                           const Tensor<float>& weights, std::vector<std::pair<int64_t, int64_t>> elems, std::vector<double> golden) {
  return logits_classes_impl(q, k, k_scale, weights, std::move(elems), std::move(golden));
}

ClassValues logits_classes(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k, const Tensor<float>& k_scale,
                           const Tensor<float>& weights, std::vector<std::pair<int64_t, int64_t>> elems, std::vector<double> golden) {
  return logits_classes_impl(q, k, k_scale, weights, std::move(elems), std::move(golden));
}

Tensor<float> Moved::operator()(const Tensor<float>& x, const std::string& name) const {
  Tensor<float> out = x;
  const double u = ulps * 0x1p-24;
  const uint64_t tag = stream_tag(name);
  for (int64_t c = 0; c * kChunk < x.numel(); ++c) {
    Xoshiro256 g = chunk_generator(seed, tag, c);
    for (int64_t i = c * kChunk; i < std::min(x.numel(), (c + 1) * kChunk); ++i)
      out[i] = float(double(x[i]) * (1.0 + u * double(draw(g, Dist::uniform))));
  }
  return out;
}

ClassValues recomputed_classes(std::function<std::vector<double>(const Moved&)> recompute, int64_t n_reduction,
                               std::vector<double> golden) {
  auto cache = std::make_shared<std::map<std::string, std::vector<std::vector<double>>>>();
  const double ulps = kValuesSlack * std::sqrt(double(std::max<int64_t>(n_reduction, 1)));
  return [recompute = std::move(recompute), golden = std::move(golden), cache, ulps](const std::string& cls) {
    auto it = cache->find(cls);
    if (it != cache->end()) return it->second;
    std::vector<std::vector<double>> v;
    if (cls == "f32")
      for (uint64_t seed : {1, 2}) v.push_back(recompute(Moved{ulps, seed}));
    else if (cls == "f16" || cls == "bf16") {
      v.emplace_back();
      for (double g : golden) v.back().push_back(round_bits(g, cls == "f16" ? 11 : 8));
    }
    return (*cache)[cls] = v;
  };
}

std::vector<int64_t> sample_rows(const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, int64_t s_kv,
                                 int64_t h_q, int64_t d_qk, int64_t d_v) {
  const int64_t s_q = indices.dim(0), topk = indices.dim(2);
  std::vector<int64_t> with_keys;
  for (int64_t t = 0; t < s_q; ++t) {
    const int64_t len = topk_length ? std::clamp<int64_t>((*topk_length)[t], 0, topk) : topk;
    for (int64_t j = 0; j < len; ++j)
      if (const int32_t i = indices[t * topk + j]; i >= 0 && i < s_kv) { with_keys.push_back(t); break; }
  }
  const int64_t per_row = std::max<int64_t>(1, h_q * topk * (d_qk + d_v));
  const int64_t n = std::clamp(kAttentionSampleWork / per_row, kAttentionMinRows, kAttentionMaxRows);
  std::vector<int64_t> rows;
  for (int64_t i : spaced(int64_t(with_keys.size()), n)) rows.push_back(with_keys[size_t(i)]);
  return rows;
}

std::vector<double> at_rows(const Tensor<float>& t, const std::vector<int64_t>& rows) {
  const int64_t w = t.dim(0) ? t.numel() / t.dim(0) : 0;
  std::vector<double> out;
  out.reserve(rows.size() * size_t(w));
  for (int64_t r : rows) out.insert(out.end(), t.ptr() + r * w, t.ptr() + (r + 1) * w);
  return out;
}

AttentionClasses::AttentionClasses(std::vector<int64_t> rows, std::function<Tensor<bf16_t>()> q_rows, const Tensor<bf16_t>& kv,
                                   const Tensor<int32_t>& indices, const Tensor<int32_t>* topk_length, const Tensor<float>* sink,
                                   float sm_scale, int64_t d_v)
    : rows_(std::move(rows)), q_rows_(std::move(q_rows)), kv_(kv), sink_(sink), sm_(sm_scale), d_v_(d_v) {
  const int64_t n = int64_t(rows_.size()), topk = indices.dim(2);
  indices_ = Tensor<int32_t>({n, 1, topk});
  for (int64_t i = 0; i < n; ++i) std::copy_n(indices.ptr() + rows_[size_t(i)] * topk, topk, indices_.ptr() + i * topk);
  if (topk_length) {
    topk_length_ = Tensor<int32_t>({n});
    for (int64_t i = 0; i < n; ++i) topk_length_[i] = (*topk_length)[rows_[size_t(i)]];
  }
}

const std::vector<ref::AttentionOut>& AttentionClasses::members(const std::string& cls) {
  auto it = cache_.find(cls);
  if (it != cache_.end()) return it->second;
  if (q_.numel() == 0) q_ = q_rows_();
  const std::vector<emul::AttentionVariant> fam = emul::attention_family();
  std::vector<emul::AttentionVariant> vs;
  emul::AttentionVariant naive = fam[0];
  if (cls == "f32") vs = {fam[0], fam[4]};
  else if (cls == "bf16-logits") { naive.logits_bf16 = true; vs = {naive}; }
  else if (cls == "bf16-products") { naive.products_bf16 = true; vs = {naive}; }
  else if (cls == "bf16-acc") { naive.acc_bf16 = true; vs = {naive}; }
  std::vector<ref::AttentionOut> outs;
  for (const emul::AttentionVariant& v : vs)
    outs.push_back(emul::attention(v, q_, kv_, indices_, sm_, d_v_, topk_length_.numel() ? &topk_length_ : nullptr, sink_));
  return cache_[cls] = std::move(outs);
}

ClassValues AttentionClasses::values(int which) {
  return [this, which](const std::string& cls) {
    std::vector<std::vector<double>> v;
    for (const ref::AttentionOut& o : members(cls)) {
      const Tensor<float>& t = which == 0 ? o.out : which == 1 ? o.lse : o.max_logits;
      v.emplace_back(t.data.begin(), t.data.end());
    }
    return v;
  };
}

}  // namespace indexshare::prec
