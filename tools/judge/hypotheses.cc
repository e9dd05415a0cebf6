// indexshare diff: the named hypotheses a failing tensor is tested against.
#include "tools/judge/emulate.h"
#include "tools/judge/walk.h"
#include "tools/lib/golden_model1.h"

namespace indexshare::diff {

const std::vector<Hypothesis>& hypotheses() {
  static const std::vector<Hypothesis> h = {
      {"a systematic scale or offset over the tensor, a head, a column lane, a row tile, a run of rows, every other row or a sequence (structure tests)",
       "attn.out, attn.lse, attn.max_logits, indexer.logits", "attn.out 0.4% low on every other row"},
      {"a wrong softmax scale", "attn.out, attn.lse", "softmax scale 1% off"},
      {"an arithmetic coarser than the contract's (bf16 logits, bf16 products, bf16 P.V accumulation; precision test)",
       "attn.out, attn.lse, attn.max_logits, indexer.logits", "P.V accumulated in bf16"},
      {"LSE in base 2", "attn.lse", "attn.lse in base 2"},
      {"max_logits in base 2", "attn.max_logits", "attn.max_logits in base 2"},
      {"the sink inside the LSE", "attn.lse", "attn.lse includes the sink"},
      {"the sink left out", "attn.out", "attn.out without the sink"},
      {"one key missing per row (the last or the first)", "attn.out, attn.lse", "each row's last key dropped"},
      {"output rounded to bf16 toward zero", "attn.out", "attn.out truncated to bf16"},
      {"a causal bound off by one", "indexer.topk, attn.indices", "causal bound one key too long"},
      {"a Shared layer that recomputes its own top-k", "attn.indices, attn.out", "Shared layer recomputes its top-k"},
      {"another Full layer's positions (the schedule off)", "attn.indices, attn.out", "Shared layer takes another Full layer's positions"},
      {"top-k from scores of a lower precision than the contract's", "indexer.topk", "top-k from bf16 scores"},
      {"raw torch.topk output (no -1 padding in short rows)", "indexer.topk, attn.indices", ""},
      {"physical (paged) slots where logical rows were expected, and the reverse", "attn.indices", ""},
      {"the indexer's RoPE layout swapped (module-level sets and model dumps)", "indexer.logits, indexer.topk", ""},
      {"the indexer's RoPE on the leading dims instead of the trailing ones (HY V4 sets)",
       "indexer.q_rope, indexer.k_rope, indexer.scores, indexer.topk", "HY V4: the indexer's RoPE on the leading dims"},
      {"the sink scaled by sm_scale (HY V4 sets: an unscaled logit)", "attn.out, attn.o_v, attn.gated", "HY V4: the sink scaled by sm_scale"},
      {"the output gate left out (HY V4 sets)", "attn.gated", "HY V4: attn.gated without the output gate"},
      {"a draft step using the target's top-k (MTP sets)", "layers.1 indexer.topk / attn.indices, mtp.topk, mtp.indices, mtp.out, mtp.lse",
       "MTP: draft step 0 with the target's top-k"},
      {"the last padded row instead of the last accepted row (MTP sets)", "mtp.topk, mtp.indices, mtp.out, mtp.lse", ""},
      {"pools scored with max or mean instead of the softmax weighting (KPool sets)", "indexer.pool_keys, indexer.scores, indexer.pools",
       "KPool: pooled keys by max"},
      {"the tail left out or doubled, a Shared layer off its source's list (KPool sets)", "indexer.indices, attn.indices, attn.out",
       "KPool: a Shared layer off its source's list"},
      {"the compressor's RMSNorm weight ignored, its bf16 rounding points, or entries without their RoPE (V4 sets)",
       "compressor.entries, indexer.entries", "V4: compressor without its RMSNorm weight"},
      {"CSA's overlapping windows taken wrong: the halves swapped, or the previous window left out (V4 sets)",
       "compressor.entries, indexer.entries", "V4: CSA windows' halves swapped"},
      {"block numbers off by one block (V4 sets)", "indexer.blocks", "V4: blocks off by one block"},
      {"a Shared C4A layer off its source, or blocks shared as the other freq rule or the rule counted over every layer (V4 sets)",
       "indexer.blocks", "V4: a Shared C4A layer running its own indexer"},
      {"the sliding window or the compressed entries left out of the one softmax (V4 sets)", "attn.out", ""},
      {"out_rotated without the inverse RoPE, or with the forward rotation (V4 sets)", "attn.out_rotated", "V4: out_rotated without the inverse RoPE"},
  };
  return h;
}

namespace detail {

// The window ends one key later (delta +1) or earlier (-1): a causal bound off by one. A row whose end
// cannot move (the last key of the set, an empty window) keeps it; nothing when no row moves.
std::optional<Tensor<int32_t>> shifted_ends(const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, int delta, int64_t s_kv) {
  Tensor<int32_t> out = ke;
  bool moved = false;
  for (int64_t t = 0; t < ke.numel(); ++t) {
    const int64_t e = int64_t(ke[t]) + delta;
    if (e >= ks[t] && e <= s_kv) { out[t] = int32_t(e); moved = true; }
  }
  return moved ? std::optional<Tensor<int32_t>>(std::move(out)) : std::nullopt;
}

// Does the alternative `alt` (with its bound) explain the candidate `got`: within the bound, and at
// least twice as close as the golden `gold` (an alternative the correct output also fits explains
// nothing: a small sink, or a scaled output inside every bound, fits both)?
bool explains(const Tensor<float>& alt, const std::vector<float>& bound, const Tensor<float>& got, const Tensor<float>& gold) {
  if (!passes(cmp::compare_floats("", alt, got, bound_rule(bound)))) return false;
  double to_alt = 0, to_gold = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(alt[i]) || !std::isfinite(gold[i])) continue;
    to_alt += (double(got[i]) - alt[i]) * (double(got[i]) - alt[i]);
    to_gold += (double(got[i]) - gold[i]) * (double(got[i]) - gold[i]);
  }
  return to_alt <= 0.25 * to_gold;
}

