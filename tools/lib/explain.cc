#include "tools/lib/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <set>
#include <tuple>
#include <sstream>
#include <vector>

#include "ref/attention.h"
#include "tools/judge/compare.h"
#include "ref/error.h"
#include "ref/numerics.h"
#include "ref/topk.h"
#include "tools/judge/diff.h"

namespace indexshare::explain {

namespace {

using nlohmann::json;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string g6(double v) { return fmt("%.6g", v); }

// Row t of x as a tensor of one row ([1, ...]).
template <class T>
Tensor<T> row_of(const Tensor<T>& x, int64_t t) {
  Shape s = x.shape;
  const int64_t n = x.numel() / s[0];
  s[0] = 1;
  Tensor<T> r(s);
  std::copy(x.data.begin() + t * n, x.data.begin() + (t + 1) * n, r.data.begin());
  return r;
}

// "0-3, 17, 40-42": ascending values as ranges.
std::string ranges(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += std::to_string(v[i]);
    if (j > i) {
      s += '-';
      s += std::to_string(v[j]);
    }
    i = j + 1;
  }
  return s.empty() ? "(none)" : s;
}

// The sequence of row t: from cu_seqlens_q; -1 when the set has none (one sequence, or sampled).
int64_t sequence_of(const golden::Loaded& g, int64_t t) {
  const io::TensorView* v = g.find("cu_seqlens_q");
  if (!v) return -1;
  const Tensor<int32_t> cu = io::as_tensor<int32_t>(*v, g.dir);
  for (int64_t i = 0; i + 1 < cu.numel(); ++i)
    if (t >= cu[i] && t < cu[i + 1]) return i;
  return -1;
}

struct Ctx {
  const golden::Loaded& g;
  const Options& o;
  int64_t s_q, s_kv, topk, h_q, d_v, head;
  float sm;
  diff::GoldenLayer d, src;  // the layer, and the layer whose indexer chose its positions
  std::ostringstream os;
};

// The row's logits in the source layer's order (score descending, then index ascending), with
// the k-th score and its ties marked.
void indexer_section(Ctx& c) {
  const diff::GoldenLayer& s = c.src;
  const int64_t t = c.o.row, ks = s.ks[t], ke = s.ke[t], len = ke - ks, k_eff = std::min(c.topk, len);
  std::vector<int64_t> order;
  for (int64_t p = 0; p < len; ++p) order.push_back(p);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ref::topk_before(s.logits.at(t, ks + a), a, s.logits.at(t, ks + b), b);
  });
  std::set<int64_t> sel;
  for (int64_t j = 0; j < c.topk; ++j) if (s.topk.at(t, j) >= 0) sel.insert(s.topk.at(t, j));
  c.os << "indexer   " << (c.d.full ? "this layer's" : "layer " + std::to_string(s.l) + "'s (it chose the positions)")
       << " logits of the row, largest first (tie rule: score descending, then index ascending)\n";
  if (len == 0) { c.os << "          the window is empty: nothing is selected\n"; return; }
  const bool selects = len > c.topk;
  const float kth = s.logits.at(t, ks + order[size_t(k_eff - 1)]);
  std::vector<int64_t> ties;  // ranks (0-based) of positions scoring exactly the k-th score
  if (selects)
    for (int64_t r = 0; r < len; ++r) if (s.logits.at(t, ks + order[size_t(r)]) == kth) ties.push_back(r);
  const bool boundary_tie = ties.size() > 1;
  std::set<int64_t> shown;
  for (int64_t r = 0; r < std::min(c.o.top, len); ++r) shown.insert(r);
  if (selects) {  // around the boundary: the k-th, every tie with it, and the first one out
    shown.insert(k_eff - 1);
    for (int64_t r : ties) shown.insert(r);
    if (k_eff < len) shown.insert(ties.empty() ? k_eff : std::max(k_eff, ties.back() + 1));
  }
  c.os << "          rank  position  kv_row  logit\n";
  int64_t prev = -1;
  for (int64_t r : shown) {
    if (r >= len) continue;
    if (prev >= 0 && r != prev + 1) c.os << "           ...\n";
    prev = r;
    const int64_t p = order[size_t(r)];
    char line[160];
    std::snprintf(line, sizeof line, "          %4lld  %8lld  %6lld  %-13.7g", (long long)(r + 1), (long long)p, (long long)(ks + p),
                  double(s.logits.at(t, ks + p)));
    std::string mark = sel.count(p) ? "selected" : "-";
    if (selects && r == k_eff - 1) mark += "  <- k-th score";
    if (boundary_tie && s.logits.at(t, ks + p) == kth) mark += "  TIE at the boundary";
    c.os << line << "  " << mark << "\n";
  }
  if (!selects) {
    c.os << "          the window (" << len << " keys) is not longer than top-k (" << c.topk
         << "): every visible key is selected, the rest of the slots are -1\n";
    return;
  }
  c.os << "          k-th score " << g6(kth) << ": ";
  if (boundary_tie) {
    int64_t in = 0;
    for (int64_t r : ties) in += r < k_eff;
    c.os << ties.size() << " positions tie with it, " << in << " selected and " << ties.size() - size_t(in)
         << " not (by index ascending); any " << in << " of them is a correct selection\n";
  } else {
    c.os << "no other position ties with it (margin to the next: " << g6(double(kth) - double(s.logits.at(t, ks + order[size_t(k_eff)])))
         << ")\n";
  }
}

