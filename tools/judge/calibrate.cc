#include "tools/judge/calibrate.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "ref/error.h"
#include "ref/kpool/select.h"
#include "ref/v4/indexer.h"
#include "ref/numerics.h"
#include "ref/problem.h"
#include "ref/rng.h"
#include "ref/topk.h"
#include "ref/train/attention_bwd.h"
#include "tools/judge/structure.h"
#include "tools/judge/diff.h"
#include "tools/judge/emulate.h"
#include "tools/judge/emulate_train.h"
#include "tools/lib/golden.h"
#include "tools/lib/golden_hyv4.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/golden_model1.h"
#include "tools/lib/golden_mtp.h"
#include "tools/lib/golden_train.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/kernel_registry.h"

namespace indexshare::calib {

namespace fs = std::filesystem;

bool run_is_decode(int i) { return i % 3 == 2; }

std::string run_problem(int i, uint64_t seed, int64_t max_work) {
  Xoshiro256 g(seed * 1000003u + uint64_t(i));
  const int64_t hq = std::array<int64_t, 4>{16, 32, 64, 128}[size_t(i % 4)];
  const int64_t k = std::array<int64_t, 6>{64, 128, 256, 512, 1024, 2048}[size_t((i / 4) % 6)];
  const int64_t nseq = 1 + int64_t(g.below(3));
  const char* dist = std::array<const char*, 5>{"normal", "normal", "uniform", "int", "dyadic"}[g.below(5)];
  const bool sink = g.below(2) == 1;
  const bool stack = i % 5 == 4;        // Full + Shared layers (the pooled tests)
  const bool decode = run_is_decode(i);  // decode: 2 query rows per sequence, FP8 KV cache
  // Rows: at most max_work (row, head, key) triples per layer (2^19: a run stays around a second).
  int64_t per_seq = decode ? 2 : std::clamp<int64_t>(max_work / (hq * k * nseq), 2, 48);
  const int64_t kv_per_seq = k * (1 + int64_t(g.below(3))) + per_seq;  // every row's window > top-k
  const int64_t ih = g.below(2) ? 64 : 32;
  std::string d = "sq" + std::to_string(per_seq * nseq) + " skv" + std::to_string(kv_per_seq * nseq) + " hq" + std::to_string(hq) +
                  " dqk576 dv512 ih" + std::to_string(ih) + " id128 k" + std::to_string(k) + " seed" + std::to_string(seed * 1000 + uint64_t(i) + 1) +
                  " nseq" + std::to_string(nseq) + " dist=" + dist + (sink ? " sink=random" : "");
  if (stack) d += " nl4 sched=FSSS";
  return d;
}

namespace {

struct Cand {
  std::vector<io::TensorView> views;
  template <class T>
  void set(const std::string& name, const Tensor<T>& t) { views.push_back(io::make_view(name, t)); }
  io::SafetensorsFile write_read(const std::string& path) const {
    io::write_safetensors(path, views);
    return io::read_safetensors(path);
  }
};

struct LayerIn {
  Tensor<bf16_t> q, kv;
  Tensor<int32_t> indices, topk_length;
  std::optional<Tensor<float>> sink;
};
LayerIn layer_in(const golden::Loaded& g, int l) {
  const std::string p = "layers." + std::to_string(l) + ".";
  LayerIn in{g.tensor<bf16_t>(p + "attn.q"), g.tensor<bf16_t>(p + "attn.kv"), g.tensor<int32_t>(p + "attn.indices"), {}, {}};
  if (g.find(p + "attn.topk_length")) in.topk_length = g.tensor<int32_t>(p + "attn.topk_length");
  if (g.find(p + "attn.sink")) in.sink = g.tensor<float>(p + "attn.sink");
  return in;
}
ref::AttentionOut emulate(const golden::Loaded& g, int l, const emul::AttentionVariant& v, float sm) {
  const LayerIn in = layer_in(g, l);
  return emul::attention(v, in.q, in.kv, in.indices, sm, g.manifest["config"]["d_v"].get<int64_t>(),
                         in.topk_length.numel() ? &in.topk_length : nullptr, in.sink ? &*in.sink : nullptr);
}
Tensor<float> emulate_logits(const golden::Loaded& g, int l, const emul::LogitsVariant& v) {
  const std::string p = "layers." + std::to_string(l) + ".";
  return emul::logits(v, g.tensor<e4m3_t>(p + "indexer.q"), g.tensor<e4m3_t>(p + "indexer.k"), g.tensor<float>(p + "indexer.k_scale"),
                      g.tensor<float>(p + "indexer.weights"), g.tensor<int32_t>(p + "indexer.ks"), g.tensor<int32_t>(p + "indexer.ke"));
}
bool has_fp8_logits(const golden::Loaded& g, int l) {
  const std::string p = "layers." + std::to_string(l) + ".";
  return g.find(p + "indexer.logits") && g.get(p + "indexer.q").dtype == io::DType::F8_E4M3;
}

}  // namespace

namespace {
// Runs first .. first + runs - 1, each filled by `body` (index set before, wall time after), then
// reported to `progress`.
std::vector<Run> each_run(int first, int runs, const std::function<void(const Run&)>& progress,
                          const std::function<void(Run&)>& body) {
  std::vector<Run> out;
  for (int i = first; i < first + runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Run r;
    r.index = i;
    body(r);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (progress) progress(r);
    out.push_back(std::move(r));
  }
  return out;
}
}  // namespace

std::vector<Run> calibrate(int first, int runs, uint64_t seed, const ref::Kernels& k, const std::string& tmp,
                           const std::function<void(const Run&)>& progress, int64_t max_work) {
  fs::create_directories(tmp);
  const auto fam = emul::attention_family();
  const auto lfam = emul::logits_family();
  return each_run(first, runs, progress, [&](Run& r) {
    const int i = r.index;
    r.problem = run_problem(i, seed, max_work);
    const Problem p = parse_problem(r.problem);
    const std::string dir = tmp + "/golden";
    r.kind = run_is_decode(i) ? "decode" : "stack";  // decode: the reference runs on the FP8-dequantized latent
    golden::write(dir, golden::build(p, r.kind, true, "indexshare calibrate", Impl::simd), true);
    const golden::Loaded g = golden::read(dir);
    const emul::AttentionVariant av = fam[size_t(i) % fam.size()];
    const emul::LogitsVariant lv = lfam[size_t(i / 2) % lfam.size()];
    r.attention_variant = av.name();
    r.logits_variant = lv.name();
    const float sm = g.manifest["config"]["sm_scale"].get<float>();
    Cand c;
    for (int l = 0; l < int(g.manifest["layers"].size()); ++l) {
      const std::string pre = "layers." + std::to_string(l) + ".";
      const ref::AttentionOut o = emulate(g, l, av, sm);
      c.set(pre + "attn.out", o.out);
      c.set(pre + "attn.lse", o.lse);
      c.set(pre + "attn.max_logits", o.max_logits);
      if (has_fp8_logits(g, l)) {
        const Tensor<float> lg = emulate_logits(g, l, lv);
        c.set(pre + "indexer.logits", lg);
        // The kernel's top-k is taken from its own logits: its near ties are the ones its arithmetic made.
        if (g.manifest["layers"][size_t(l)]["kind"] == "full")
          c.set(pre + "indexer.topk", k.topk(lg, g.tensor<int32_t>(pre + "indexer.ks"), g.tensor<int32_t>(pre + "indexer.ke"),
                                             g.manifest["config"]["topk"].get<int64_t>()));
      }
    }
    record(r, diff::judge(g, c.write_read(tmp + "/candidate.safetensors"), {}, k));
  });
}

void record(Run& r, const diff::Result& res) {
  r.passed = !res.failed();
  for (const diff::TensorResult& t : res.tensors) {
    TensorMargin m;
    m.tensor = t.layer >= 0 ? "layers." + std::to_string(t.layer) + "." + t.name : t.name;
    m.verdict = cmp::verdict_name(t.report.verdict);
    m.structure_ratio = t.report.structure_tests ? t.report.structure_max_ratio : -cmp::kRatioCap;  // no tests: no margin
    m.b_over_floor = t.report.structure_max_b_over_floor;
    m.bound_ratio = t.report.stats.max_ratio;
    m.calc_diff = t.report.stats.metric;
    if (t.report.precision_ran && t.report.precision_contract > 0)
      m.precision_ratio = t.report.precision_rms / t.report.precision_contract;
    m.near_ties = t.report.stats.near_ties;
    r.tensors.push_back(m);
    if (t.report.verdict == cmp::Verdict::fail)
      for (const std::string& why : t.report.reasons) r.reasons.push_back(m.tensor + ": " + why);
  }
  for (const std::string& d : res.diagnoses) r.reasons.push_back(d);
}

nlohmann::json summary(const std::vector<Run>& runs) {
  nlohmann::json j;
  int fp = 0;
  std::map<std::string, std::array<double, 5>> worst;  // per tensor kind: structure, bound, metric, b/floor, precision
  std::map<std::string, std::string> worst_run;
  std::map<std::string, int64_t> near_ties;  // per top-k tensor kind: rows accepted as near ties, over every run
  std::map<std::string, std::array<int, 2>> by_kind;  // per golden kind: runs, false positives
  for (const Run& r : runs) {
    fp += !r.passed;
    ++by_kind[r.kind][0];
    by_kind[r.kind][1] += !r.passed;
    for (const TensorMargin& m : r.tensors) {
      const std::string kind = m.tensor.substr(m.tensor.find('.', 7) + 1);
      auto& w = worst.try_emplace(kind, std::array<double, 5>{-cmp::kRatioCap, 0, 0, 0, 0}).first->second;
      if (m.structure_ratio > w[0]) { w[0] = m.structure_ratio; worst_run[kind] = r.problem + " / " + r.attention_variant + " / " + r.logits_variant; }
      w[1] = std::max(w[1], m.bound_ratio);
      w[2] = std::max(w[2], m.calc_diff);
      w[3] = std::max(w[3], m.b_over_floor);
      w[4] = std::max(w[4], m.precision_ratio);
      near_ties[kind] += m.near_ties;
    }
  }
  j["runs"] = runs.size();
  j["false_positives"] = fp;
  for (const auto& [kind, n] : by_kind) j["by_kind"][kind] = {{"runs", n[0]}, {"false_positives", n[1]}};
  for (const auto& [kind, w] : worst)  // structure_ratio null: no structure test ran on the kind (a top-k)
    j["worst"][kind] = {{"structure_ratio", w[0] > -cmp::kRatioCap ? nlohmann::json(w[0]) : nlohmann::json(nullptr)},
                        {"err_over_bound", w[1]},
                        {"calc_diff", w[2]},
                        {"b_over_floor", w[3]},
                        {"precision_ratio", w[4]},
                        {"structure_worst_run", worst_run[kind]},
                        {"near_tie_rows", near_ties[kind]}};
  return j;
}

// ---- power ---------------------------------------------------------------------------------------

namespace {

// A planted fault of calibrate --power: make(candidate, eps) writes the faulted tensors.
struct PowerFault {
  std::string name, tensor;
  std::function<void(Cand&, double)> make;
  std::string named;  // a diagnosis naming it contains this (and `where`, when given)
  std::string where;
};

// Precision loss: every element rounded to b significant bits, eps = 2^-b (b from 23 down to 1, as
// bisection on eps does: a coarser rounding is a larger eps).
Tensor<float> coarsened(Tensor<float> t, double eps) {
  if (eps <= 0) return t;
  const int bits = std::clamp(int(std::lround(-std::log2(eps))), 1, 23);
  for (float& v : t.data) v = float(prec::round_bits(double(v), bits));
  return t;
}

// One fault's row of the power table: the smallest eps the judge fails (geometric bisection), the
// check that caught it there, and the smallest eps a diagnosis names it (with that diagnosis).
// The unfaulted emulation (eps 0) must pass.
PowerRow power_row(const PowerFault& f, const golden::Loaded& g, const ref::Kernels& k, const std::string& dir,
                   const std::string& tmp) {
  using Fault = PowerFault;
  auto judge = [&](const Fault& f, double eps, diff::Result* keep) {
    Cand c;
    f.make(c, eps);
    const diff::Result r = diff::judge(g, c.write_read(tmp + "/power.safetensors"), {}, k);
    if (keep) *keep = r;
    return r.failed();
  };
  auto named = [&](const Fault& f, double eps, diff::Result* keep) {
    diff::Result r;
    if (!judge(f, eps, &r)) return false;
    auto names = [&](const std::string& d) { return d.find(f.named) != std::string::npos && d.find(f.where) != std::string::npos; };
    const bool ok = std::any_of(r.diagnoses.begin(), r.diagnoses.end(), names);
    if (keep) *keep = r;
    return ok;
  };
  // The smallest eps in [1e-7, 0.5] for which pred holds (geometric bisection to about 5%), or -1.
  auto smallest = [&](const std::function<bool(double)>& pred) {
    double lo = 1e-7, hi = 0.5;
    if (!pred(hi)) return -1.0;
    for (int it = 0; it < 14; ++it) {
      const double mid = std::sqrt(lo * hi);
      (pred(mid) ? hi : lo) = mid;
    }
    return hi;
  };
  PowerRow row{f.name, f.tensor, -1, "", -1, ""};
  require(!judge(f, 0, nullptr), "calibrate --power: the unfaulted emulation fails on " + dir + " (" + f.name + ")");
  row.smallest = smallest([&](double e) { return judge(f, e, nullptr); });
  if (row.smallest > 0) {
    diff::Result r;
    judge(f, row.smallest, &r);
    for (const diff::TensorResult& t : r.tensors)
      if (t.report.verdict == cmp::Verdict::fail && !t.report.reasons.empty()) {
        const std::string& why = t.report.reasons[0];
        row.caught_by = why.find("precision") != std::string::npos ? "precision"
                        : why.find("structure") != std::string::npos ? "structure"
                        : why.find("calc_diff") != std::string::npos ? "calc_diff"
                        : why.find("check") != std::string::npos ? "anchor (FlashMLA elementwise)"
                        : why.find("budget") != std::string::npos ? "budget"
                        : "per-element bound";
        break;
      }
  }
  // A precision loss is no bug class: it is detected, not named.
  if (!f.named.empty()) row.named = smallest([&](double e) { return named(f, e, nullptr); });
  if (row.named > 0) {
    diff::Result r;
    named(f, row.named, &r);
    for (const std::string& d : r.diagnoses)
      if (d.find(f.named) != std::string::npos && d.find(f.where) != std::string::npos) { row.diagnosis = d; break; }
  }
  return row;
}

}  // namespace

std::vector<PowerRow> power(const std::string& dir, int layer, const ref::Kernels& k, const std::string& tmp) {
  fs::create_directories(tmp);
  const golden::Loaded g = golden::read(dir);
  if (const std::string kind = g.manifest["kind"].get<std::string>(); kind == "v4" || kind == "hyv4" || kind == "kpool")
    return values_power(dir, layer, k, tmp);
  layer = std::max(layer, 0);
  const int n_layers = int(g.manifest["layers"].size());
  require(layer >= 0 && layer < n_layers, "calibrate --power: --layer " + std::to_string(layer) + " is outside " + dir + "'s " +
                                              std::to_string(n_layers) + " layers");
  const auto& cfg = g.manifest["config"];
  const int64_t s_q = cfg["s_q"], h_q = cfg["h_q"], d_v = cfg["d_v"], s_kv = cfg["s_kv"];
  const float sm = cfg["sm_scale"].get<float>();
  const std::string pre = "layers." + std::to_string(layer) + ".";
  const emul::AttentionVariant naive = emul::attention_family()[0];
  const ref::AttentionOut base = emulate(g, layer, naive, sm);
  const bool logits = has_fp8_logits(g, layer);
  const Tensor<float> base_logits = logits ? emulate_logits(g, layer, emul::logits_family()[0]) : Tensor<float>{};
  int64_t n_seq = 1;
  if (const io::TensorView* v = g.find("cu_seqlens_q")) n_seq = int64_t(v->shape[0]) - 1;
  const std::vector<int64_t> seq0 = [&] {
    std::vector<int64_t> r = {0, s_q};
    if (n_seq >= 2) { const Tensor<int32_t> cu = g.tensor<int32_t>("cu_seqlens_q"); r = {cu[1], cu[2]}; }
    return r;
  }();

  using Fault = PowerFault;
  auto scaled = [](Tensor<float> t, double eps, const std::function<bool(int64_t)>& where) {
    for (int64_t i = 0; i < t.numel(); ++i)
      if (where(i) && std::isfinite(t[i])) t[i] = float(double(t[i]) * (1 + eps));
    return t;
  };
  auto all = [](int64_t) { return true; };
  std::vector<Fault> faults;
  faults.push_back({"attn.out scale, every element", "attn.out", [&](Cand& c, double e) { c.set(pre + "attn.out", scaled(base.out, e, all)); }, "attn.out scale error", "every element"});
  faults.push_back({"attn.out scale, head 0 only", "attn.out", [&](Cand& c, double e) {
                      c.set(pre + "attn.out", scaled(base.out, e, [&](int64_t i) { return (i / d_v) % h_q == 0; })); }, "attn.out", "head 0 only"});
  faults.push_back({"attn.out scale, columns = 0 mod 8", "attn.out", [&](Cand& c, double e) {
                      c.set(pre + "attn.out", scaled(base.out, e, [&](int64_t i) { return (i % d_v) % 8 == 0; })); }, "columns = 0 mod 8 only", ""});
  if (s_q > 64)
    faults.push_back({"attn.out scale, rows 64-127", "attn.out", [&](Cand& c, double e) {
                        c.set(pre + "attn.out", scaled(base.out, e, [&](int64_t i) { const int64_t t = i / (h_q * d_v); return t >= 64 && t < 128; })); }, "rows 64-127", ""});
  if (n_seq >= 2)
    faults.push_back({"attn.out scale, sequence 1 only", "attn.out", [&](Cand& c, double e) {
                        c.set(pre + "attn.out", scaled(base.out, e, [&](int64_t i) { const int64_t t = i / (h_q * d_v); return t >= seq0[0] && t < seq0[1]; })); }, "sequence 1 only", ""});
  const double out_rms = cmp::rms_finite(base.out), lse_rms = cmp::rms_finite(base.lse);
  faults.push_back({"attn.out offset (x rms), every element", "attn.out", [&](Cand& c, double e) {
                      Tensor<float> t = base.out;
                      for (float& v : t.data) v = float(double(v) + e * out_rms);
                      c.set(pre + "attn.out", t); }, "attn.out offset", "every element"});
  faults.push_back({"softmax scale (1 + eps) sm_scale: out, lse, max_logits", "attn.out", [&](Cand& c, double e) {
                      const ref::AttentionOut o = emulate(g, layer, naive, float(double(sm) * (1 + e)));
                      c.set(pre + "attn.out", o.out); c.set(pre + "attn.lse", o.lse); c.set(pre + "attn.max_logits", o.max_logits); }, "softmax scale", ""});
  faults.push_back({"softmax scale (1 + eps) sm_scale: out only", "attn.out", [&](Cand& c, double e) {
                      c.set(pre + "attn.out", emulate(g, layer, naive, float(double(sm) * (1 + e))).out); }, "attn.out matches a softmax scale", ""});
  faults.push_back({"attn.lse scale, every element", "attn.lse", [&](Cand& c, double e) { c.set(pre + "attn.lse", scaled(base.lse, e, all)); }, "attn.lse", ""});
  faults.push_back({"attn.lse offset (x rms), every element", "attn.lse", [&](Cand& c, double e) {
                      Tensor<float> t = base.lse;
                      for (float& v : t.data) if (std::isfinite(v)) v = float(double(v) + e * lse_rms);
                      c.set(pre + "attn.lse", t); }, "attn.lse", ""});
  faults.push_back({"attn.lse scale, head 0 only", "attn.lse", [&](Cand& c, double e) {
                      c.set(pre + "attn.lse", scaled(base.lse, e, [&](int64_t i) { return i % h_q == 0; })); }, "attn.lse", "head 0 only"});
  faults.push_back({"attn.max_logits scale, every element", "attn.max_logits", [&](Cand& c, double e) {
                      c.set(pre + "attn.max_logits", scaled(base.max_logits, e, all)); }, "attn.max_logits scale error", "every element"});
  if (logits) {
    faults.push_back({"indexer.logits scale, every element", "indexer.logits", [&](Cand& c, double e) {
                        c.set(pre + "indexer.logits", scaled(base_logits, e, all)); }, "indexer.logits scale error", "every element"});
    faults.push_back({"indexer.logits scale, keys = 0 mod 8", "indexer.logits", [&](Cand& c, double e) {
                        c.set(pre + "indexer.logits", scaled(base_logits, e, [&](int64_t i) { return (i % s_kv) % 8 == 0; })); }, "columns = 0 mod 8 only", ""});
  }

  // Precision loss: every element rounded to -log2(eps) bits (coarsened).
  faults.push_back({"attn.out rounded to -log2(eps) bits (precision loss)", "attn.out", [&](Cand& c, double e) {
                      c.set(pre + "attn.out", coarsened(base.out, e)); }, "", ""});
  faults.push_back({"attn.lse rounded to -log2(eps) bits (precision loss)", "attn.lse", [&](Cand& c, double e) {
                      c.set(pre + "attn.lse", coarsened(base.lse, e)); }, "", ""});
  if (logits)
    faults.push_back({"indexer.logits rounded to -log2(eps) bits (precision loss)", "indexer.logits", [&](Cand& c, double e) {
                        c.set(pre + "indexer.logits", coarsened(base_logits, e)); }, "", ""});

  std::vector<PowerRow> rows;
  for (const Fault& f : faults) rows.push_back(power_row(f, g, k, dir, tmp));
  return rows;
}

}  // namespace indexshare::calib