namespace {

// Rows `rows` of a [s_q, ...] tensor, in that order (the trailing shape kept).
template <class T>
Tensor<T> rows_of(const Tensor<T>& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape;
  shape[0] = int64_t(rows.size());
  Tensor<T> out(shape);
  const int64_t w = t.numel() / std::max<int64_t>(1, t.dim(0));
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(t.ptr() + rows[i] * w, w, out.ptr() + int64_t(i) * w);
  return out;
}

// Does the attention over `indices` (with `sink`, or none) explain the candidate's attn.out (or
// lse), as explains() judges it on the whole tensor? explains() needs every element within its
// bound, and the attention and its bounds are per query row (ref/bounds.h: G, A_c and the lse's
// terms are a row's), so that test runs first on every ceil(s_q / 32)-th row: an alternative out of
// bound there cannot explain the candidate and costs a 32nd of the recomputation (most hypotheses
// of a failure are such). Only one within bound there is computed on every row, so the verdicts
// are explains()'s own.
bool attention_explains(const ref::Kernels& k, const GoldenLayer& d, const Tensor<int32_t>& indices, float sm, int64_t d_v,
                        const Tensor<float>* sink, bool lse, const Tensor<float>& got, const Tensor<float>& gold) {
  const int64_t s_q = d.q.dim(0), step = std::max<int64_t>(1, (s_q + 31) / 32);
  const Tensor<int32_t>* tl = d.topk_length.numel() ? &d.topk_length : nullptr;
  if (step > 1) {
    std::vector<int64_t> rows;
    for (int64_t t = 0; t < s_q; t += step) rows.push_back(t);
    const Tensor<bf16_t> q = rows_of(d.q, rows);
    const Tensor<int32_t> idx = rows_of(indices, rows), len = tl ? rows_of(*tl, rows) : Tensor<int32_t>();
    const ref::AttentionOut a = k.sparse_attention(q, d.kv, idx, sm, d_v, tl ? &len : nullptr, sink);
    const cmp::AttentionBounds b = k.attention_bounds(q, d.kv, idx, sm, d_v, tl ? &len : nullptr, a);
    if (!passes(cmp::compare_floats("", lse ? a.lse : a.out, rows_of(got, rows), bound_rule(lse ? b.lse : b.out)))) return false;
  }
  const ref::AttentionOut a = k.sparse_attention(d.q, d.kv, indices, sm, d_v, tl, sink);
  const cmp::AttentionBounds b = k.attention_bounds(d.q, d.kv, indices, sm, d_v, tl, a);
  return explains(lse ? a.lse : a.out, lse ? b.lse : b.out, got, gold);
}

}  // namespace

