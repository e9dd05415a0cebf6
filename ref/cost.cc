// indexshare: the analytic cost model (formulas documented in ref/cost.h).
#include "ref/cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ref/error.h"
#include "ref/problem.h"

namespace indexshare {

// ---- breakdown --------------------------------------------------------------------------------

std::vector<std::string> cost_item_names() {
  return {kCostIndexerProj, kCostIndexerScore, kCostTopk, kCostMlaProj, kCostSparseMla, kCostMoeFfn,
          kCostHead};
}

double CostBreakdown::total_flops() const { return flops_of({}); }
double CostBreakdown::total_bytes() const { return bytes_of({}); }

const CostItem& CostBreakdown::item(const std::string& name) const {
  for (const CostItem& it : items)
    if (it.name == name) return it;
  throw Error("cost breakdown has no item '" + name + "'");
}

double CostBreakdown::flops_of(const std::vector<std::string>& names) const {
  double s = 0;
  if (names.empty()) {
    for (const CostItem& it : items) s += it.flops;
  } else {
    for (const std::string& n : names) s += item(n).flops;
  }
  return s;
}

double CostBreakdown::bytes_of(const std::vector<std::string>& names) const {
  double s = 0;
  if (names.empty()) {
    for (const CostItem& it : items) s += it.bytes;
  } else {
    for (const std::string& n : names) s += item(n).bytes;
  }
  return s;
}

namespace {
const std::vector<std::string>& indexer_items() {
  static const std::vector<std::string> v = {kCostIndexerProj, kCostIndexerScore, kCostTopk};
  return v;
}
}  // namespace

double CostBreakdown::indexer_flops_share() const {
  const double t = total_flops();
  return t > 0 ? flops_of(indexer_items()) / t : 0.0;
}

double CostBreakdown::indexer_bytes_share() const {
  const double t = total_bytes();
  return t > 0 ? bytes_of(indexer_items()) / t : 0.0;
}

void CostOptions::validate() const {
  // Bounded above too: a factor of 1e300 turned every total into inf and every share into NaN.
  auto finite_pos = [](double v, const char* f, bool allow_zero) {
    char got[32];
    std::snprintf(got, sizeof got, "%.6g", v);
    require(std::isfinite(v) && (allow_zero ? v >= 0 : v > 0) && v <= 1e6,
            std::string("cost options: ") + f + " must be a finite number " + (allow_zero ? ">= 0" : "> 0") +
                " and <= 1e6, got " + got);
  };
  finite_pos(flops_per_mac, "flops_per_mac", false);
  finite_pos(fp8_score_weight, "fp8_score_weight", true);
  finite_pos(topk_ops_per_key, "topk_ops_per_key", true);
  finite_pos(fp8_weight_bytes, "fp8_weight_bytes", true);
  require(mtp_layers >= 0, "cost options: mtp_layers must be >= 0, got " + std::to_string(mtp_layers));
  require(prefill_query_tile >= 1,
          "cost options: prefill_query_tile must be >= 1, got " + std::to_string(prefill_query_tile));
}

// ---- formulas ---------------------------------------------------------------------------------

double indexer_cache_entry_bytes(const ModelConfig& cfg) {
  const int64_t D = cfg.index_head_dim;
  return double(D + 4 * ((D + 127) / 128));
}

double mla_cache_entry_bytes(const ModelConfig& cfg) {
  const int64_t r = cfg.kv_lora_rank;
  return double(r + 4 * ((r + 127) / 128) + 2 * cfg.qk_rope_head_dim);
}

double causal_sum(int64_t length) {
  const double L = double(length);
  return L * (L + 1) / 2;
}

double causal_topk_sum(int64_t length, int64_t topk) {
  if (length <= topk) return causal_sum(length);
  return causal_sum(topk) + double(length - topk) * double(topk);
}

namespace {

// sum_{j=1..J} min(j*T, L) with J = ceil(L/T): key reads of a prefill tiled by T queries.
double tiled_key_sum(int64_t length, int64_t tile) {
  const int64_t J = (length + tile - 1) / tile;
  return double(tile) * double(J) * double(J - 1) / 2 + double(length);
}

void validate_cost_config(const ModelConfig& cfg) {
  cfg.validate();
  auto nonneg = [&](int64_t v, const char* f) {
    require(v >= 0, "model config '" + cfg.name + "': " + f + " must be >= 0, got " + std::to_string(v));
  };
  nonneg(cfg.vocab, "vocab");
  nonneg(cfg.n_routed_experts, "n_routed_experts");
  nonneg(cfg.n_shared_experts, "n_shared_experts");
  nonneg(cfg.n_activated_experts, "n_activated_experts");
  nonneg(cfg.moe_inter_dim, "moe_inter_dim");
  nonneg(cfg.first_k_dense, "first_k_dense");
  nonneg(cfg.dense_inter_dim, "dense_inter_dim");
  require(cfg.n_activated_experts <= cfg.n_routed_experts,
          "model config '" + cfg.name + "': n_activated_experts (" + std::to_string(cfg.n_activated_experts) +
              ") must be <= n_routed_experts (" + std::to_string(cfg.n_routed_experts) + ")");
  require(cfg.first_k_dense <= cfg.n_layers,
          "model config '" + cfg.name + "': first_k_dense (" + std::to_string(cfg.first_k_dense) +
              ") must be <= n_layers (" + std::to_string(cfg.n_layers) + ")");
}

void check_inputs(const ModelConfig& cfg, const Schedule& schedule, int64_t context, const CostOptions& o,
                  const char* what) {
  validate_cost_config(cfg);
  o.validate();
  schedule.validate();
  require(schedule.n_layers() == cfg.n_layers,
          "cost model: the schedule has " + std::to_string(schedule.n_layers()) + " layers but model '" +
              cfg.name + "' has n_layers " + std::to_string(cfg.n_layers));
  require(context >= 1, std::string("cost model: ") + what + " must be >= 1, got " + std::to_string(context));
}

// The per-token, context-independent quantities shared by decode and prefill.
struct CostShape {
  double c, w8, b8;           // FLOPs per MAC, FP8 scoring weight, FP8 weight bytes
  double n_full, n_all;       // Full layers (MTP included), all layers (MTP included)
  double n_dense, n_moe;      // dense FFN layers, MoE FFN layers (MTP included)
  double idx_macs;            // indexer projection MACs per Full layer
  double idx_w8, idx_w16;     // its FP8 / bf16 parameters
  double mla_macs;            // MLA projection MACs (= FP8 parameters) per layer
  double attn_macs_per_key;   // sparse MLA MACs per selected key per layer: h*(d_qk + d_v)
  double score_macs_per_key;  // indexer scoring MACs per key per Full layer: H*D
  double dense_macs, expert_macs, router_macs;  // per dense layer, per expert, router per MoE layer
  double head_macs, eh_macs;  // lm head d*V, MTP eh_proj 2*d*d
  double ice, mce;            // cache entry bytes: indexer, MLA
  double k;                   // top-k
  double mtp;
};

CostShape shape(const ModelConfig& cfg, const Schedule& schedule, const CostOptions& o) {
  CostShape s;
  const double d = double(cfg.dim), h = double(cfg.n_heads), H = double(cfg.index_n_heads),
               D = double(cfg.index_head_dim), rq = double(cfg.q_lora_rank), rkv = double(cfg.kv_lora_rank),
               dn = double(cfg.qk_nope_head_dim), dr = double(cfg.qk_rope_head_dim), dvh = double(cfg.v_head_dim);
  s.c = o.flops_per_mac;
  s.w8 = o.fp8_score_weight;
  s.b8 = o.fp8_weight_bytes;
  s.mtp = double(o.mtp_layers);
  s.n_full = double(schedule.n_full()) + s.mtp;
  s.n_all = double(cfg.n_layers) + s.mtp;
  s.n_dense = double(cfg.first_k_dense);
  s.n_moe = double(cfg.n_layers - cfg.first_k_dense) + s.mtp;
  s.idx_w8 = rq * H * D + d * D;
  s.idx_w16 = d * H;
  s.idx_macs = s.idx_w8 + s.idx_w16;
  s.mla_macs = d * rq + rq * h * (dn + dr) + d * (rkv + dr) + h * (dn + dvh) * rkv + h * dvh * d;
  s.attn_macs_per_key = h * double(cfg.d_qk() + cfg.d_v());
  s.score_macs_per_key = H * D;
  s.dense_macs = 3 * d * double(cfg.dense_inter_dim);
  s.expert_macs = 3 * d * double(cfg.moe_inter_dim);
  s.router_macs = d * double(cfg.n_routed_experts);
  s.head_macs = d * double(cfg.vocab);
  s.eh_macs = 2 * d * d;
  s.ice = indexer_cache_entry_bytes(cfg);
  s.mce = mla_cache_entry_bytes(cfg);
  s.k = double(cfg.index_topk);
  return s;
}

// Builds the seven items from the per-token constants and the context sums:
//   tokens   tokens processed (1 decode, L prefill)
//   keys     sum over the tokens of the scored keys (L decode, S1 prefill)
//   sel      sum over the tokens of the selected keys (min(k, L) decode, Sk prefill)
//   kreads   indexer k cache entries read (L decode, the tiled sum in prefill)
//   computed experts computed per token per MoE layer (E_a + E_s)
//   read     experts whose weights are read per MoE layer (E_a + E_s decode, min(E, L*E_a) + E_s
//            prefill)
CostBreakdown build(const CostShape& s, const CostOptions& o, double dim, double tokens, double keys, double sel,
                    double kreads, double computed, double read) {
  CostBreakdown b;
  b.items.push_back({kCostIndexerProj, s.c * s.n_full * s.idx_macs * tokens,
                     s.n_full * (s.idx_w8 * s.b8 + s.idx_w16 * 2 + s.ice * tokens)});
  b.items.push_back({kCostIndexerScore, s.c * s.w8 * s.n_full * s.score_macs_per_key * keys,
                     s.n_full * (s.ice * kreads + 4 * keys)});
  b.items.push_back({kCostTopk, o.topk_ops_per_key * s.n_full * keys, s.n_full * (4 * keys + 4 * sel)});
  b.items.push_back({kCostMlaProj, s.c * s.n_all * s.mla_macs * tokens,
                     s.n_all * (s.mla_macs * s.b8 + s.mce * tokens)});
  b.items.push_back({kCostSparseMla, s.c * s.n_all * s.attn_macs_per_key * sel, s.n_all * (s.mce + 4) * sel});
  b.items.push_back(
      {kCostMoeFfn, s.c * tokens * (s.n_dense * s.dense_macs + s.n_moe * (computed * s.expert_macs + s.router_macs)),
       s.n_dense * s.dense_macs * s.b8 + s.n_moe * (read * s.expert_macs * s.b8 + s.router_macs * 2)});
  // (1 + mtp) lm-head passes and mtp eh_proj per token; each pass reads the head weights (batch 1:
  // they do not stay cached); one embedding row per token.
  b.items.push_back({kCostHead, s.c * tokens * ((1 + s.mtp) * s.head_macs + s.mtp * s.eh_macs),
                     (1 + s.mtp) * s.head_macs * 2 + s.mtp * s.eh_macs * s.b8 + 2 * dim * tokens});
  return b;
}

}  // namespace

CostBreakdown decode_cost(const ModelConfig& cfg, const Schedule& schedule, int64_t context,
                          const CostOptions& options) {
  check_inputs(cfg, schedule, context, options, "decode context length");
  const CostShape s = shape(cfg, schedule, options);
  const double L = double(context), sel = std::min(s.k, L);
  const double active = double(cfg.n_activated_experts + cfg.n_shared_experts);
  return build(s, options, double(cfg.dim), 1, L, sel, L, active, active);
}

CostBreakdown prefill_cost(const ModelConfig& cfg, const Schedule& schedule, int64_t length,
                           const CostOptions& options) {
  check_inputs(cfg, schedule, length, options, "prefill length");
  const CostShape s = shape(cfg, schedule, options);
  const double L = double(length);
  const double S1 = causal_sum(length), Sk = causal_topk_sum(length, cfg.index_topk);
  const double kreads = tiled_key_sum(length, options.prefill_query_tile);
  const double active = double(cfg.n_activated_experts + cfg.n_shared_experts);
  const double read = std::min(double(cfg.n_routed_experts), L * double(cfg.n_activated_experts)) +
                      double(cfg.n_shared_experts);
  return build(s, options, double(cfg.dim), L, S1, Sk, kreads, active, read);
}

std::string cost_mode_name(CostMode mode) { return mode == CostMode::decode ? "decode" : "prefill"; }

CostBreakdown cost(const ModelConfig& cfg, const Schedule& schedule, int64_t context, CostMode mode,
                   const CostOptions& options) {
  return mode == CostMode::decode ? decode_cost(cfg, schedule, context, options)
                                  : prefill_cost(cfg, schedule, context, options);
}

Schedule all_full_schedule(const ModelConfig& cfg) { return schedule_preset("all-full", cfg.n_layers); }

double flops_ratio(const ModelConfig& cfg, const Schedule& schedule, int64_t context, CostMode mode,
                   const CostOptions& options, const std::vector<std::string>& items) {
  const double full = cost(cfg, all_full_schedule(cfg), context, mode, options).flops_of(items);
  const double shared = cost(cfg, schedule, context, mode, options).flops_of(items);
  require(shared > 0, "cost model: the counted items have 0 FLOPs with the schedule; no ratio");
  return full / shared;
}

double flops_ratio(const ModelConfig& cfg, const Schedule& schedule, int64_t context, const Accounting& a) {
  return flops_ratio(cfg, schedule, context, a.mode, a.options, a.items);
}

std::vector<Accounting> accounting_alternatives() {
  const std::vector<std::string> attention = {kCostIndexerProj, kCostIndexerScore, kCostTopk, kCostMlaProj,
                                              kCostSparseMla};
  std::vector<Accounting> v;
  auto add = [&](std::string name, std::string desc, CostMode mode, CostOptions o, std::vector<std::string> items) {
    v.push_back({std::move(name), std::move(desc), mode, o, std::move(items)});
  };
  CostOptions o;
  add("default", "decode, whole model (every item), 2 FLOPs/MAC, FP8 MAC = bf16 MAC", CostMode::decode, o, {});
  add("macs", "as default, 1 FLOP per MAC (only top-k ops change weight)", CostMode::decode,
      [] { CostOptions x; x.flops_per_mac = 1; return x; }(), {});
  add("fp8-half", "as default, an FP8 scoring MAC weighted 1/2 (FP8 tensor cores run 2x bf16)", CostMode::decode,
      [] { CostOptions x; x.fp8_score_weight = 0.5; return x; }(), {});
  add("mtp-1", "as default, plus one MTP layer per token (always Full, own lm-head pass)", CostMode::decode,
      [] { CostOptions x; x.mtp_layers = 1; return x; }(), {});
  add("no-sparse-mla", "decode, 2 x active parameters + indexer scoring + top-k (sparse MLA core omitted)",
      CostMode::decode, o, {kCostIndexerProj, kCostIndexerScore, kCostTopk, kCostMlaProj, kCostMoeFfn, kCostHead});
  add("attention-only", "decode, attention block only (indexer + MLA projections + sparse MLA; no FFN, no head)",
      CostMode::decode, o, attention);
  add("attention-core", "decode, indexer scoring + top-k + sparse MLA only (no projections)", CostMode::decode, o,
      {kCostIndexerScore, kCostTopk, kCostSparseMla});
  add("indexer-only", "decode, indexer items only (the upper bound n_layers / n_full)", CostMode::decode, o,
      indexer_items());
  add("prefill", "whole prefill of L tokens / L (causal average), whole model", CostMode::prefill, o, {});
  add("prefill-attention", "whole prefill, attention block only", CostMode::prefill, o, attention);
  return v;
}

// ---- JSON configs -----------------------------------------------------------------------------

namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  const std::string& src;
  std::set<std::string> seen;

