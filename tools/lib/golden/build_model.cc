// golden sets: the module-level builder (build_model, the toy model's set) and its replay line.

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <cstdio>

#include "ref/bounds.h"
#include "ref/config.h"
#include "ref/cost.h"
#include "ref/model.h"
#include "ref/numerics.h"
#include "ref/topk.h"

namespace indexshare::golden {

using nlohmann::json;
using namespace detail;

namespace {
Tensor<bf16_t> bf16_of(const Tensor<float>& x) { return to_bf16_tensor(x); }

// A module-level layer's indexer tensors (layers with an indexer), in the set's order: its bf16
// weights, the nonempty intermediates, then the kernel-level inputs and outputs (the variant's q and
// k: FP8 codes or bf16), ks / ke, the logits and the top-k.
void add_model_indexer(GoldenSet& g, const ref::ToyLayer& w, const ref::ToyLayerTrace& tr, const ref::ToyCache& cache,
                       int l, const std::string& pre, ref::IndexerVariant variant, const Tensor<int32_t>& ks,
                       const Tensor<int32_t>& ke) {
  const std::pair<const char*, const Tensor<float>*> iw[] = {
      {"indexer.wq_b", &w.indexer.wq_b}, {"indexer.wk", &w.indexer.wk}, {"indexer.k_norm_w", &w.indexer.k_norm_w},
      {"indexer.k_norm_b", &w.indexer.k_norm_b}, {"indexer.weights_proj", &w.indexer.weights_proj}};
  for (const auto& [n, t] : iw) add(g, pre + n, bf16_of(*t), Role::input);
  const ref::IndexerModuleOut& io_ = tr.indexer;
  const std::pair<const char*, const Tensor<float>*> inter[] = {
      {"indexer.q_proj", &io_.q_proj}, {"indexer.q_rope", &io_.q_rope}, {"indexer.q_hadamard", &io_.q_hadamard},
      {"indexer.k_proj", &io_.k_proj}, {"indexer.k_norm", &io_.k_norm}, {"indexer.k_rope", &io_.k_rope},
      {"indexer.k_hadamard", &io_.k_hadamard}};
  for (const auto& [n, t] : inter)
    if (t->numel()) add(g, pre + n, bf16_of(*t), Role::reference);
  if (variant == ref::IndexerVariant::deepseek_fp8) {
    add(g, pre + "indexer.q", io_.q8, Role::input);
    add(g, pre + "indexer.k", cache.index_keys[size_t(l)].k8, Role::input);
  } else {
    add(g, pre + "indexer.q", bf16_of(io_.q), Role::input);
    add(g, pre + "indexer.k", bf16_of(cache.index_keys[size_t(l)].k), Role::input);
  }
  add(g, pre + "indexer.k_scale", cache.index_keys[size_t(l)].k_scale, Role::input);
  add(g, pre + "indexer.q_scale", io_.q_scale, Role::reference);
  add(g, pre + "indexer.weights", io_.weights, Role::input);
  add(g, pre + "indexer.ks", ks, Role::input);
  add(g, pre + "indexer.ke", ke, Role::input);
  add(g, pre + "indexer.logits", tr.logits, Role::output);
  add(g, pre + "indexer.topk", tr.own_topk, Role::output);
}

// The manifest of a module-level set (without its "tensors" list, which write() adds).
json model_manifest(const ModelSpec& spec, const ModelConfig& cfg, const Schedule& sched, ref::IndexerVariant variant,
                    const std::string& replay, int64_t S, float sm, json layers, json budgets) {
  const std::string problem = "model=" + spec.preset + " layers=" + std::to_string(cfg.n_layers) + " seq=" + std::to_string(S) +
                              " seed=" + std::to_string(spec.seed) + " sim=" + float_text(spec.sim) + " variant=" + spec.variant +
                              " schedule=" + sched.pattern();
  return {
      {"format", "indexshare-golden"},
      {"format_version", kFormatVersion},
      {"generator", std::string("indexshare ") + INDEXSHARE_VERSION},
      {"kind", "module"},
      {"problem", problem},
      {"replay", replay},
      {"config",
       {{"s_q", S}, {"s_kv", S}, {"topk", cfg.index_topk}, {"index_n_heads", cfg.index_n_heads},
        {"index_head_dim", cfg.index_head_dim}, {"h_q", cfg.n_heads}, {"d_qk", cfg.d_qk()}, {"d_v", cfg.d_v()},
        {"sm_scale", sm}, {"n_layers", cfg.n_layers}, {"seed", spec.seed}, {"start_pos", 0}, {"n_seqs", 1},
        {"indexer", variant == ref::IndexerVariant::deepseek_fp8 ? "fp8" : "bf16"}}},
      {"model_config", json::parse(config_json_text(cfg))},
      {"conventions",
       {{"lse_base", "e"},
        {"lse_includes_sink", false},
        {"empty_row", "out 0, lse +inf, max_logits -inf"},
        {"scale_rule", scale_rule_name(cfg.index_scale_rule)},
        {"fp8_format", "e4m3fn, round to nearest even, saturating to +-448"},
        {"tie_rule", "score descending, then index ascending"},
        {"topk_index_space", "indexer.topk: sequence-local positions"},
        {"attn_index_space", "attn.indices: rows of attn.kv (logical, unpaged)"},
        {"padding", -1},
        {"causal_rule", "row t is position t and sees keys [0, t]"},
        {"rope_layout", "indexer: " + ref::rope_layout_name(cfg.indexer_rope) + " on dims [0, rope) of [pe | nope]; MLA: interleaved"},
        {"indexer_variant", spec.variant},
        {"weights", "bf16 values (not the checkpoints' FP8 block-quantized linears)"},
        {"model", "attention-only residual stack h <- bf16(h + out), out = wo . MLA(bf16(RMSNorm(h)))"}}},
      {"layers", std::move(layers)},
      {"budgets", std::move(budgets)},
  };
}
}  // namespace

std::string model_replay(const ModelSpec& spec) {
  std::string replay = "indexshare golden --model " + spec.preset + " --seed " + std::to_string(spec.seed) + " --sim " + float_text(spec.sim) +
                       " --variant " + spec.variant;
  if (spec.layers) replay += " --layers " + std::to_string(spec.layers);
  if (spec.seq) replay += " --seq " + std::to_string(spec.seq);
  if (!spec.schedule.empty()) replay += " --schedule " + spec.schedule;
  if (spec.impl != Impl::ref) replay += " --impl " + impl_name(spec.impl);
  return replay;
}

GoldenSet build_model(const ModelSpec& spec, const std::string& replay) {
  ModelConfig cfg = model_preset(spec.preset);
  if (spec.layers > 0) cfg.n_layers = spec.layers;
  if (spec.seq > 0) cfg.seq = spec.seq;
  const Schedule sched = spec.schedule.empty() ? cfg.resolve_schedule() : parse_schedule(spec.schedule, cfg.n_layers);
  cfg.schedule = ScheduleSpec{};
  cfg.schedule.pattern = sched.pattern();
  cfg.validate();
  require(spec.sim >= 0 && spec.sim <= 1, "golden: --sim must be in [0, 1]");
  const ref::IndexerVariant variant = ref::parse_indexer_variant(spec.variant);
  const ref::ToyModel m = ref::make_toy_model(cfg, sched, spec.seed, spec.sim, variant, true);
  const int64_t S = cfg.seq;
  const Tensor<float> h0 = ref::toy_hidden(cfg, spec.seed, 0, S);
  ref::ToyCache cache;
  const ref::Kernels kern = kernels_for(spec.impl);
  const ref::ToyForward f = ref::forward(m, cache, h0, kern);
  GoldenSet g;
  json layers = json::array(), budgets = json::object();
  Tensor<int32_t> ks({S}, 0), ke({S});
  for (int64_t t = 0; t < S; ++t) ke[t] = int32_t(t + 1);
  const float sm = float(cfg.softmax_scale());
  Tensor<float> h = h0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const ref::ToyLayer& w = m.layers[size_t(l)];
    const ref::ToyLayerTrace& tr = f.layers[size_t(l)];
    const std::string pre = "layers." + std::to_string(l) + ".";
    layers.push_back({{"index", l}, {"kind", sched.is_full(l) ? "full" : "shared"}, {"source", sched.source(l)},
                      {"has_indexer", w.has_indexer}});
    // Inputs of the module level: the hidden state and the layer's bf16 weights.
    add(g, pre + "hidden_in", bf16_of(h), Role::input);
    add(g, pre + "attn_norm", bf16_of(w.attn_norm), Role::input);
    const std::pair<const char*, const Tensor<float>*> mla[] = {
        {"mla.wq_a", &w.mla.wq_a}, {"mla.q_norm", &w.mla.q_norm}, {"mla.wq_b", &w.mla.wq_b}, {"mla.wkv_a", &w.mla.wkv_a},
        {"mla.kv_norm", &w.mla.kv_norm}, {"mla.wkv_b", &w.mla.wkv_b}, {"mla.wo", &w.mla.wo}};
    for (const auto& [n, t] : mla) add(g, pre + n, bf16_of(*t), Role::input);
    add(g, pre + "attn.x", bf16_of(tr.x), Role::reference);
    add(g, pre + "mla.qr", bf16_of(tr.qr), Role::reference);
    if (w.has_indexer) add_model_indexer(g, w, tr, cache, l, pre, variant, ks, ke);
    const Tensor<int32_t> indices = ref::local_to_kv_rows(tr.used_topk, ks);
    add(g, pre + "attn.q", tr.q, Role::input);
    add(g, pre + "attn.kv", cache.kv[size_t(l)], Role::input);
    add(g, pre + "attn.indices", indices, Role::input);
    add(g, pre + "attn.out", tr.attn.out, Role::output);
    add(g, pre + "attn.out_bf16", tr.attn.out_bf16, Role::output);
    add(g, pre + "attn.lse", tr.attn.lse, Role::output);
    add(g, pre + "attn.max_logits", tr.attn.max_logits, Role::output);
    add(g, pre + "out", bf16_of(tr.out), Role::reference);
    int64_t emulated = 0;
    const cmp::BudgetParts bparts = cmp::attention_budget_parts_set(kern.emulate_attention_lowp, tr.q, cache.kv[size_t(l)],
                                                                    indices, sm, cfg.d_v(), nullptr, nullptr, tr.attn.out, &emulated);
    budgets[pre + "attn.out"] = {{"budget_max_abs", cmp::attention_budget(bparts)},
                                 {"multiple", cmp::kBudgetMultiple},
                                 {"emulation", "f32 logits and softmax, P rounded to bf16, f32 accumulation, bf16 out"}};
    if (S > cmp::kBudgetAllRows)
      budgets[pre + "attn.out"]["emulation_rows"] = cmp::budget_rows_text(emulated, S);
    for (int64_t i = 0; i < h.numel(); ++i) h[i] = round_bf16(h[i] + tr.out[i]);
  }
  add(g, "hidden_out", bf16_of(f.h_out), Role::output);
  Tensor<int32_t> cu({2});
  cu.data = {0, int32_t(S)};
  add(g, "cu_seqlens_q", cu, Role::input);
  add(g, "cu_seqlens_k", cu, Role::input);
  g.manifest = model_manifest(spec, cfg, sched, variant, replay, S, sm, std::move(layers), std::move(budgets));
  return g;
}

}  // namespace indexshare::golden