std::optional<SwappedRope> swapped_rope(const golden::Loaded& g, int l, const Tensor<int32_t>& ks, const Tensor<int32_t>& ke,
                                        const ref::Kernels& k) {
  const json& m = g.manifest;
  const std::string p = "layers." + std::to_string(l) + ".";
  if (m.value("kind", "") != "module" || !m.contains("model_config") || !g.find(p + "indexer.wq_b")) return std::nullopt;
  ModelConfig cfg = parse_config_json(m["model_config"].dump(), g.dir + "/manifest.json: model_config");
  cfg.indexer_rope = cfg.indexer_rope == ref::RopeLayout::half_split ? ref::RopeLayout::interleaved : ref::RopeLayout::half_split;
  auto f32 = [&](const std::string& n) {
    const Tensor<bf16_t> b = g.tensor<bf16_t>(p + n);
    Tensor<float> x(b.shape);
    for (int64_t i = 0; i < b.numel(); ++i) x[i] = bf16_to_f32(b[i]);
    return x;
  };
  ref::IndexerWeights w{f32("indexer.wq_b"), f32("indexer.wk"), f32("indexer.k_norm_w"), f32("indexer.k_norm_b"),
                        f32("indexer.weights_proj")};
  const ref::IndexerVariant v = m["conventions"].value("indexer_variant", "deepseek_fp8") == "hf_bf16"
                                    ? ref::IndexerVariant::hf_bf16 : ref::IndexerVariant::deepseek_fp8;
  const ref::IndexerModuleOut o = ref::indexer_module(cfg, w, f32("attn.x"), f32("mla.qr"), 0, v, k.linear);
  SwappedRope r{ref::rope_layout_name(cfg.indexer_rope), ref::indexer_module_logits(o, v, ks, ke, k), {}};
  r.topk = k.topk(r.logits, ks, ke, m["config"]["topk"].get<int64_t>());
  return r;
}