void selected_section(Ctx& c) {
  const int64_t t = c.o.row;
  std::vector<int64_t> kv;
  const int64_t n_slots = c.d.topk_length.numel() ? std::min<int64_t>(c.topk, c.d.topk_length[t]) : c.topk;
  for (int64_t j = 0; j < n_slots; ++j) {
    const int32_t r = c.d.indices[t * c.topk + j];
    if (r >= 0 && r < c.s_kv) kv.push_back(r);
  }
  std::sort(kv.begin(), kv.end());
  c.os << "selected  " << kv.size() << " kv rows used by the attention (attn.indices, ascending): " << ranges(kv) << "\n";
  if (c.src.has_indexer) {
    std::vector<int64_t> local;
    for (int64_t r : kv) local.push_back(r - c.src.ks[t]);
    c.os << "          as sequence-local positions (indexer.topk of layer " << c.src.l << "): " << ranges(local) << "\n";
  }
  if (!c.d.full && c.d.has_indexer) {  // IndexShare: what the layer's own indexer would have chosen
    std::set<int32_t> own, used;
    for (int64_t j = 0; j < c.topk; ++j) {
      if (c.d.topk.at(t, j) >= 0) own.insert(c.d.topk.at(t, j));
      if (c.src.topk.at(t, j) >= 0) used.insert(c.src.topk.at(t, j));
    }
    int64_t common = 0;
    for (int32_t p : own) common += used.count(p);
    c.os << "shared    layer " << c.d.l << " reuses layer " << c.src.l << "'s positions; its own top-k would share " << common
         << " of " << own.size() << " with them (recall " << fmt("%.3f", own.empty() ? 1.0 : double(common) / double(own.size()))
         << ")\n";
  }
}