  [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
    throw Error(src + ": field '" + field + "': " + msg);
  }
  const json* find(const std::string& f) {
    seen.insert(f);
    auto it = j.find(f);
    return it == j.end() ? nullptr : &*it;
  }
  const json& need(const std::string& f) {
    const json* v = find(f);
    if (!v) fail(f, "missing (required)");
    return *v;
  }
  int64_t as_int(const std::string& f, const json& v) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      fail(f, "out of range, got " + v.dump());
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double x = v.get<double>();
      if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 9e15) return int64_t(x);
    }
    fail(f, "must be an integer, got " + v.dump());
  }
  int as_int32(const std::string& f, const json& v) const {
    const int64_t x = as_int(f, v);
    if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
      fail(f, "out of range, got " + v.dump());
    return int(x);
  }
  double as_double(const std::string& f, const json& v) const {
    if (!v.is_number()) fail(f, "must be a number, got " + v.dump());
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail(f, "must be finite");
    return x;
  }
  std::string as_string(const std::string& f, const json& v) const {
    if (!v.is_string()) fail(f, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  void req(const std::string& f, int64_t& out) { out = as_int(f, need(f)); }
  void req(const std::string& f, int& out) { out = as_int32(f, need(f)); }
  void opt(const std::string& f, int64_t& out) { if (const json* v = find(f)) out = as_int(f, *v); }
  void opt(const std::string& f, int& out) { if (const json* v = find(f)) out = as_int32(f, *v); }
  void opt(const std::string& f, double& out) { if (const json* v = find(f)) out = as_double(f, *v); }
  void opt(const std::string& f, float& out) {
    if (const json* v = find(f)) {
      const double x = as_double(f, *v);
      if (std::fabs(x) > double(std::numeric_limits<float>::max())) fail(f, "out of float range");
      out = float(x);
    }
  }
  void opt(const std::string& f, bool& out) {
    if (const json* v = find(f)) {
      if (!v->is_boolean()) fail(f, "must be true or false, got " + v->dump());
      out = v->get<bool>();
    }
  }
  void opt(const std::string& f, std::string& out) { if (const json* v = find(f)) out = as_string(f, *v); }
};

std::string file_stem(const std::string& path) {
  std::string s = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  const size_t dot = s.rfind('.');
  if (dot != std::string::npos && dot > 0) s = s.substr(0, dot);
  return s;
}

}  // namespace