std::optional<SwappedRope> swapped_rope_dump(const golden::Loaded& g, const io::SafetensorsFile& c, int l,
                                             const Tensor<int32_t>& ks, const Tensor<int32_t>& ke, const ref::Kernels& k) {
  auto meta = [&](const char* key) -> std::string {
    auto it = c.metadata.find(key);
    return it == c.metadata.end() ? "" : it->second;
  };
  const std::string p = "layers." + std::to_string(l) + ".";
  const std::string layout = meta("indexer_rope");
  if (meta("format") != golden::kDumpFormat || (layout != "half" && layout != "interleave") || meta("rope").empty() ||
      !g.find(p + "indexer.q") || g.get(p + "indexer.q").dtype != io::DType::BF16)
    return std::nullopt;
  // The rotary table is the dump's word, read defensively: anything malformed leaves the hypothesis out.
  int64_t R = 0;
  double scale = 1.0;
  std::vector<double> freq;
  try {
    const json rope = json::parse(meta("rope"));
    if (!rope.is_object() || !rope.contains("dim") || !rope.contains("inv_freq")) return std::nullopt;
    R = rope.at("dim").get<int64_t>();
    scale = rope.value("attention_scaling", 1.0);
    freq = rope.at("inv_freq").get<std::vector<double>>();
  } catch (const json::exception&) {
    return std::nullopt;
  }
  if (!std::isfinite(scale)) return std::nullopt;
  for (double f : freq)
    if (!std::isfinite(f)) return std::nullopt;
  auto to_f = [&](const std::string& n) {
    const Tensor<bf16_t> b = g.tensor<bf16_t>(p + n);
    Tensor<float> x(b.shape);
    for (int64_t i = 0; i < b.numel(); ++i) x[i] = bf16_to_f32(b[i]);
    return x;
  };
  Tensor<float> q = to_f("indexer.q"), kk = to_f("indexer.k");
  const int64_t D = kk.shape[1];
  if (R <= 0 || R % 2 || R > D || int64_t(freq.size()) != R / 2 || scale <= 0) return std::nullopt;
  const bool from_interleave = layout == "interleave";
  // v: one vector of D values at position pos; its first R re-rotated in place. Both layouts write
  // pair j as out[j] = a c - b s, out[j + R/2] = b c + a s, with (a, b) = (x[2j], x[2j+1])
  // (interleaved) or (x[j], x[j + R/2]) (half-split) of the unrotated x.
  std::vector<double> x(size_t(R), 0.0);
  auto swap_one = [&](float* v, double pos) {
    const int64_t h = R / 2;
    for (int64_t j = 0; j < h; ++j) {
      const double c = std::cos(pos * freq[size_t(j)]) * scale, s = std::sin(pos * freq[size_t(j)]) * scale;
      const double o0 = v[j], o1 = v[j + h], n = c * c + s * s;
      const double a = (o0 * c + o1 * s) / n, b = (o1 * c - o0 * s) / n;
      x[size_t(from_interleave ? 2 * j : j)] = a;
      x[size_t(from_interleave ? 2 * j + 1 : j + h)] = b;
    }
    for (int64_t j = 0; j < h; ++j) {
      const double c = std::cos(pos * freq[size_t(j)]) * scale, s = std::sin(pos * freq[size_t(j)]) * scale;
      const double a = x[size_t(from_interleave ? j : 2 * j)], b = x[size_t(from_interleave ? j + h : 2 * j + 1)];
      v[j] = bf16_to_f32(f32_to_bf16(float(a * c - b * s)));
      v[j + h] = bf16_to_f32(f32_to_bf16(float(b * c + a * s)));
    }
  };
  const int64_t s_q = q.shape[0], H = q.shape[1], s_kv = kk.shape[0];
  for (int64_t t = 0; t < s_q; ++t)
    for (int64_t hh = 0; hh < H; ++hh) swap_one(&q.data[size_t((t * H + hh) * D)], double(s_kv - s_q + t));
  for (int64_t s = 0; s < s_kv; ++s) swap_one(&kk.data[size_t(s * D)], double(s));
  SwappedRope r{from_interleave ? "half-split" : "interleaved",
                k.logits_f32(q, kk, g.tensor<float>(p + "indexer.k_scale"), g.tensor<float>(p + "indexer.weights"), ks, ke), {}};
  r.topk = k.topk(r.logits, ks, ke, g.manifest["config"]["topk"].get<int64_t>());
  return r;
}

void Judge::rope_dump_hypothesis(const LayerData& d, const std::string& P, const Tensor<int32_t>& ct, const char* what) {
  const auto sw = swapped_rope_dump(g_, c_, d.l, d.ks, d.ke, k_);
  if (!sw) return;
  auto mean = [](const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m += x;
    return v.empty() ? 0.0 : m / double(v.size());
  };
  const double swapped = mean(rows_against(ct, sw->topk, s_kv_).recall);
  const double own = mean(rows_against(ct, d.topk, s_kv_).recall);
  if (swapped >= 0.95 && swapped > own) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f (against the golden's own: %.3f)", swapped, own);
    res.diagnoses.push_back(P + ": " + what + " is the top-k of the dump's indexer inputs with the RoPE layout swapped (" +
                            sw->layout + "): mean recall " + buf +
                            "; the dump's indexer q/k were rotated with the wrong layout (python -m indexshare.dump "
                            "applies the model's; see its indexer_rope metadata)");
  }
}