void attention_section(Ctx& c) {
  const int64_t t = c.o.row, d_qk = c.d.q.dim(2);
  std::vector<int64_t> rows;
  const int64_t n_slots = c.d.topk_length.numel() ? std::min<int64_t>(c.topk, c.d.topk_length[t]) : c.topk;
  for (int64_t j = 0; j < n_slots; ++j) {
    const int32_t r = c.d.indices[t * c.topk + j];
    if (r >= 0 && r < c.s_kv) rows.push_back(r);
  }
  c.os << "attention sm_scale " << g6(c.sm) << ", " << rows.size() << " valid slots; per head (sink factor = 1 / (1 + exp(sink - lse)) "
       << "scales out; lse and max_logits exclude the sink):\n";
  c.os << "          head  max_logits     lse            sink factor\n";
  for (int64_t h = 0; h < c.h_q; ++h) {
    const double lse = c.d.lse.at(t, h), ml = c.d.max_logits.at(t, h);
    std::string sink = "(no sink)";
    if (c.d.sink) sink = g6(1.0 / (1.0 + std::exp(double((*c.d.sink)[h]) - lse))) + " (sink " + g6((*c.d.sink)[h]) + ")";
    char line[200];
    std::snprintf(line, sizeof line, "          %4lld  %-13.7g  %-13.7g  %s\n", (long long)h, ml, lse, sink.c_str());
    c.os << line;
  }
  if (rows.empty()) { c.os << "          no valid index: out 0, lse +inf, max_logits -inf\n"; return; }
  // Weights of head H: softmax of the exact logits, exp(P_i - lse) with the golden lse.
  const int64_t h = c.head;
  std::vector<std::pair<double, int64_t>> w;
  for (int64_t r : rows) {
    double dot = 0;
    for (int64_t e = 0; e < d_qk; ++e) dot += double(bf16_to_f32(c.d.q.at(t, h, e))) * double(bf16_to_f32(c.d.kv[r * d_qk + e]));
    w.push_back({dot * double(c.sm), r});
  }
  for (auto& [p, r] : w) p = std::exp(p - double(c.d.lse.at(t, h)));
  std::stable_sort(w.begin(), w.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double shown = 0;
  c.os << "          head " << h << ": the heaviest positions (weight = softmax of q.k * sm_scale, before the sink factor)\n";
  c.os << "          kv_row  weight\n";
  for (size_t i = 0; i < w.size() && int64_t(i) < c.o.top; ++i) {
    char line[96];
    std::snprintf(line, sizeof line, "          %6lld  %.6f\n", (long long)w[i].second, w[i].first);
    c.os << line;
    shown += w[i].first;
  }
  c.os << "          these " << std::min<int64_t>(c.o.top, int64_t(w.size())) << " of " << w.size() << " carry " << fmt("%.1f", 100 * shown)
       << "% of the weight\n";
}

// ---- the candidate on this row ----

struct Departure {
  std::string where;
  double ratio = 0;
};

void candidate_sets(Ctx& c, const std::string& what, const std::set<int64_t>& gold, const std::set<int64_t>& cand,
                    const std::vector<int64_t>& outside, const std::function<double(int64_t)>& score, std::vector<Departure>& dep) {
  std::vector<int64_t> missing, extra;
  for (int64_t p : gold) if (!cand.count(p)) missing.push_back(p);
  for (int64_t p : cand) if (!gold.count(p)) extra.push_back(p);
  std::vector<double> sm, se;
  for (int64_t p : missing) sm.push_back(score(p));
  for (int64_t p : extra) se.push_back(score(p));
  std::sort(sm.begin(), sm.end());
  std::sort(se.begin(), se.end());
  c.os << "  " << what << ": ";
  if (!outside.empty()) {
    c.os << "holds " << ranges(outside) << " outside the row's window: malformed\n";
    dep.push_back({what + " (positions outside the window)", std::numeric_limits<double>::infinity()});
    return;
  }
  if (missing.empty() && extra.empty()) { c.os << "the golden's set\n"; return; }
  c.os << "missing " << ranges(missing) << ", extra " << ranges(extra);
  if (sm == se) { c.os << ": the same scores (ties), a correct selection\n"; return; }
  c.os << ": scores differ (a true winner is missing)\n";
  dep.push_back({what + " (missing " + ranges(missing) + ")", std::numeric_limits<double>::infinity()});
}

// The candidate's indexer.logits on the row against the judge's per-element bound (the FP8 rule, or
// the bf16 indexer's): the largest err / bound and how many keys are over theirs.
void candidate_logits(Ctx& c, const io::SafetensorsFile& f, const std::string& p, std::vector<Departure>& dep) {
  const int64_t t = c.o.row;
  require(c.d.has_indexer, f.source + ": " + p + "indexer.logits: layer " + std::to_string(c.d.l) + " has no indexer in the golden set");
  const Tensor<float> cl = diff::candidate_float(f, p + "indexer.logits", {c.s_q, c.s_kv});
  std::vector<float> bound(size_t(c.s_kv), 0.0f);
  if (c.g.get(p + "indexer.q").dtype == io::DType::F8_E4M3) {
    bound = cmp::indexer_logits_rule(row_of(c.g.tensor<e4m3_t>(p + "indexer.q"), t), c.g.tensor<e4m3_t>(p + "indexer.k"),
                                     c.g.tensor<float>(p + "indexer.k_scale"), row_of(c.g.tensor<float>(p + "indexer.weights"), t),
                                     row_of(c.d.logits, t)).bound;
  } else {
    for (int64_t s = 0; s < c.s_kv; ++s)
      if (std::isfinite(c.d.logits.at(t, s))) bound[size_t(s)] = cmp::bound_f32(4 * std::sqrt(double(c.topk) + 2) * 0x1p-14 * std::fabs(double(c.d.logits.at(t, s))));
  }
  double worst = -1;
  int64_t at = -1, over = 0;
  for (int64_t s = 0; s < c.s_kv; ++s) {
    const double e = c.d.logits.at(t, s), x = cl.at(t, s);
    double r;
    if (!std::isfinite(e) || !std::isfinite(x)) r = (e == x) ? 0 : std::numeric_limits<double>::infinity();
    else r = bound[size_t(s)] > 0 ? std::fabs(x - e) / bound[size_t(s)] : (x == e ? 0 : std::numeric_limits<double>::infinity());
    over += r > 1;
    if (r > worst) { worst = r; at = s; }
  }
  c.os << "  indexer.logits: largest err / bound " << g6(worst) << " at kv row " << at << " (expected " << g6(c.d.logits.at(t, at))
       << ", got " << g6(cl.at(t, at)) << "); " << over << " of " << c.s_kv << " over their bound\n";
  dep.push_back({"indexer.logits at kv row " + std::to_string(at), worst});
}

void candidate_section(Ctx& c, const io::SafetensorsFile& f) {
  const int64_t t = c.o.row;
  const std::string p = "layers." + std::to_string(c.d.l) + ".";
  std::vector<std::string> notes;
  std::vector<Departure> dep;
  c.os << "candidate " << f.source << " on this row (err / bound: the judge's derived per-element bound; > 1 fails):\n";
  bool any = false;
  if (f.find(p + "indexer.logits")) {
    any = true;
    candidate_logits(c, f, p, dep);
  }
  if (f.find(p + "indexer.topk")) {
    any = true;
    require(c.d.has_indexer, f.source + ": " + p + "indexer.topk: layer " + std::to_string(c.d.l) + " has no indexer in the golden set");
    const Tensor<int32_t> ct = diff::candidate_int(f, p + "indexer.topk", {c.s_q, c.topk}, notes);
    const int64_t len = c.d.ke[t] - c.d.ks[t];
    std::set<int64_t> gold, cand;
    std::vector<int64_t> outside;
    for (int64_t j = 0; j < c.topk; ++j) {
      if (c.d.topk.at(t, j) >= 0) gold.insert(c.d.topk.at(t, j));
      const int32_t v = ct.at(t, j);
      if (v == -1) continue;
      if (v < 0 || v >= len) outside.push_back(v); else cand.insert(v);
    }
    std::sort(outside.begin(), outside.end());
    candidate_sets(c, "indexer.topk (positions)", gold, cand, outside,
                   [&](int64_t q) { return double(c.d.logits.at(t, c.d.ks[t] + q)); }, dep);
  }
  if (f.find(p + "attn.indices")) {
    any = true;
    const Tensor<int32_t> ci = diff::candidate_int(f, p + "attn.indices", {c.s_q, 1, c.topk}, notes);
    std::set<int64_t> gold, cand;
    std::vector<int64_t> outside;
    const bool win = c.src.has_indexer;
    for (int64_t j = 0; j < c.topk; ++j) {
      const int32_t g = c.d.indices[t * c.topk + j], v = ci[t * c.topk + j];
      if (g >= 0 && g < c.s_kv) gold.insert(g);
      if (v < 0) continue;
      if (v >= c.s_kv || (win && (v < c.src.ks[t] || v >= c.src.ke[t]))) outside.push_back(v); else cand.insert(v);
    }
    std::sort(outside.begin(), outside.end());
    candidate_sets(c, "attn.indices (kv rows)", gold, cand, outside,
                   [&](int64_t r) { return win ? double(c.src.logits.at(t, r)) : double(r); }, dep);
  }
  // Attention outputs against the golden's (the bounds of the golden's indices).
  const bool has_out = f.find(p + "attn.out"), has_lse = f.find(p + "attn.lse"), has_ml = f.find(p + "attn.max_logits");
  if (has_out || has_lse || has_ml) {
    any = true;
    ref::AttentionOut exact;
    exact.out = row_of(c.d.out, t);
    exact.lse = row_of(c.d.lse, t);
    exact.max_logits = row_of(c.d.max_logits, t);
    Tensor<int32_t> tl;
    if (c.d.topk_length.numel()) tl = row_of(c.d.topk_length, t);
    const cmp::AttentionBounds b = cmp::attention_bounds(row_of(c.d.q, t), c.d.kv, row_of(c.d.indices, t), c.sm, c.d_v,
                                                         tl.numel() ? &tl : nullptr, exact);
    auto ratio = [](double e, double x, double bound) {
      if (!std::isfinite(e) || !std::isfinite(x)) return e == x ? 0.0 : std::numeric_limits<double>::infinity();
      return bound > 0 ? std::fabs(x - e) / bound : (x == e ? 0.0 : std::numeric_limits<double>::infinity());
    };
    if (has_out) {
      const Tensor<float> co = diff::candidate_float(f, p + "attn.out", {c.s_q, c.h_q, c.d_v});
      c.os << "  attn.out per head: largest err / bound (column, expected, got, bound)\n";
      for (int64_t h = 0; h < c.h_q; ++h) {
        double worst = -1;
        int64_t col = 0, over = 0;
        for (int64_t e = 0; e < c.d_v; ++e) {
          const double r = ratio(c.d.out.at(t, h, e), co.at(t, h, e), b.out[size_t(h * c.d_v + e)]);
          over += r > 1;
          if (r > worst) { worst = r; col = e; }
        }
        char line[240];
        std::snprintf(line, sizeof line, "    head %lld: %-9.4g (column %lld, %.7g, %.7g, %.3g)%s\n", (long long)h, worst, (long long)col,
                      double(c.d.out.at(t, h, col)), double(co.at(t, h, col)), b.out[size_t(h * c.d_v + col)],
                      over ? ("  " + std::to_string(over) + " column(s) over their bound").c_str() : "");
        c.os << line;
        dep.push_back({"attn.out head " + std::to_string(h) + " column " + std::to_string(col), worst});
      }
    }
    for (const auto& [name, has, gold, bound] :
         {std::tuple{std::string("attn.lse"), has_lse, &c.d.lse, &b.lse}, std::tuple{std::string("attn.max_logits"), has_ml, &c.d.max_logits, &b.max_logits}}) {
      if (!has) continue;
      const Tensor<float> x = diff::candidate_float(f, p + name, {c.s_q, c.h_q});
      c.os << "  " << name << " per head: err / bound (expected, got, bound)\n";
      for (int64_t h = 0; h < c.h_q; ++h) {
        const double r = ratio(gold->at(t, h), x.at(t, h), (*bound)[size_t(h)]);
        char line[200];
        std::snprintf(line, sizeof line, "    head %lld: %-9.4g (%.9g, %.9g, %.3g)\n", (long long)h, r, double(gold->at(t, h)),
                      double(x.at(t, h)), (*bound)[size_t(h)]);
        c.os << line;
        dep.push_back({name + " head " + std::to_string(h), r});
      }
    }
  }
  if (!any) {
    c.os << "  holds nothing of layer " << c.d.l << "\n";
    return;
  }
  for (const std::string& n : notes) c.os << "  note: " << n << "\n";
  const auto worst = std::max_element(dep.begin(), dep.end(), [](const Departure& a, const Departure& b) { return a.ratio < b.ratio; });
  if (worst == dep.end() || worst->ratio <= 1) c.os << "  verdict on this row: within every bound\n";
  else c.os << "  verdict on this row: departs, most at " << worst->where << " (err / bound " << g6(worst->ratio) << ")\n";
}

}  // namespace