// ---- the values kind: calibration and power (--values) ----------------------------------------

namespace indexshare::calib {

namespace {

// What a values run judges: the Full layer's f32 scores (inputs q [T, H, D], keys [S, D], weights
// [T, H], times `scale` after the head sum, windows [ks, ke)) and the positions the kind selects
// from scores.
struct ScoresLayer {
  int layer = -1;
  std::string positions;  // "indexer.blocks", "indexer.topk", "indexer.pools"
  Tensor<float> q, k, w;
  float scale = 1;
  Tensor<int32_t> ks, ke;
  std::function<Tensor<int32_t>(const Tensor<float>&)> select;
};

template <size_t N>
int64_t pick(Xoshiro256& g, const std::array<int64_t, N>& a) { return a[g.below(N)]; }

// The set's first Full layer with scores, and how its inputs and positions are read (by kind).
ScoresLayer scores_layer(const golden::Loaded& g, const ref::Kernels& kern, int want = -1) {
  const std::string kind = g.manifest["kind"].get<std::string>();
  // The layers' numbers: a kpool manifest lists its DSA layers with their index; v4 and hyv4 every layer.
  std::vector<int> layers;
  for (const auto& e : g.manifest["layers"]) layers.push_back(e.contains("index") ? e["index"].get<int>() : int(layers.size()));
  ScoresLayer s;
  for (int l : layers)
    if (s.layer < 0 && (want < 0 || l == want) && g.find("layers." + std::to_string(l) + ".indexer.scores")) s.layer = l;
  require(s.layer >= 0, "calibrate: the " + kind + " set holds no indexer.scores" +
                            (want >= 0 ? " in layer " + std::to_string(want) : std::string()) + " (a Full layer's)");
  const std::string p = "layers." + std::to_string(s.layer) + ".indexer.";
  const Tensor<float> scores = g.tensor<float>(p + "scores");
  const int64_t T = scores.dim(0), S = scores.dim(1);
  if (kind == "v4") {
    s.positions = "indexer.blocks";
    s.q = g.tensor<float>(p + "q"), s.k = g.tensor<float>(p + "entries"), s.w = g.tensor<float>(p + "weights");
    const int64_t ratio = g.manifest["config"]["csa_ratio"].get<int64_t>(), topk = g.tensor<int32_t>(p + "blocks").dim(1);
    s.scale = float(1.0 / std::sqrt(double(s.q.dim(2))));
    s.ks = Tensor<int32_t>({T}, 0), s.ke = ref::v4::causal_block_end(T, ratio, S);
    s.select = [ratio, topk, &kern](const Tensor<float>& x) { return ref::v4::select_blocks(x, ratio, topk, kern); };
  } else if (kind == "hyv4") {
    s.positions = "indexer.topk";
    s.q = g.tensor<float>(p + "q_rope"), s.k = g.tensor<float>(p + "k_rope"), s.w = g.tensor<float>(p + "weights");
    s.ks = g.tensor<int32_t>(p + "ks"), s.ke = g.tensor<int32_t>(p + "ke");
    const int64_t topk = g.tensor<int32_t>(p + "topk").dim(1);
    s.select = [ks = s.ks, ke = s.ke, topk, &kern](const Tensor<float>& x) { return kern.topk(x, ks, ke, topk); };
  } else if (kind == "kpool") {
    s.positions = "indexer.pools";
    s.q = g.tensor<float>(p + "q"), s.k = g.tensor<float>(p + "pool_keys"), s.w = g.tensor<float>(p + "weights");
    s.scale = float(1.0 / std::sqrt(double(s.q.dim(2))));
    s.ks = Tensor<int32_t>({T}, 0), s.ke = g.tensor<int32_t>(p + "ke");
    const auto& c = g.manifest["config"];
    const int64_t s_kv = c["s_kv"], pool = c["pool"], topk = c["index_topk"];
    const bool tail = c["tail"];
    s.select = [=, &kern](const Tensor<float>& x) { return ref::kpool::select_tokens(x, s_kv, pool, topk, tail, kern).pools; };
  } else {
    throw Error("calibrate: a values run needs a v4, hyv4 or kpool set, not kind '" + kind + "'");
  }
  return s;
}


}  // namespace

std::string values_problem(int i, uint64_t seed, std::string& kind) {
  Xoshiro256 g(seed * 2000003u + uint64_t(i));
  const uint64_t s = seed * 1000 + uint64_t(i) + 1;
  const int64_t rows = pick(g, std::array<int64_t, 3>{128, 256, 512});
  switch (i % 3) {
    case 0: {
      kind = "v4";
      return "t=" + std::to_string(rows) + " h=2 d=64 w=8 csa=4 hca=8 ih=" + std::to_string(pick(g, std::array<int64_t, 3>{4, 8, 16})) +
             " id=" + std::to_string(pick(g, std::array<int64_t, 3>{32, 64, 128})) + " k=" + std::to_string(pick(g, std::array<int64_t, 3>{4, 8, 16})) +
             " rope=16 ctx=32 types=SC sched=F rot=" + (g.below(2) ? "megatron" : "hf") + " seed=" + std::to_string(s);
    }
    case 1: {
      kind = "hyv4";
      const std::string r = std::to_string(rows / 2);
      return "sq" + r + " skv" + r + " hq2 dqk40 dv32 ih" + std::to_string(pick(g, std::array<int64_t, 3>{2, 4, 8})) + " id" +
             std::to_string(pick(g, std::array<int64_t, 3>{16, 32, 64})) + " k" + std::to_string(pick(g, std::array<int64_t, 3>{8, 16, 32})) +
             " seed" + std::to_string(s) + " sm=0.0625 sink=random nl2 sched=hy-v4 rope=8 vd=16";
    }
    default: {
      kind = "kpool";
      const int64_t pool = pick(g, std::array<int64_t, 2>{4, 8});
      return "sq=" + std::to_string(rows) + " skv=" + std::to_string(rows) + " h=" + std::to_string(pick(g, std::array<int64_t, 3>{2, 4, 8})) +
             " d=" + std::to_string(pick(g, std::array<int64_t, 3>{16, 32, 64})) + " pool=" + std::to_string(pool) +
             " k=" + std::to_string(pool * pick(g, std::array<int64_t, 3>{2, 4, 8})) + " tail=" + (g.below(2) ? "yes" : "no") +
             " rounding=f32 hq=2 dqk=64 dv=32 nl=4 dsa=glm53 sched=F fp8=amax seed=" + std::to_string(s);
    }
  }
}

std::vector<Run> calibrate_values(int first, int runs, uint64_t seed, const ref::Kernels& k, const std::string& tmp,
                                  const std::function<void(const Run&)>& progress) {
  fs::create_directories(tmp);
  const auto fam = emul::scores_family();
  return each_run(first, runs, progress, [&](Run& r) {
    const int i = r.index;
    r.problem = values_problem(i, seed, r.kind);
    const std::string dir = tmp + "/golden";
    golden::GoldenSet set = r.kind == "v4"     ? golden::build_v4(golden::parse_v4_spec(r.problem), "indexshare calibrate --values", Impl::simd)
                            : r.kind == "hyv4" ? golden::build_hyv4(golden::parse_hyv4_spec(r.problem), "indexshare calibrate --values", Impl::simd)
                                               : golden::build_kpool(golden::parse_kpool_spec(r.problem), "indexshare calibrate --values", Impl::simd);
    golden::write(dir, std::move(set), true);
    const golden::Loaded g = golden::read(dir);
    const emul::LogitsVariant v = fam[size_t(i / 3) % fam.size()];
    r.logits_variant = v.name();
    const ScoresLayer s = scores_layer(g, k);
    const Tensor<float> scores = emul::scores_f32(v, s.q, s.k, s.w, s.scale, s.ks, s.ke);
    const std::string p = "layers." + std::to_string(s.layer) + ".";
    Cand c;
    c.set(p + "indexer.scores", scores);
    c.set(p + s.positions, s.select(scores));  // the kernel's positions from its own scores: its near ties
    record(r, diff::judge(g, c.write_read(tmp + "/candidate.safetensors"), {}, k));
  });
}

namespace {
// Judges a correct kernel's candidate and records the run; a diagnosis of a correct kernel is a
// false lead, so it fails the run too (calibrate --families, --preset).
void judge_strict(Run& r, const golden::Loaded& g, const Cand& c, const ref::Kernels& k, const std::string& tmp) {
  const diff::Result res = diff::judge(g, c.write_read(tmp + "/candidate.safetensors"), {}, k, false);
  record(r, res);
  for (const std::string& d : res.diagnoses) {
    r.passed = false;
    r.reasons.push_back("diagnosis: " + d);
  }
}
}  // namespace

std::string family_problem(int i, uint64_t seed, std::string& kind) {
  Xoshiro256 g(seed * 3000017u + uint64_t(i));
  const std::string s = std::to_string(seed * 1000 + uint64_t(i) + 1);
  switch (i % kFamilies) {
    case 5: {  // training: the attention backward of every layer and the Full layers' indexer losses
      kind = "train";
      const int64_t nseq = 1 + int64_t(g.below(2)), per = pick(g, std::array<int64_t, 3>{12, 16, 24});
      const int64_t kv = per + int64_t(g.below(2)) * 16;
      return "sq" + std::to_string(per * nseq) + " skv" + std::to_string(kv * nseq) + " hq" +
             std::to_string(pick(g, std::array<int64_t, 2>{4, 16})) + " dqk64 dv48 ih" + std::to_string(pick(g, std::array<int64_t, 2>{2, 4})) +
             " id32 k" + std::to_string(pick(g, std::array<int64_t, 2>{8, 16})) + " indexer=bf16 nl3 sched=" +
             (g.below(2) ? "FSF" : "FFS") + " seed" + s + " nseq" + std::to_string(nseq) + (g.below(2) ? " sink=random" : "");
    }
    case 0: {  // v4-tiny's layers (SWA, C4A Full, HCA, C4A Shared, C4A Full) at 48-128 tokens
      kind = "v4";
      const int64_t t = pick(g, std::array<int64_t, 3>{48, 96, 128});
      return "t=" + std::to_string(t) + " h=" + std::to_string(pick(g, std::array<int64_t, 2>{2, 4})) +
             " d=64 w=8 csa=4 hca=8 ih=4 id=32 k=" + std::to_string(pick(g, std::array<int64_t, 2>{4, 8})) +
             " rope=16 ctx=32 types=SCHCC sched=FSF rot=" + (g.below(2) ? "megatron" : "hf") + " seed=" + s;
    }
    case 1: {  // hy-v4-tiny's 6 layers F F S S S F with a random sink
      kind = "hyv4";
      const std::string r = std::to_string(pick(g, std::array<int64_t, 3>{16, 32, 64}));
      return "sq" + r + " skv" + r + " hq" + std::to_string(pick(g, std::array<int64_t, 2>{2, 4})) + " dqk40 dv32 ih4 id16 k" +
             std::to_string(pick(g, std::array<int64_t, 2>{8, 16})) + " seed" + s + " sm=0.0625 sink=random nl6 sched=hy-v4 rope=8 vd=16";
    }
    case 2: {  // kpool-tiny's DSA layers 3, 7, 11 (F S F)
      kind = "kpool";
      const int64_t pool = pick(g, std::array<int64_t, 2>{4, 8}), rows = pick(g, std::array<int64_t, 3>{30, 64, 100});
      return "sq=" + std::to_string(rows) + " skv=" + std::to_string(rows) + " h=4 d=16 pool=" + std::to_string(pool) +
             " k=" + std::to_string(pool * pick(g, std::array<int64_t, 2>{2, 4})) + " tail=" + (g.below(2) ? "yes" : "no") +
             " rounding=f32 hq=" + std::to_string(pick(g, std::array<int64_t, 2>{2, 4})) + " dqk=64 dv=32 nl=12 dsa=glm53 sched=FSF fp8=amax seed=" + s;
    }
    case 4: {  // FlashMLA's MODEL1 two-scope decode (window + compressed entries, one softmax, the sink)
      kind = "decode-model1";
      return "model1 b2 nextn" + std::to_string(pick(g, std::array<int64_t, 2>{1, 2})) + " hq" +
             std::to_string(pick(g, std::array<int64_t, 2>{64, 128})) + " len1024 win128 blk" +
             std::to_string(pick(g, std::array<int64_t, 2>{64, 256})) + " ek" + std::to_string(pick(g, std::array<int64_t, 2>{128, 256})) +
             " eblk64 elen" + std::to_string(pick(g, std::array<int64_t, 2>{384, 640})) + " seed" + s;
    }
    default: {  // mtp-tiny: the target layer, the MTP layer and four requests' draft steps
      kind = "mtp";
      return "sq16 skv128 hq" + std::to_string(pick(g, std::array<int64_t, 2>{4, 8})) + " dqk64 dv32 ih4 id32 k" +
             std::to_string(pick(g, std::array<int64_t, 2>{8, 16})) + " seed" + s + " nseq4 steps=4 accept=4,1,3,2";
    }
  }
}

golden::TrainSpec family_train_spec(int i, uint64_t seed) {
  Xoshiro256 g(seed * 7000003u + uint64_t(i));
  golden::TrainSpec t;
  t.sparse = g.below(2) == 1;
  t.relu = g.below(4) != 0;
  t.target = g.below(3) == 0 ? "served-layers" : "own-layer";
  t.loss_coeff = g.below(4) == 0 ? 0.25 : 1.0;
  t.edges = g.below(5) == 0;
  return t;
}

TrainOutputs family_train(const golden::Loaded& g, uint64_t seed, bool backward, bool loss) {
  TrainOutputs c;
  Xoshiro256 r(seed);
  const float sm = g.manifest["config"]["sm_scale"].get<float>();
  const int64_t d_v = g.manifest["config"]["d_v"].get<int64_t>();
  const bool bf16_out = r.below(2) == 1;  // the kernels' f32 outputs, or their bf16 casts
  auto out = [&](const std::string& name, const Tensor<float>& t) {
    if (!bf16_out) {
      c.f32[name] = t;
      return;
    }
    Tensor<bf16_t> b(t.shape);
    for (int64_t i = 0; i < t.numel(); ++i) b[i] = f32_to_bf16(t[i]);
    c.bf16[name] = b;
  };
  for (size_t l = 0; backward && l < g.manifest["layers"].size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    // TileLang's arithmetic with each row's slots in another order: every sum over keys runs in another order.
    Tensor<int32_t> ind = g.tensor<int32_t>(p + "attn.indices");
    const int64_t K = ind.dim(2);
    const Tensor<int32_t> len = g.find(p + "attn.topk_length") ? g.tensor<int32_t>(p + "attn.topk_length") : Tensor<int32_t>();
    for (int64_t t = 0; t < ind.dim(0); ++t) {
      const int64_t n = len.numel() ? std::clamp<int64_t>(len[t], 0, K) : K;  // only the slots topk_length keeps
      for (int64_t j = n - 1; j > 0; --j) std::swap(ind[t * K + j], ind[t * K + int64_t(r.below(uint64_t(j + 1)))]);
    }
    const Tensor<float> sink = g.find(p + "attn.sink") ? g.tensor<float>(p + "attn.sink") : Tensor<float>();
    const ref::AttentionBackwardOut e = cmp::emulate_attention_backward_lowp(
        g.tensor<bf16_t>(p + "attn.q"), g.tensor<bf16_t>(p + "attn.kv"), ind, sm, d_v, g.tensor<bf16_t>(p + "attn.d_out"),
        len.numel() ? &len : nullptr, sink.numel() ? &sink : nullptr);
    if (bf16_out) {
      c.bf16[p + "attn_bwd.dq"] = e.dq_bf16;
      c.bf16[p + "attn_bwd.dkv"] = e.dkv_bf16;
    } else {
      c.f32[p + "attn_bwd.dq"] = e.dq;
      c.f32[p + "attn_bwd.dkv"] = e.dkv;
    }
    c.f32[p + "attn_bwd.delta"] = e.delta;
    if (sink.numel()) c.f32[p + "attn_bwd.d_sink"] = e.d_sink;
  }
  for (const nlohmann::json& e : g.manifest["train"]["indexer_losses"]) {
    const int l = e["layer"].get<int>();
    if (!loss) break;
    for (const auto& [n, v] : emul::indexer_loss_f32(g, l, r.next())) {
      const std::string name = "layers." + std::to_string(l) + ".indexer_loss." + n;
      if (n == "dq" || n == "dk" || n == "dw") out(name, v);
      else c.f32[name] = v;
    }
  }
  return c;
}

std::map<std::string, Tensor<float>> family_attention(const golden::Loaded& g, const emul::AttentionVariant& v) {
  std::map<std::string, Tensor<float>> c;
  const float sm = g.manifest["config"]["sm_scale"].get<float>();
  auto one = [&](const std::string& out, const std::string& q, const std::string& kv, const std::string& idx, const std::string& sink) {
    const Tensor<float> s = g.find(sink) ? g.tensor<float>(sink) : Tensor<float>();
    const int64_t d_v = g.get(out + "out").shape.back();
    const ref::AttentionOut o =
        emul::attention(v, g.tensor<bf16_t>(q), g.tensor<bf16_t>(kv), g.tensor<int32_t>(idx), sm, d_v, nullptr, s.numel() ? &s : nullptr);
    c[out + "out"] = o.out;
    c[out + "lse"] = o.lse;
    c[out + "max_logits"] = o.max_logits;
  };
  for (size_t l = 0; l < 4096; ++l) {  // KPool's DSA layers are a model's layers 3, 7, 11
    const std::string p = "layers." + std::to_string(l) + ".attn.";
    if (g.find(p + "q") && g.find(p + "indices") && g.find(p + "out")) one(p, p + "q", p + "kv", p + "indices", p + "sink");
  }
  if (g.find("mtp.q")) one("mtp.", "mtp.q", "layers.1.attn.kv", "mtp.indices", "layers.1.attn.sink");
  return c;
}

std::vector<Run> calibrate_families(int first, int runs, uint64_t seed, const ref::Kernels& k, const std::string& tmp,
                                    const std::function<void(const Run&)>& progress) {
  fs::create_directories(tmp);
  const auto fam = emul::attention_family();
  const std::string replay = "indexshare calibrate --families";
  return each_run(first, runs, progress, [&](Run& r) {
    const int i = r.index;
    r.problem = family_problem(i, seed, r.kind);
    const std::string dir = tmp + "/golden";
    if (r.kind == "train") {
      const golden::TrainSpec t = family_train_spec(i, seed);
      golden::write(dir, golden::build_train(parse_problem(r.problem), t, replay, Impl::simd), true);
      r.problem += golden::train_options_text(t);
      const golden::Loaded g = golden::read(dir);
      r.attention_variant = "TileLang's low-precision backward, f32 indexer loss, drawn orders";
      Cand c;
      const TrainOutputs o = family_train(g, seed * 1000003u + uint64_t(i));
      for (const auto& [name, t2] : o.f32) c.set(name, t2);
      for (const auto& [name, t2] : o.bf16) c.set(name, t2);
      judge_strict(r, g, c, k, tmp);
      return;
    }
    golden::GoldenSet set = r.kind == "v4"     ? golden::build_v4(golden::parse_v4_spec(r.problem), replay, Impl::simd)
                            : r.kind == "hyv4" ? golden::build_hyv4(golden::parse_hyv4_spec(r.problem), replay, Impl::simd)
                            : r.kind == "kpool" ? golden::build_kpool(golden::parse_kpool_spec(r.problem), replay, Impl::simd)
                            : r.kind == "mtp"   ? golden::build_mtp(golden::parse_mtp_spec(r.problem), replay, Impl::simd)
                                                : golden::build_model1_decode(golden::parse_model1_spec(r.problem), replay, Impl::simd);
    golden::write(dir, std::move(set), true);
    const golden::Loaded g = golden::read(dir);
    const emul::AttentionVariant v = fam[size_t(i / kFamilies) % fam.size()];
    r.attention_variant = v.name();
    Cand c;
    for (const auto& [name, t] : family_attention(g, v)) c.set(name, t);
    judge_strict(r, g, c, k, tmp);
  });
}

std::vector<Run> calibrate_preset(const std::string& name, int first, int runs, uint64_t seed, const ref::Kernels& k,
                                  const std::string& tmp, const std::function<void(const Run&)>& progress) {
  const golden::Preset& pr = golden::preset(name);  // Error naming the unknown preset
  require(!pr.kernel.empty(), "calibrate --preset: '" + name + "' is not a kernel preset (indexshare kernels lists them)");
  const kreg::Kernel& kern = kreg::kernel(pr.kernel);
  std::set<std::string> writes;  // the tensors the kernel writes, without their layer prefix
  for (const kreg::Arg& a : kern.outputs) writes.insert(a.tensor.substr(a.tensor.rfind("}.") + 2));
  fs::create_directories(tmp);
  const auto fam = emul::attention_family();
  const auto lfam = emul::logits_family();
  const std::string replay = "indexshare calibrate --preset " + name, dir = tmp + "/golden";
  return each_run(first, runs, progress, [&](Run& r) {
    const int i = r.index;
    r.kind = pr.kind;
    // The preset's set with its seed moved, written and read back once.
    if (pr.kind == "decode-model1") {
      golden::Model1DecodeSpec s = golden::parse_model1_spec(pr.problem);
      s.seed = s.seed * 1000 + seed * 100000 + uint64_t(i);
      r.problem = golden::to_string(s);
      golden::write(dir, golden::build_model1_decode(s, replay, Impl::simd), true);
    } else {
      Problem p = parse_problem(pr.problem);
      p.seed = p.seed * 1000 + seed * 100000 + uint64_t(i);
      r.problem = to_string(p);
      golden::write(dir, pr.kind == "train" ? golden::build_train(p, golden::TrainSpec(), replay, Impl::simd)
                                            : golden::build(p, pr.kind, true, replay, Impl::simd),
                    true);
    }
    const golden::Loaded g = golden::read(dir);
    Cand c;
    auto keep = [&](const std::string& n, const auto& t) {
      if (writes.count(n.substr(n.find('.', 7) + 1))) c.set(n, t);
    };
    if (pr.kind == "decode-model1") {
      const emul::AttentionVariant v = fam[size_t(i) % fam.size()];
      r.attention_variant = v.name();
      for (const auto& [n, t] : family_attention(g, v)) keep(n, t);
    } else if (pr.kind == "train") {
      r.attention_variant = "TileLang's low-precision backward, f32 indexer loss, drawn orders";
      const TrainOutputs o = family_train(g, seed * 1000003u + uint64_t(i), writes.count("attn_bwd.dq") > 0,
                                          writes.count("indexer_loss.dq") > 0);
      for (const auto& [n, t] : o.f32) keep(n, t);
      for (const auto& [n, t] : o.bf16) keep(n, t);
    } else {
      const emul::AttentionVariant av = fam[size_t(i) % fam.size()];
      const emul::LogitsVariant lv = lfam[size_t(i / 2) % lfam.size()];
      if (writes.count("attn.out")) {
        r.attention_variant = av.name();
        const ref::AttentionOut o = emulate(g, 0, av, g.manifest["config"]["sm_scale"].get<float>());
        keep("layers.0.attn.out", o.out);
        keep("layers.0.attn.lse", o.lse);
        keep("layers.0.attn.max_logits", o.max_logits);
      }
      if (writes.count("indexer.logits") && has_fp8_logits(g, 0)) {
        r.logits_variant = lv.name();
        const Tensor<float> lg = emulate_logits(g, 0, lv);
        keep("layers.0.indexer.logits", lg);
        keep("layers.0.indexer.topk", k.topk(lg, g.tensor<int32_t>("layers.0.indexer.ks"), g.tensor<int32_t>("layers.0.indexer.ke"),
                                             g.manifest["config"]["topk"].get<int64_t>()));
      }
    }
    judge_strict(r, g, c, k, tmp);
  });
}

std::vector<PowerRow> values_power(const std::string& dir, int layer, const ref::Kernels& k, const std::string& tmp) {
  fs::create_directories(tmp);
  const golden::Loaded g = golden::read(dir);
  const ScoresLayer s = scores_layer(g, k, layer);
  const std::string p = "layers." + std::to_string(s.layer) + ".";
  const Tensor<float> base = emul::scores_f32(emul::scores_family()[0], s.q, s.k, s.w, s.scale, s.ks, s.ke);
  std::vector<PowerFault> faults;
  auto with = [&](Cand& c, const Tensor<float>& x) {
    c.set(p + "indexer.scores", x);
    c.set(p + s.positions, s.select(x));
  };
  faults.push_back({"indexer.scores scale, every element", "indexer.scores", [&](Cand& c, double e) {
                      Tensor<float> x = base;
                      for (float& v : x.data) if (std::isfinite(v)) v = float(double(v) * (1 + e));
                      with(c, x); }, "", ""});
  faults.push_back({"indexer.scores rounded to -log2(eps) bits (precision loss)", "indexer.scores", [&](Cand& c, double e) {
                      with(c, coarsened(base, e)); }, "", ""});
  std::vector<PowerRow> rows;
  for (const PowerFault& f : faults) rows.push_back(power_row(f, g, k, dir, tmp));
  return rows;
}

}  // namespace indexshare::calib