void Judge::topk_hypotheses(const LayerData& d, const std::string& P, const Tensor<int32_t>& ct) {
  const int l = d.l;
  golden_logits(l);  // d.logits from here on
  if (const auto padded = pad_beyond_window(ct, d.ks, d.ke))
    if (passes(cmp::compare_topk("", d.logits, d.ks, d.ke, d.topk, *padded, {})))
      res.diagnoses.push_back(P + ": indexer.topk holds " + kBeyondWindow);
  if (const auto sw = swapped_rope(g_, l, d.ks, d.ke, k_))
    if (passes(cmp::compare_topk("", sw->logits, d.ks, d.ke, sw->topk, ct, {})))
      res.diagnoses.push_back(P + ": indexer.topk is the top-k of the indexer with its RoPE layout swapped (" + sw->layout +
                              " instead of the model's)");
  rope_dump_hypothesis(d, P, ct, "indexer.topk");
  for (int delta : {+1, -1}) {
    const std::optional<Tensor<int32_t>> shifted = shifted_ends(d.ks, d.ke, delta, s_kv_);
    if (!shifted) continue;
    const Tensor<int32_t>& ke2 = *shifted;
    Tensor<float> l2 = d.logits;  // logits of the widened window: the golden has them only inside
    const std::string p = name(l, "");
    if (g_.find(p + "indexer.q") && g_.get(p + "indexer.q").dtype == io::DType::F8_E4M3)
      l2 = k_.logits_fp8(g_.tensor<e4m3_t>(p + "indexer.q"), g_.tensor<e4m3_t>(p + "indexer.k"),
                         g_.tensor<float>(p + "indexer.k_scale"), g_.tensor<float>(p + "indexer.weights"), d.ks, ke2);
    const Tensor<int32_t> t2 = k_.topk(l2, d.ks, ke2, topk_);
    if (passes(cmp::compare_topk("", l2, d.ks, ke2, t2, ct, {})))
      res.diagnoses.push_back(P + ": indexer.topk matches a causal window " + (delta > 0 ? "one key too long (row t sees key t+1: causal bound off by one)"
                                                                                        : "one key too short (row t misses its own key: causal bound off by one)"));
  }
}

void Judge::indices_hypotheses(const LayerData& d, const std::string& P, const Tensor<int32_t>& ci) {
  const int l = d.l;
  const LayerData& src = layer(d.source);
  rope_dump_hypothesis(src, P, ci, "attn.indices");
  const auto cs = row_sets(ci, s_kv_);
  if (g_.find(name(l, "attn.indices_physical"))) {
    Tensor<int32_t> phys = g_.tensor<int32_t>(name(l, "attn.indices_physical"));
    phys.shape = {s_q_, 1, topk_};
    if (row_sets(ci, INT32_MAX) == row_sets(phys, INT32_MAX))
      res.diagnoses.push_back(P + ": attn.indices are the physical (paged) slots; logical kv rows were expected");
  }
  if (!d.full && d.has_indexer && cs == row_sets(ref::local_to_kv_rows(d.topk, d.ks), s_kv_))
    res.diagnoses.push_back(P + ": attn.indices are the layer's own fresh top-k, not its source layer " +
                            std::to_string(d.source) + "'s positions (a Shared layer that recomputes)");
  // On an MTP set layer 0 is the target and layer 1 the MTP layer, in no schedule: its mistake of
  // taking the target's positions is the MTP judge's to name (judge/mtp.cc, step 0).
  const bool mtp = g_.manifest.value("kind", "") == "mtp";
  for (int j = 0; j < n_layers_ && !mtp; ++j) {
    if (j == d.source || j == l) continue;
    const LayerData& o = layer(j);
    if (o.full && cs == row_sets(o.indices, s_kv_))
      res.diagnoses.push_back(P + ": attn.indices are Full layer " + std::to_string(j) + "'s positions instead of layer " +
                              std::to_string(d.source) + "'s (schedule off by " + std::to_string(j - d.source) + ")");
  }
  if (!src.has_indexer) return;
  const std::string s = name(d.source, "");
  for (int delta : {+1, -1}) {
    const std::optional<Tensor<int32_t>> shifted = shifted_ends(src.ks, src.ke, delta, s_kv_);
    if (!shifted || !g_.find(s + "indexer.q") || g_.get(s + "indexer.q").dtype != io::DType::F8_E4M3) continue;
    const Tensor<int32_t>& ke2 = *shifted;
    const Tensor<float> l2 = k_.logits_fp8(g_.tensor<e4m3_t>(s + "indexer.q"), g_.tensor<e4m3_t>(s + "indexer.k"),
                                           g_.tensor<float>(s + "indexer.k_scale"), g_.tensor<float>(s + "indexer.weights"), src.ks, ke2);
    if (cs == row_sets(ref::local_to_kv_rows(k_.topk(l2, src.ks, ke2, topk_), src.ks), s_kv_))
      res.diagnoses.push_back(P + ": attn.indices are the top-k of a causal window one key too " + (delta > 0 ? "long" : "short") +
                              " (causal bound off by one)");
  }
}