std::string explain(const golden::Loaded& g, const Options& o, const io::SafetensorsFile* candidate) {
  const json& m = g.manifest;
  const json& cfg = m["config"];
  require(m.value("kind", "") != "v4" && m.value("kind", "") != "hyv4",
          "explain: the golden set is of kind '" + m.value("kind", "") + "', whose layers explain does not read (diff judges it)");
  const int n_layers = int(m["layers"].size());
  require(o.layer >= 0 && o.layer < n_layers, "explain: --layer " + std::to_string(o.layer) + " is outside the golden set's " +
                                                  std::to_string(n_layers) + " layers (0.." + std::to_string(n_layers - 1) + ")");
  const int64_t s_q = cfg["s_q"], h_q = cfg["h_q"];
  require(o.row >= 0 && o.row < s_q, "explain: --row " + std::to_string(o.row) + " is outside the set's " + std::to_string(s_q) +
                                         " query rows (0.." + std::to_string(s_q - 1) + ")");
  require(o.head >= -1 && o.head < h_q, "explain: --head " + std::to_string(o.head) + " is outside the set's " + std::to_string(h_q) +
                                            " heads (0.." + std::to_string(h_q - 1) + ")");
  require(o.top >= 1, "explain: --top must be at least 1");
  Ctx c{g, o, s_q, cfg["s_kv"], cfg["topk"], h_q, cfg["d_v"], std::max<int64_t>(0, o.head), cfg["sm_scale"].get<float>(), {}, {}, {}};
  c.d = diff::load_golden_layer(g, o.layer);
  c.src = c.d.full ? c.d : diff::load_golden_layer(g, c.d.source);
  const int64_t t = o.row;
  c.os << "explain   " << g.dir << " (" << m.value("problem", "") << ")\n";
  c.os << "layer     " << o.layer << (c.d.full ? " (Full: its own indexer chooses the positions)"
                                             : " (Shared: it reuses Full layer " + std::to_string(c.d.source) + "'s positions)")
       << "\n";
  std::string row = "row       " + std::to_string(t);
  if (const io::TensorView* v = g.find("rows")) row += " (problem row " + std::to_string(io::as_tensor<int32_t>(*v, g.dir)[t]) + ")";
  if (const int64_t seq = sequence_of(g, t); seq >= 0) row += ", sequence " + std::to_string(seq);
  if (c.src.has_indexer) {
    const int64_t len = c.src.ke[t] - c.src.ks[t];
    row += ", window [ks, ke) = [" + std::to_string(c.src.ks[t]) + ", " + std::to_string(c.src.ke[t]) + ") of the kv rows: " +
           std::to_string(len) + " visible keys; top-k " + std::to_string(c.topk) + ", k_eff = min(top-k, keys) = " +
           std::to_string(std::min(c.topk, len));
  } else {
    row += "; top-k " + std::to_string(c.topk) + " (no indexer in the golden set: the positions are given)";
  }
  c.os << row << "\n";
  if (c.src.has_indexer) indexer_section(c);
  selected_section(c);
  attention_section(c);
  if (candidate) candidate_section(c, *candidate);
  return c.os.str();
}

}  // namespace indexshare::explain