ModelConfig parse_config_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(source + ": a model config must be a JSON object, got " + std::string(j.type_name()));
  Reader r{j, source, {}};
  ModelConfig c;
  c.name = file_stem(source);
  r.opt("name", c.name);
  r.req("n_layers", c.n_layers);
  r.req("dim", c.dim);
  r.req("vocab", c.vocab);
  r.req("n_heads", c.n_heads);
  r.req("q_lora_rank", c.q_lora_rank);
  r.req("kv_lora_rank", c.kv_lora_rank);
  r.req("qk_nope_head_dim", c.qk_nope_head_dim);
  r.req("qk_rope_head_dim", c.qk_rope_head_dim);
  r.req("v_head_dim", c.v_head_dim);
  r.req("index_n_heads", c.index_n_heads);
  r.req("index_head_dim", c.index_head_dim);
  r.req("index_topk", c.index_topk);
  r.req("n_routed_experts", c.n_routed_experts);
  r.req("n_shared_experts", c.n_shared_experts);
  r.req("n_activated_experts", c.n_activated_experts);
  r.req("moe_inter_dim", c.moe_inter_dim);
  r.req("first_k_dense", c.first_k_dense);
  r.req("dense_inter_dim", c.dense_inter_dim);
  if (const json* v = r.find("indexer_rope")) {
    try { c.indexer_rope = ref::parse_rope_layout(r.as_string("indexer_rope", *v)); }
    catch (const Error& e) { r.fail("indexer_rope", e.what()); }
  }
  if (const json* v = r.find("index_scale_rule")) {
    try { c.index_scale_rule = parse_scale_rule(r.as_string("index_scale_rule", *v)); }
    catch (const Error& e) { r.fail("index_scale_rule", e.what()); }
  }
  r.opt("rope_theta", c.rope_theta);
  r.opt("yarn", c.yarn);
  r.opt("yarn_factor", c.yarn_factor);
  r.opt("yarn_original_seq_len", c.yarn_original_seq_len);
  r.opt("yarn_beta_fast", c.yarn_beta_fast);
  r.opt("yarn_beta_slow", c.yarn_beta_slow);
  r.opt("yarn_mscale", c.yarn_mscale);
  r.opt("rms_eps", c.rms_eps);
  r.opt("index_norm_eps", c.index_norm_eps);
  r.opt("seq", c.seq);
  // Schedule, HF style; null means "not set".
  auto present = [&](const char* f) -> const json* {
    const json* v = r.find(f);
    return v && !v->is_null() ? v : nullptr;
  };
  if (const json* v = present("index_topk_freq")) c.schedule.freq = r.as_int32("index_topk_freq", *v);
  if (const json* v = present("index_skip_topk_offset"))
    c.schedule.offset = r.as_int32("index_skip_topk_offset", *v);
  if (const json* v = present("index_topk_pattern")) c.schedule.pattern = r.as_string("index_topk_pattern", *v);
  if (const json* v = present("indexer_types")) {
    if (!v->is_array()) r.fail("indexer_types", "must be a list of \"full\" / \"shared\", got " + v->dump());
    std::vector<std::string> types;
    for (size_t i = 0; i < v->size(); ++i)
      types.push_back(r.as_string("indexer_types[" + std::to_string(i) + "]", (*v)[i]));
    c.schedule.indexer_types = std::move(types);
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!r.seen.count(it.key()) && (it.key().empty() || it.key()[0] != '_'))
      r.fail(it.key(), "unknown field (expected a ModelConfig field name; keys starting with '_' are comments)");
  try {
    validate_cost_config(c);
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  return c;
}