void Judge::out_hypotheses(AttnCtx& a, const Tensor<float>& co) {
  const LayerData& d = a.d;
  with_q(d.l);  // released by judge_attention
  const Tensor<float>* sink = d.sink ? &*d.sink : nullptr;
  for (int j = 0; j < n_layers_; ++j) {
    if (j == d.source) continue;
    const LayerData& o = layer(j);
    if (!o.full) continue;
    if (attention_explains(k_, d, o.indices, sm_, d_v_, sink, false, co, a.e.attn.out))
      res.diagnoses.push_back(a.P + ": attn.out is the attention over Full layer " + std::to_string(j) + "'s positions instead of layer " +
                              std::to_string(d.source) + "'s");
  }
  if (!d.full && d.has_indexer) {
    if (attention_explains(k_, d, ref::local_to_kv_rows(d.topk, d.ks), sm_, d_v_, sink, false, co, a.e.attn.out))
      res.diagnoses.push_back(a.P + ": attn.out is the attention over the layer's own fresh top-k (a Shared layer that recomputes)");
  }
  if (d.sink) {
    if (attention_explains(k_, d, a.use, sm_, d_v_, nullptr, false, co, a.e.attn.out))
      res.diagnoses.push_back(a.P + ": attn.out ignores the attention sink");
  }
  // FlashMLA's MODEL1 two-scope decode: the set's index mapping with one rule broken.
  if (d.l == 0 && g_.find("layers.0.attn.model1.indices")) {
    const std::pair<golden::Model1Mapping, const char*> broken[] = {
        {{false, true, true, true}, "the window's slots from topk_length[b] on attended (topk_length ignored)"},
        {{true, false, true, true}, "the compressed entries from extra_topk_length[b] on attended (extra_topk_length ignored)"},
        {{true, true, false, true}, "the window alone (the extra scope left out)"},
        {{true, true, true, false}, "the extra scope's slots read in the main cache (no main_slots offset)"}};
    for (const auto& [m, what] : broken)
      if (attention_explains(k_, d, golden::model1_attn_indices(g_, m), sm_, d_v_, sink, false, co, a.e.attn.out))
        res.diagnoses.push_back(a.P + ": attn.out is the MODEL1 attention over " + what);
  }
  key_dropped_hypothesis(a, "attn.out", co);
  rounding_hypothesis(a, co);
}

void Judge::key_dropped_hypothesis(AttnCtx& a, const std::string& tensor, const Tensor<float>& got) {
  const LayerData& d = a.d;
  with_q(d.l);
  for (const bool last : {true, false}) {
    int64_t dropped = 0;
    const Tensor<int32_t> fewer = emul::drop_one_key(a.use, d.topk_length.numel() ? &d.topk_length : nullptr, s_kv_, last, &dropped);
    if (dropped == 0) return;
    const bool out = tensor == "attn.out";
    if (attention_explains(k_, d, fewer, sm_, d_v_, d.sink ? &*d.sink : nullptr, !out, got, out ? a.e.attn.out : a.e.attn.lse)) {
      res.diagnoses.push_back(a.P + ": " + tensor + " is the attention without each row's " + (last ? "last" : "first") +
                              " key (one key missing per row: a loop bound over the top-k slots off by one)");
      return;
    }
  }
}

