// indexshare diff: the named hypotheses a failing tensor is tested against.
#include "tools/judge/walk.h"

namespace indexshare::diff {

namespace detail {

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
    Tensor<int32_t> ke2 = d.ke;
    bool ok = true;
    for (int64_t t = 0; t < s_q_; ++t) { ke2[t] += delta; ok = ok && ke2[t] >= d.ks[t] && ke2[t] <= s_kv_; }
    if (!ok) continue;
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
  for (int j = 0; j < n_layers_; ++j) {
    if (j == d.source || j == l) continue;
    const LayerData& o = layer(j);
    if (o.full && cs == row_sets(o.indices, s_kv_))
      res.diagnoses.push_back(P + ": attn.indices are Full layer " + std::to_string(j) + "'s positions instead of layer " +
                              std::to_string(d.source) + "'s (schedule off by " + std::to_string(j - d.source) + ")");
  }
  if (!src.has_indexer) return;
  const std::string s = name(d.source, "");
  for (int delta : {+1, -1}) {
    Tensor<int32_t> ke2 = src.ke;
    bool ok = true;
    for (int64_t t = 0; t < s_q_; ++t) { ke2[t] += delta; ok = ok && ke2[t] >= src.ks[t] && ke2[t] <= s_kv_; }
    if (!ok || !g_.find(s + "indexer.q") || g_.get(s + "indexer.q").dtype != io::DType::F8_E4M3) continue;
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
  const Tensor<int32_t>* tl = d.topk_length.numel() ? &d.topk_length : nullptr;
  for (int j = 0; j < n_layers_; ++j) {
    if (j == d.source) continue;
    const LayerData& o = layer(j);
    if (!o.full) continue;
    const Expected x = expected_attention(g_, d, o.indices, sm_, d_v_, k_);
    if (passes(cmp::compare_floats("", x.attn.out, co, bound_rule(x.bounds.out))))
      res.diagnoses.push_back(a.P + ": attn.out is the attention over Full layer " + std::to_string(j) + "'s positions instead of layer " +
                              std::to_string(d.source) + "'s");
  }
  if (!d.full && d.has_indexer) {
    const Expected x = expected_attention(g_, d, ref::local_to_kv_rows(d.topk, d.ks), sm_, d_v_, k_);
    if (passes(cmp::compare_floats("", x.attn.out, co, bound_rule(x.bounds.out))))
      res.diagnoses.push_back(a.P + ": attn.out is the attention over the layer's own fresh top-k (a Shared layer that recomputes)");
  }
  if (d.sink) {
    Expected x;
    x.attn = k_.sparse_attention(d.q, d.kv, a.use, sm_, d_v_, tl, nullptr);
    x.bounds = k_.attention_bounds(d.q, d.kv, a.use, sm_, d_v_, tl, x.attn);
    if (passes(cmp::compare_floats("", x.attn.out, co, bound_rule(x.bounds.out))))
      res.diagnoses.push_back(a.P + ": attn.out ignores the attention sink");
  }
}

}  // namespace detail

}  // namespace indexshare::diff