// ---- the catalogue of planted bugs --------------------------------------------------------------

namespace indexshare::calib {

namespace {

// Each bug plants its fault into a candidate; `expect` must stand in the first diagnosis.
struct Bug {
  Bug(std::string n, std::string e, std::function<void(Cand&)> p, std::function<std::string()> w = {})
      : name(std::move(n)), expect(std::move(e)), plant(std::move(p)), needs(std::move(w)) {}
  std::string name, expect;
  std::function<void(Cand&)> plant;
  // What the bug needs of the set it is planted on (empty: anything): "" when it applies, else why
  // not ("4 query rows: no rows 64-127"). Checked before planting.
  std::function<std::string()> needs;
};

// What the bugs are planted on: layer 0's correct outputs (the naive emulation's attention, the f32
// emulation's logits) and the ways to build a faulty one.
struct Planter {
  const golden::Loaded& g;
  const ref::Kernels& k;
  int64_t s_q, h_q, d_v, topk;
  float sm;
  emul::AttentionVariant naive = emul::attention_family()[0];
  LayerIn in0;
  ref::AttentionOut base;
  Tensor<float> logits;
  Tensor<int32_t> ks, ke;
  bool indexed;  // the set has layer 0's FP8 indexer (a decode-model1 set has none)
  Planter(const golden::Loaded& gs, const ref::Kernels& ks_)
      : g(gs), k(ks_), s_q(g.manifest["config"]["s_q"]), h_q(g.manifest["config"]["h_q"]), d_v(g.manifest["config"]["d_v"]),
        topk(g.manifest["config"]["topk"]), sm(g.manifest["config"]["sm_scale"].get<float>()), in0(layer_in(g, 0)),
        base(emulate(g, 0, naive, sm)), indexed(has_fp8_logits(g, 0)) {
    if (!indexed) return;
    logits = emulate_logits(g, 0, emul::logits_family()[0]);
    ks = g.tensor<int32_t>(P(0) + "indexer.ks");
    ke = g.tensor<int32_t>(P(0) + "indexer.ke");
  }
  static std::string P(int l) { return "layers." + std::to_string(l) + "."; }
  // The needs of the shape-dependent bugs (Bug::needs): "" when met.
  std::string rows_from(int64_t n) const { return s_q >= n ? "" : std::to_string(s_q) + " query rows (needs " + std::to_string(n) + ")"; }
  std::string sinked() const { return in0.sink ? "" : "no attention sink"; }
  std::string with_indexer() const { return indexed ? "" : "no indexer in the set"; }
  std::string fsfs() const {
    const nlohmann::json& ls = g.manifest["layers"];
    const bool ok = ls.size() >= 4 && ls[1]["kind"] == "shared" && ls[3]["kind"] == "shared" && g.find(P(1) + "indexer.logits");
    return ok ? "" : "no Shared layers 1 and 3 (an F S F S stack)";
  }
  ref::AttentionOut attention(const emul::AttentionVariant& v, const Tensor<int32_t>& indices, bool sink, float scale) const {
    return emul::attention(v, in0.q, in0.kv, indices, scale, d_v, nullptr, sink && in0.sink ? &*in0.sink : nullptr);
  }
  void set_attn(Cand& c, const ref::AttentionOut& o) const {
    c.set(P(0) + "attn.out", o.out);
    c.set(P(0) + "attn.lse", o.lse);
    c.set(P(0) + "attn.max_logits", o.max_logits);
  }
  ref::AttentionOut scaled_out(double eps, const std::function<bool(int64_t t, int64_t h, int64_t c)>& where) const {
    ref::AttentionOut o = base;
    for (int64_t t = 0; t < s_q; ++t)
      for (int64_t h = 0; h < h_q; ++h)
        for (int64_t c = 0; c < d_v; ++c)
          if (where(t, h, c)) { float& v = o.out[(t * h_q + h) * d_v + c]; v = float(double(v) * (1 + eps)); }
    return o;
  }
  template <class F>
  emul::AttentionVariant variant(F change) const { emul::AttentionVariant v = naive; change(v); return v; }
  Tensor<int32_t> without(bool last) const { return emul::drop_one_key(in0.indices, nullptr, in0.kv.dim(0), last); }
  Tensor<int32_t> topk_of(const Tensor<float>& lg, const Tensor<int32_t>& ke2) const { return k.topk(lg, ks, ke2, topk); }
  void set_indexer(Cand& c, const Tensor<float>& lg, const Tensor<int32_t>& tk) const {
    c.set(P(0) + "indexer.logits", lg);
    c.set(P(0) + "indexer.topk", tk);
  }
  Tensor<int32_t> shifted(int delta) const {  // the top-k of a causal window one key longer or shorter
    Tensor<int32_t> ke2 = ke;
    for (int64_t t = 0; t < s_q; ++t) ke2[t] = std::clamp<int32_t>(ke2[t] + delta, ks[t], int32_t(logits.dim(1)));
    const Tensor<float> l2 = k.logits_fp8(g.tensor<e4m3_t>(P(0) + "indexer.q"), g.tensor<e4m3_t>(P(0) + "indexer.k"),
                                          g.tensor<float>(P(0) + "indexer.k_scale"), g.tensor<float>(P(0) + "indexer.weights"), ks, ke2);
    return topk_of(l2, ke2);
  }
  Tensor<int32_t> rows(const Tensor<int32_t>& local, int l) const {  // local positions -> kv rows [s_q, 1, topk]
    Tensor<int32_t> kv = ref::local_to_kv_rows(local, g.tensor<int32_t>(P(l) + "indexer.ks"));
    kv.shape = {s_q, 1, topk};
    return kv;
  }
};

constexpr double kPlanted = 0.004;  // 0.4 %: a small systematic error, well inside every per-element bound

std::vector<Bug> attention_bugs(const Planter& p) {
  return {
      {"attn.out scale, every element", "attn.out scale error", [&](Cand& c) { p.set_attn(c, p.scaled_out(kPlanted, [](int64_t, int64_t, int64_t) { return true; })); }},
      {"attn.out scale, head 3", "head 3 only", [&](Cand& c) { p.set_attn(c, p.scaled_out(kPlanted, [](int64_t, int64_t h, int64_t) { return h == 3; })); },
       [&] { return p.h_q > 3 ? "" : std::to_string(p.h_q) + " heads: no head 3"; }},
      {"attn.out scale, columns = 0 mod 8", "columns = 0 mod 8 only", [&](Cand& c) { p.set_attn(c, p.scaled_out(kPlanted, [](int64_t, int64_t, int64_t col) { return col % 8 == 0; })); }},
      {"attn.out scale, rows 64-127", "rows 64-127", [&](Cand& c) { p.set_attn(c, p.scaled_out(kPlanted, [](int64_t t, int64_t, int64_t) { return t >= 64 && t < 128; })); },
       [&] { return p.rows_from(128); }},
      {"attn.out 0.4% low on every other row", "rows = 0 mod 2 only", [&](Cand& c) { p.set_attn(c, p.scaled_out(-kPlanted, [](int64_t t, int64_t, int64_t) { return t % 2 == 0; })); },
       [&] { return p.rows_from(2); }},
      {"attn.out wrong beyond row 64", "rows from 64 on", [&](Cand& c) { p.set_attn(c, p.scaled_out(kPlanted, [](int64_t t, int64_t, int64_t) { return t >= 64; })); },
       [&] { return p.rows_from(128); }},
      {"attn.out scale 0.28% low (as large as truncation)", "attn.out scale error 0.997", [&](Cand& c) {
         ref::AttentionOut o = p.scaled_out(-0.0028, [](int64_t, int64_t, int64_t) { return true; });
         for (float& v : o.out.data) v = round_bf16(v);
         p.set_attn(c, o); }},
      {"attn.out offset", "attn.out offset", [&](Cand& c) {
         ref::AttentionOut o = p.base;
         const double r = cmp::rms_finite(p.base.out);
         for (float& v : o.out.data) v = float(double(v) + kPlanted * r);
         p.set_attn(c, o); }},
      {"softmax scale 1% off", "softmax scale", [&](Cand& c) { p.set_attn(c, p.attention(p.naive, p.in0.indices, true, float(double(p.sm) * 1.01))); }},
      {"attn.lse in base 2", "attn.lse is in base 2", [&](Cand& c) {
         ref::AttentionOut o = p.base;
         for (float& v : o.lse.data) v = float(double(v) / std::log(2.0));
         p.set_attn(c, o); }},
      {"attn.lse includes the sink", "attn.lse includes the attention sink", [&](Cand& c) {
         ref::AttentionOut o = p.base;
         for (int64_t i = 0; i < o.lse.numel(); ++i) {
           const double x = o.lse[i], s = (*p.in0.sink)[i % p.h_q], m = std::max(x, s);
           o.lse[i] = float(m + std::log(std::exp(x - m) + std::exp(s - m)));
         }
         p.set_attn(c, o); }, [&] { return p.sinked(); }},
      {"attn.out without the sink", "attn.out ignores the attention sink", [&](Cand& c) {
         ref::AttentionOut o = p.attention(p.naive, p.in0.indices, false, p.sm);
         o.lse = p.base.lse;
         p.set_attn(c, o); }, [&] { return p.sinked(); }},
      {"attn.max_logits in base 2", "attn.max_logits is in base-2 units", [&](Cand& c) {
         ref::AttentionOut o = p.base;
         for (float& v : o.max_logits.data) v = float(double(v) / std::log(2.0));
         p.set_attn(c, o); }},
      {"each row's last key dropped", "without each row's last key", [&](Cand& c) { p.set_attn(c, p.attention(p.naive, p.without(true), true, p.sm)); }},
      {"each row's first key dropped", "without each row's first key", [&](Cand& c) { p.set_attn(c, p.attention(p.naive, p.without(false), true, p.sm)); }},
      {"attn.out truncated to bf16", "toward zero", [&](Cand& c) {
         ref::AttentionOut o = p.attention(p.variant([](emul::AttentionVariant& v) { v.out_bf16 = false; }), p.in0.indices, true, p.sm);
         for (float& v : o.out.data) { uint32_t u; std::memcpy(&u, &v, 4); u &= 0xFFFF0000u; std::memcpy(&v, &u, 4); }
         p.set_attn(c, o); }},
      {"P.V accumulated in bf16", "bf16-acc-level", [&](Cand& c) { p.set_attn(c, p.attention(p.variant([](emul::AttentionVariant& v) { v.acc_bf16 = true; }), p.in0.indices, true, p.sm)); }},
      {"q.k logits rounded to bf16", "bf16-logits-level", [&](Cand& c) { p.set_attn(c, p.attention(p.variant([](emul::AttentionVariant& v) { v.logits_bf16 = true; }), p.in0.indices, true, p.sm)); }},
      {"q.k products rounded to bf16", "bf16-products-level", [&](Cand& c) { p.set_attn(c, p.attention(p.variant([](emul::AttentionVariant& v) { v.products_bf16 = true; }), p.in0.indices, true, p.sm)); }},
  };
}

std::vector<Bug> indexer_bugs(const Planter& p) {
  return {
      {"indexer logits in bf16", "indexer.logits carries bf16-level", [&](Cand& c) {
         Tensor<float> lg = p.logits;
         for (float& v : lg.data) v = round_bf16(v);
         c.set(p.P(0) + "indexer.logits", lg); }},
      {"indexer logits scale", "indexer.logits scale error", [&](Cand& c) {
         Tensor<float> lg = p.logits;
         for (float& v : lg.data) if (std::isfinite(v)) v = float(double(v) * 1.004);
         c.set(p.P(0) + "indexer.logits", lg); }},
      {"indexer logits scale, keys = 0 mod 8", "columns = 0 mod 8 only", [&](Cand& c) {
         Tensor<float> lg = p.logits;
         const int64_t s_kv = lg.dim(1);
         for (int64_t i = 0; i < lg.numel(); ++i) if (std::isfinite(lg[i]) && (i % s_kv) % 8 == 0) lg[i] = float(double(lg[i]) * 1.004);
         c.set(p.P(0) + "indexer.logits", lg); }},
      {"top-k from bf16 scores", "bf16-level", [&](Cand& c) {
         Tensor<float> lg = p.logits;
         for (float& v : lg.data) v = round_bf16(v);
         p.set_indexer(c, lg, p.topk_of(lg, p.ke)); }},
      {"causal bound one key too long", "one key too long", [&](Cand& c) { c.set(p.P(0) + "indexer.topk", p.shifted(+1)); }},
      {"causal bound one key too short", "one key too short", [&](Cand& c) { c.set(p.P(0) + "indexer.topk", p.shifted(-1)); }},
      {"Shared layer recomputes its top-k", "own fresh top-k", [&](Cand& c) {
         c.set(p.P(1) + "attn.indices", p.rows(p.k.topk(p.g.tensor<float>(p.P(1) + "indexer.logits"), p.g.tensor<int32_t>(p.P(1) + "indexer.ks"),
                                                  p.g.tensor<int32_t>(p.P(1) + "indexer.ke"), p.topk), 1)); }, [&] { return p.fsfs(); }},
      {"Shared layer takes another Full layer's positions", "Full layer 0's positions", [&](Cand& c) {
         c.set(p.P(3) + "attn.indices", p.g.tensor<int32_t>(p.P(0) + "attn.indices")); }, [&] { return p.fsfs(); }},
  };
}

// FlashMLA's MODEL1 two-scope decode (a decode-model1 set): attn.indices row b * next_n + t is the
// window's slots model1.indices[b, t, j < topk_length[b]], then main_slots + the compressed entries'
// model1.extra_indices[b, t, j < extra_topk_length[b]], -1 elsewhere. Each bug rebuilds that mapping
// as a kernel that got it wrong would (golden::model1_attn_indices); the judge tests each.
std::vector<Bug> model1_bugs(const Planter& p) {
  auto with = [&p](Cand& c, const golden::Model1Mapping& m) {
    p.set_attn(c, p.attention(p.naive, golden::model1_attn_indices(p.g, m), true, p.sm));
  };
  return {
      {"MODEL1: topk_length ignored (the window's dropped slots attended)", "topk_length ignored", [with](Cand& c) {
         with(c, {false, true, true, true}); }},
      {"MODEL1: extra_topk_length ignored", "extra_topk_length ignored", [with](Cand& c) { with(c, {true, false, true, true}); }},
      {"MODEL1: the extra scope left out", "the extra scope left out", [with](Cand& c) { with(c, {true, true, false, true}); }},
      {"MODEL1: extra indices read in the main cache (no main_slots offset)", "no main_slots offset", [with](Cand& c) {
         with(c, {true, true, true, false}); }},
  };
}

// Training (a train set's layer 0): the attention backward's and the indexer loss's usual bugs,
// each recomputed from the set's inputs as a kernel with that bug would compute it.
struct TrainPlanter {
  const golden::Loaded& g;
  const ref::Kernels& k;
  float sm;
  int64_t d_v;
  const std::string P = "layers.0.";
  TrainPlanter(const golden::Loaded& gs, const ref::Kernels& ks)
      : g(gs), k(ks), sm(g.manifest["config"]["sm_scale"].get<float>()), d_v(g.manifest["config"]["d_v"].get<int64_t>()) {}
  Tensor<float> t(const std::string& n) const { return g.tensor<float>(P + n); }
  static Tensor<float> times(Tensor<float> x, double f) {
    for (float& v : x.data) v = float(double(v) * f);
    return x;
  }
  std::optional<Tensor<float>> sink() const { return g.find(P + "attn.sink") ? std::optional(t("attn.sink")) : std::nullopt; }
  ref::AttentionBackwardOut backward(const Tensor<int32_t>& ind, bool bf16_acc = false) const {
    const std::optional<Tensor<float>> s = sink();
    return cmp::emulate_attention_backward_lowp(g.tensor<bf16_t>(P + "attn.q"), g.tensor<bf16_t>(P + "attn.kv"), ind, sm, d_v,
                                                g.tensor<bf16_t>(P + "attn.d_out"), nullptr, s ? &*s : nullptr, bf16_acc);
  }
  Tensor<int32_t> indices() const { return g.tensor<int32_t>(P + "attn.indices"); }
  std::string padded() const {
    const Tensor<int32_t> ind = indices();
    return std::count(ind.data.begin(), ind.data.end(), -1) ? "" : "no -1 padding in attn.indices";
  }
  // dkv without its V part (sum_t P dO over the shared latent's first d_v columns).
  Tensor<float> dkv_without_v() const {
    Tensor<float> x = t("attn_bwd.dkv");
    const Tensor<float> p = t("attn_bwd.p");
    const Tensor<bf16_t> dO = g.tensor<bf16_t>(P + "attn.d_out");
    const Tensor<int32_t> ind = indices();
    const int64_t s_q = dO.dim(0), h = dO.dim(1), k_ = ind.dim(2), dqk = x.dim(2);
    for (int64_t r = 0; r < s_q; ++r)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t j = 0; j < k_; ++j) {
          const int32_t i = ind[r * k_ + j];
          if (i < 0 || i >= x.dim(0)) continue;
          for (int64_t c = 0; c < d_v; ++c)
            x[i * dqk + c] = float(double(x[i * dqk + c]) - double(p[(r * h + hh) * k_ + j]) * bf16_to_f32(dO[(r * h + hh) * d_v + c]));
        }
    return x;
  }
  // The indexer loss of layer 0 with the set's options changed by `change`.
  ref::train::IndexerLossOut loss(const std::function<void(ref::train::IndexerLossOptions&)>& change) const {
    const nlohmann::json& tr = g.manifest["train"];
    ref::train::IndexerLossOptions o;
    o.relu = tr["relu"].get<bool>();
    o.sparse = tr["loss"] == "sparse";
    o.loss_coeff = tr["loss_coeff"].get<double>();
    o.target = ref::train::parse_target(tr["target"].get<std::string>());
    change(o);
    std::vector<int> teachers;
    for (const nlohmann::json& e : tr["indexer_losses"])
      if (e["layer"] == 0) teachers = e["teachers"].get<std::vector<int>>();
    std::vector<Tensor<bf16_t>> tq, tkv;
    for (int m : teachers) {
      tq.push_back(g.tensor<bf16_t>("layers." + std::to_string(m) + ".attn.q"));
      tkv.push_back(g.tensor<bf16_t>("layers." + std::to_string(m) + ".attn.kv"));
    }
    std::vector<ref::train::TeacherLayer> tl;
    for (size_t i = 0; i < teachers.size(); ++i) tl.push_back({&tq[i], &tkv[i], sm, nullptr});
    const Tensor<int32_t> topk = g.tensor<int32_t>(P + "indexer.topk");
    return k.indexer_loss(bf16_to_f32(g.tensor<bf16_t>(P + "indexer.q")), bf16_to_f32(g.tensor<bf16_t>(P + "indexer.k")),
                          t("indexer.weights"), g.tensor<int32_t>(P + "indexer.ks"), g.tensor<int32_t>(P + "indexer.ke"),
                          o.sparse ? &topk : nullptr, tl, o);
  }
  void set_loss(Cand& c, const ref::train::IndexerLossOut& r) const {
    c.set(P + "indexer_loss.loss", Tensor<float>({1}, float(r.loss)));
    c.set(P + "indexer_loss.dq", r.dq);
    c.set(P + "indexer_loss.dk", r.dk);
    c.set(P + "indexer_loss.dw", r.dw);
  }
};

std::vector<Bug> train_bugs(const TrainPlanter& p) {
  const bool has_loss = p.g.find(p.P + "indexer_loss.dq") != nullptr;
  auto loss_needs = [has_loss] { return has_loss ? std::string() : std::string("no indexer loss on layer 0"); };
  return {
      {"train: attn_bwd.dq 1% too large (TileLang's similarity passes it)", "scale error", [&p](Cand& c) {
         c.set(p.P + "attn_bwd.dq", p.times(p.t("attn_bwd.dq"), 1.01)); }},
      {"train: the softmax scale applied twice in dq", "the softmax scale applied twice", [&p](Cand& c) {
         c.set(p.P + "attn_bwd.dq", p.times(p.t("attn_bwd.dq"), p.sm)); }},
      {"train: dkv without its V part", "misses the V part", [&p](Cand& c) { c.set(p.P + "attn_bwd.dkv", p.dkv_without_v()); }},
      {"train: -1 padding read as kv row s_kv - 1", "-1 treated as a key", [&p](Cand& c) {
         Tensor<int32_t> ind = p.indices();
         const int32_t last = int32_t(p.g.get(p.P + "attn.kv").shape[0] - 1);
         for (int32_t& v : ind.data) if (v == -1) v = last;
         const ref::AttentionBackwardOut b = p.backward(ind);
         c.set(p.P + "attn_bwd.dq", b.dq);
         c.set(p.P + "attn_bwd.dkv", b.dkv); }, [&p] { return p.padded(); }},
      {"train: dq and dkv accumulated in bf16", "bf16-acc-level", [&p](Cand& c) {
         const ref::AttentionBackwardOut b = p.backward(p.indices(), true);
         c.set(p.P + "attn_bwd.dq", b.dq);
         c.set(p.P + "attn_bwd.dkv", b.dkv); }},
      {"train: the indexer loss's dq 0.5% too large", "scale error", [&p](Cand& c) {
         c.set(p.P + "indexer_loss.dq", p.times(p.t("indexer_loss.dq"), 1.005)); }, loss_needs},
      {"train: the per-token loss (no division by the valid rows)", "scale error", [&p](Cand& c) {
         p.set_loss(c, p.loss([](ref::train::IndexerLossOptions& o) { o.per_token = true; })); }, loss_needs},
      {"train: the indexer loss without its ReLU", "", [&p](Cand& c) {
         p.set_loss(c, p.loss([](ref::train::IndexerLossOptions& o) { o.relu = !o.relu; })); }, loss_needs},
      {"train: the dense loss on a sparse set (top-k ignored)", "", [&p](Cand& c) {
         p.set_loss(c, p.loss([](ref::train::IndexerLossOptions& o) { o.sparse = false; })); },
       [&p, loss_needs] { return !loss_needs().empty() ? loss_needs() : p.g.manifest["train"]["loss"] == "sparse" ? "" : "a dense loss"; }},
  };
}

}  // namespace