void Judge::rounding_hypothesis(AttnCtx& a, const Tensor<float>& co) {
  // A kernel that rounds its output to bf16 toward zero errs by half a bf16 ulp toward zero on
  // average: err ~ -0.5 sign(x) ulp(x), which depends on where x sits in its binade, where a scale
  // error is err ~ b x. The least-squares fit of err on both directions tells them apart (P's own
  // bf16 rounding is noise in both); the candidate's values must also lie on the bf16 grid.
  const Tensor<float>& x = a.e.attn.out;
  int64_t n = 0, on_grid = 0;
  double sxx = 0, sxu = 0, suu = 0, sxe = 0, sue = 0, see = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(co[i]) || x[i] == 0) continue;
    uint32_t bits;
    std::memcpy(&bits, &co[i], 4);
    on_grid += (bits & 0xFFFFu) == 0;
    int ex = 0;
    std::frexp(double(x[i]), &ex);
    const double xv = x[i], u = std::copysign(std::ldexp(1.0, ex - 8), xv), e = double(co[i]) - xv;
    sxx += xv * xv; sxu += xv * u; suu += u * u; sxe += xv * e; sue += u * e; see += e * e;
    ++n;
  }
  const double det = sxx * suu - sxu * sxu;
  if (n < 100 || double(on_grid) < 0.99 * double(n) || !(det > 0)) return;
  const double b_u = (sxx * sue - sxu * sxe) / det;  // the error toward zero, in ulps
  // The fit must be most of the error: truncation alone leaves its uniform spread (a quarter of its
  // mean square, 0.25 / (0.25 + 1/12)); an output missing half its keys fits a pull toward zero
  // too, beside an error many ulps large.
  const double b_x = (suu * sxe - sxu * sue) / det, explained = b_x * sxe + b_u * sue;
  if (b_u < -0.3 && explained >= 0.5 * see) {
    char buf[120];
    std::snprintf(buf, sizeof buf, "its error fits %.2f bf16 ulps toward zero beside any scale (to nearest: 0)", -b_u);
    res.diagnoses.push_back(a.P + ": attn.out is rounded to bf16 toward zero (truncation) instead of to nearest even: " + buf);
  }
}