ModelConfig load_config_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  require(bool(f), "cannot open model config file '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  require(!f.bad(), "cannot read model config file '" + path + "'");
  return parse_config_json(ss.str(), path);
}

std::string config_json_text(const ModelConfig& c) {
  json j = json::object();
  j["name"] = c.name;
  j["n_layers"] = c.n_layers;
  j["dim"] = c.dim;
  j["vocab"] = c.vocab;
  j["n_heads"] = c.n_heads;
  j["q_lora_rank"] = c.q_lora_rank;
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["indexer_rope"] = ref::rope_layout_name(c.indexer_rope);
  j["index_scale_rule"] = scale_rule_name(c.index_scale_rule);
  j["rope_theta"] = c.rope_theta;
  j["yarn"] = c.yarn;
  j["yarn_factor"] = c.yarn_factor;
  j["yarn_original_seq_len"] = c.yarn_original_seq_len;
  j["yarn_beta_fast"] = c.yarn_beta_fast;
  j["yarn_beta_slow"] = c.yarn_beta_slow;
  j["yarn_mscale"] = c.yarn_mscale;
  j["rms_eps"] = f32_json(c.rms_eps);
  j["index_norm_eps"] = f32_json(c.index_norm_eps);
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_activated_experts"] = c.n_activated_experts;
  j["moe_inter_dim"] = c.moe_inter_dim;
  j["first_k_dense"] = c.first_k_dense;
  j["dense_inter_dim"] = c.dense_inter_dim;
  j["seq"] = c.seq;
  j["index_topk_freq"] = c.schedule.freq;
  j["index_skip_topk_offset"] = c.schedule.offset;
  j["index_topk_pattern"] = c.schedule.pattern ? json(*c.schedule.pattern) : json(nullptr);
  j["indexer_types"] = c.schedule.indexer_types ? json(*c.schedule.indexer_types) : json(nullptr);
  return j.dump(2) + "\n";
}

}  // namespace indexshare