CatalogueRow judge_bug(const golden::Loaded& g, const std::vector<io::TensorView>& candidate, const std::string& bug,
                       const std::string& expect, const ref::Kernels& k, const std::string& path) {
  io::write_safetensors(path, candidate);
  const diff::Result r = diff::judge(g, io::read_safetensors(path), {}, k, false);
  CatalogueRow row{bug, expect, r.diagnoses.empty() ? "" : r.diagnoses[0], r.failed(), false, false, ""};
  if (expect.empty()) {  // a bug no hypothesis covers: right when nothing is named
    row.named_first = row.named = row.failed && r.diagnoses.empty();
    return row;
  }
  row.named_first = row.failed && row.first.find(expect) != std::string::npos;
  for (const std::string& d : r.diagnoses) row.named = row.named || d.find(expect) != std::string::npos;
  return row;
}

std::string CatalogueRow::outcome() const {
  if (!not_applicable.empty()) return "n/a";
  if (!failed) return "passed";
  if (named_first) return "right";
  return first.empty() ? "missing" : "wrong";
}

std::vector<CatalogueRow> catalogue_preset(const std::string& name, const ref::Kernels& k, const std::string& tmp,
                                           const std::function<void(const CatalogueRow&)>& progress) {
  const golden::Preset& pr = golden::preset(name);  // Error naming the unknown preset
  require(!pr.kernel.empty() && (pr.kind == "stack" || pr.kind == "decode" || pr.kind == "decode-model1" || pr.kind == "train"),
          "calibrate --catalogue --preset: '" + name + "' is not a kernel preset (stack, decode, decode-model1 or train; the 2026 "
          "families' catalogue runs on their tiny presets)");
  const kreg::Kernel& kern = kreg::kernel(pr.kernel);
  std::set<std::string> outputs;  // the tensors the kernel writes, without their layer prefix
  for (const kreg::Arg& a : kern.outputs) outputs.insert(a.tensor.substr(a.tensor.rfind("}.") + 2));
  fs::create_directories(tmp);
  const std::string dir = tmp + "/golden";
  const std::string replay = "indexshare calibrate --catalogue --preset " + name;
  const bool train = pr.kind == "train";
  golden::write(dir,
                pr.kind == "decode-model1" ? golden::build_model1_decode(golden::parse_model1_spec(pr.problem), replay, Impl::simd)
                : train                    ? golden::build_train(parse_problem(pr.problem), golden::TrainSpec(), replay, Impl::simd)
                                           : golden::build(parse_problem(pr.problem), pr.kind, true, replay, Impl::simd),
                true);
  const golden::Loaded g = golden::read(dir);
  std::optional<Planter> pl;
  std::optional<TrainPlanter> tp;
  std::vector<Bug> bugs;
  // The correct outputs the bugs are planted into: a planted tensor equal to its correct one carries
  // nothing of the bug.
  Cand ok;
  if (train) {
    tp.emplace(g, k);
    bugs = train_bugs(*tp);
    for (const char* n : {"attn_bwd.dq", "attn_bwd.dkv", "indexer_loss.loss", "indexer_loss.dq", "indexer_loss.dk", "indexer_loss.dw"})
      if (g.find(tp->P + n)) ok.set(tp->P + n, g.tensor<float>(tp->P + n));
  } else {
    pl.emplace(g, k);
    const Planter& p = *pl;
    bugs = attention_bugs(p);
    for (Bug& b : indexer_bugs(p)) {
      if (!p.indexed) b.needs = [&p] { return p.with_indexer(); };
      bugs.push_back(std::move(b));
    }
    if (pr.kind == "decode-model1")
      for (Bug& b : model1_bugs(p)) bugs.push_back(std::move(b));
    p.set_attn(ok, p.base);
    if (p.indexed) p.set_indexer(ok, p.logits, p.topk_of(p.logits, p.ke));
  }
  auto unchanged = [&ok](const io::TensorView& v) {
    for (const io::TensorView& o : ok.views)
      if (o.name == v.name)
        return o.bytes.size() == v.bytes.size() && std::equal(o.bytes.data(), o.bytes.data() + o.bytes.size(), v.bytes.data());
    return false;
  };
  std::vector<CatalogueRow> out;
  for (const Bug& b : bugs) {
    std::string why = b.needs ? b.needs() : "";
    Cand c;
    if (why.empty()) {
      b.plant(c);
      // The candidate holds what the kernel writes; the bug applies when one of those tensors carries it.
      std::vector<io::TensorView> kept;
      std::string elsewhere;
      bool carries = false;
      for (const io::TensorView& v : c.views) {
        const std::string t = v.name.substr(v.name.find('.', 7) + 1);
        if (outputs.count(t)) {
          kept.push_back(v);
          carries = carries || !unchanged(v);
        } else if (!unchanged(v)) {
          elsewhere += (elsewhere.empty() ? "" : ", ") + t;
        }
      }
      c.views = std::move(kept);
      if (!carries)
        why = elsewhere.empty() ? "planted here it changes nothing (every planted tensor equals the correct one)"
                                : "the bug is in " + elsewhere + ", which " + pr.kernel + " does not write";
    }
    if (!why.empty()) {
      CatalogueRow row{b.name, b.expect, "", false, false, false, ""};
      row.not_applicable = why;
      out.push_back(row);
    } else {
      out.push_back(judge_bug(g, c.views, b.name, b.expect, k, tmp + "/catalogue.safetensors"));
    }
    if (progress) progress(out.back());
  }
  return out;
}

std::vector<CatalogueRow> catalogue(const ref::Kernels& k, const std::string& tmp, const std::function<void(const CatalogueRow&)>& progress) {
  fs::create_directories(tmp);
  const std::string dir = tmp + "/golden";
  golden::write(dir, golden::build(parse_problem(kCatalogueProblem), "stack", true, "indexshare calibrate --catalogue", Impl::simd), true);
  const golden::Loaded g = golden::read(dir);
  const Planter p(g, k);
  std::vector<Bug> bugs = attention_bugs(p);
  for (Bug& b : indexer_bugs(p)) bugs.push_back(std::move(b));
  std::vector<CatalogueRow> out;
  for (const Bug& b : bugs) {
    Cand c;
    b.plant(c);
    out.push_back(judge_bug(g, c.views, b.name, b.expect, k, tmp + "/catalogue.safetensors"));
    if (progress) progress(out.back());
  }
  for (CatalogueRow& row : family_catalogue(k, tmp, progress)) out.push_back(std::move(row));
  return out;
}

}  // namespace indexshare::calib