void Judge::model_out_hypotheses(const LayerData& d, const std::string& P, const UsedIndices& used, const ModelOut& m) {
  const Tensor<bf16_t>& w_uv = m.w_uv;
  const Tensor<bf16_t>& w_uk = m.w_uk;
  const Tensor<bf16_t>& q_nope = m.q_nope;
  const Tensor<float>& co = m.co;
  const ref::AttentionOut& lat = m.lat;
  const Tensor<float>& expected = m.expected;
  const int64_t V = m.V, N = m.N;
  const bool rounded = m.rounded;
  // What explains a failure. Another Full layer's positions (a Shared layer attending over them):
  for (int j = 0; j < n_layers_; ++j) {
    if (j == d.source || !layer(j).full) continue;
    const Tensor<float> lj = k_.sparse_attention(d.q, d.kv, layer(j).indices, sm_, d_v_, nullptr, nullptr).out;
    const Tensor<float> ej = cmp::map_latent_output(lj, w_uv);
    if (passes(cmp::compare_floats("", ej, co, bound_rule(cmp::model_attention_bounds(d.q, d.kv, layer(j).indices, sm_, q_nope,
                                                                                        w_uk, w_uv, lj, ej, rounded)))))
      res.diagnoses.push_back(P + ": attn.model_out is the model's attention over Full layer " + std::to_string(j) +
                              "'s positions instead of layer " + std::to_string(d.source) + "'s");
  }
  // Per (row, head): does the element fail?
  auto fails = [&](const Tensor<float>& e, const std::vector<float>& b, int64_t t, int64_t hh) {
    for (int64_t j = 0; j < V; ++j) {
      const int64_t i = (t * h_q_ + hh) * V + j;
      if (!(std::fabs(double(co[i]) - double(e[i])) <= b[size_t(i)])) return true;
    }
    return false;
  };
  // V of another head: a failing head whose every row passes with head h2's W_uv (the first 4
  // failing heads; every other head tried).
  int tried = 0;
  for (int64_t hh = 0; hh < h_q_ && tried < 4; ++hh) {
    bool bad = false;
    for (int64_t t = 0; t < s_q_ && !bad; ++t) bad = fails(expected, m.bound, t, hh);
    if (!bad) continue;
    ++tried;
    for (int64_t h2 = 0; h2 < h_q_; ++h2) {
      if (h2 == hh) continue;
      Tensor<bf16_t> w2 = w_uv;
      for (int64_t i = 0; i < V * d_v_; ++i) w2[hh * V * d_v_ + i] = w_uv[h2 * V * d_v_ + i];
      const Tensor<float> e2 = cmp::map_latent_output(lat.out, w2);
      const std::vector<float> b2 = cmp::model_attention_bounds(d.q, d.kv, used.indices, sm_, q_nope, w_uk, w2, lat.out, e2, rounded);
      bool ok = true;
      for (int64_t t = 0; t < s_q_ && ok; ++t) ok = !fails(e2, b2, t, hh);
      if (ok) {
        res.diagnoses.push_back(P + ": attn.model_out head " + std::to_string(hh) + " is its latent output mapped through head " +
                                std::to_string(h2) + "'s W_uv (the model used another head's V, or attn.w_uv is not the model's)");
        break;
      }
    }
  }
  // One position missing from a row's mask: the first 3 failing rows, each valid position left out.
  const int64_t k = used.indices.shape[2];
  int rows = 0;
  for (int64_t t = 0; t < s_q_ && rows < 3; ++t) {
    bool bad = false;
    for (int64_t hh = 0; hh < h_q_ && !bad; ++hh) bad = fails(expected, m.bound, t, hh);
    if (!bad) continue;
    ++rows;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t s = used.indices[t * k + j];
      if (s < 0 || s >= s_kv_) continue;
      Tensor<int32_t> one({1, 1, k});
      Tensor<bf16_t> q1({1, h_q_, d.q.shape[2]});
      for (int64_t i = 0; i < k; ++i) one[i] = i == j ? -1 : used.indices[t * k + i];
      for (int64_t i = 0; i < q1.numel(); ++i) q1[i] = d.q[t * q1.numel() + i];
      const Tensor<float> l1 = k_.sparse_attention(q1, d.kv, one, sm_, d_v_, nullptr, nullptr).out;
      const Tensor<float> e1 = cmp::map_latent_output(l1, w_uv);
      Tensor<bf16_t> qn1({1, h_q_, N});
      for (int64_t i = 0; i < qn1.numel(); ++i) qn1[i] = q_nope[t * qn1.numel() + i];
      const std::vector<float> b1 = cmp::model_attention_bounds(q1, d.kv, one, sm_, qn1, w_uk, w_uv, l1, e1, rounded);
      bool ok = true;
      for (int64_t hh = 0; hh < h_q_ && ok; ++hh)
        for (int64_t c = 0; c < V && ok; ++c) {
          const int64_t i = hh * V + c;
          ok = std::fabs(double(co[t * h_q_ * V + i]) - double(e1[i])) <= b1[size_t(i)];
        }
      if (ok) {
        res.diagnoses.push_back(P + ": attn.model_out row " + std::to_string(t) + " is the model's attention without position " +
                                std::to_string(s) + " (a top-k position missing from its mask)");
        break;
      }
    }
  }
}

}  // namespace detail

}  // namespace indexshare::diff
