// golden sets: Hunyuan HY V4 (kind "hyv4", tools/lib/golden_hyv4.h).

#include "tools/lib/golden_hyv4.h"

#include <map>
#include <set>
#include <sstream>

#include "ref/error.h"
#include "ref/numerics.h"
#include "tools/lib/golden/internal.h"

#ifndef INDEXSHARE_VERSION
#define INDEXSHARE_VERSION "dev"
#endif

namespace indexshare::golden {

using nlohmann::json;
using namespace detail;

namespace {

[[noreturn]] void bad_field(const std::string& key, const std::string& what) {
  throw Error("hyv4 field '" + key + "': " + what);
}

}  // namespace

Hyv4Spec parse_hyv4_spec(const std::string& text) {
  Hyv4Spec s;
  std::string rest, rope, vd;
  bool has_sched = false;
  std::istringstream is(text);
  for (std::string tok; is >> tok;) {
    if (tok.rfind("rope=", 0) == 0) {
      if (!rope.empty()) bad_field("rope", "given twice");
      rope = tok.substr(5);
      if (rope.empty()) bad_field("rope", "is empty");
    } else if (tok.rfind("vd=", 0) == 0) {
      if (!vd.empty()) bad_field("vd", "given twice");
      vd = tok.substr(3);
      if (vd.empty()) bad_field("vd", "is empty");
    } else {
      has_sched = has_sched || tok.rfind("sched=", 0) == 0;
      rest += tok + " ";
    }
  }
  s.problem = parse_problem(rest + (has_sched ? "" : "sched=hy-v4"));
  const Problem& p = s.problem;
  const Problem d;
  // The problem fields a HY V4 set has no use for: refused rather than silently ignored.
  const std::pair<bool, const char*> unused[] = {
      {p.indexer != d.indexer, "indexer"}, {p.scale != d.scale, "scale"},    {p.sim != d.sim, "sim"},
      {p.drift != d.drift, "drift"},       {p.jumps != d.jumps, "jumps"},    {p.jump_rho != d.jump_rho, "jumprho"},
      {p.recency != d.recency, "recency"}, {p.sinks != d.sinks, "sinks"},    {p.own != d.own, "own"},
      {p.n_seqs != d.n_seqs, "nseq"}};
  for (const auto& [given, field] : unused)
    if (given) bad_field(field, "has no meaning in a HY V4 set (its indexer is ref/hyv4's, one sequence), leave it out");
  if (p.sink != SinkMode::none && p.sink != SinkMode::random)
    bad_field("sink", "must be none or random (HY V4's learnable per-head sink), got " + sink_mode_name(p.sink));
  ref::hyv4::Config& c = s.cfg;
  c.s_q = p.s_q, c.s_kv = p.s_kv, c.heads = p.index_n_heads, c.dim = p.index_head_dim, c.index_topk = p.index_topk;
  c.h_q = p.h_q, c.kv_lora = p.d_v, c.attn_rope = p.d_qk - p.d_v, c.sm_scale = p.sm_scale();
  c.sink = p.sink == SinkMode::random;  // (strong is refused above: HY V4's sink is drawn as the model's)
  c.seed = p.seed, c.dist = p.dist;
  c.rope = rope.empty() ? c.dim / 2 : descriptor_count("hyv4", "rope", rope);
  c.v_dim = vd.empty() ? c.kv_lora / 2 : descriptor_count("hyv4", "vd", vd);
  if (c.rope < 2 || c.rope % 2 || c.rope > c.dim)
    bad_field("rope", "must be even with 2 <= rope <= id = " + std::to_string(c.dim) + ", got " + std::to_string(c.rope));
  if (c.v_dim < 1) bad_field("vd", "must be >= 1, got " + std::to_string(c.v_dim));
  c.validate();
  return s;
}

std::string to_string(const Hyv4Spec& s) {
  // sched= always printed: a descriptor without one is hy-v4, not the problem's all-full.
  const std::string p = to_string(s.problem);
  return p + (s.problem.sched == Problem().sched ? " sched=" + s.problem.sched : "") + " rope=" + std::to_string(s.cfg.rope) +
         " vd=" + std::to_string(s.cfg.v_dim);
}

std::string hyv4_replay(const Hyv4Spec& s, Impl impl) {
  return "indexshare golden --kind hyv4 --problem \"" + to_string(s) + "\"" + (impl == Impl::ref ? "" : " --impl " + impl_name(impl));
}

namespace {

Tensor<bf16_t> bf16_of(const Tensor<float>& x) { return to_bf16_tensor(x); }

// The indexer's q and k as stored: BF16 when every value is a bf16 value (generated inputs: the
// projections' bf16 outputs), F32 otherwise (a model dump's f32 projections).
io::TensorView values_of(const Tensor<float>& x) {
  for (int64_t i = 0; i < x.numel(); ++i)
    if (bf16_to_f32(f32_to_bf16(x[i])) != x[i]) return io::make_view("", x);
  return io::make_view("", to_bf16_tensor(x));
}

json conventions() {
  return {
      {"indexer_rope", "the trailing rope dims of each indexer head ([D - rope pass | rope rot]), interleaved pairs (2j, 2j+1) "
                       "rotated in place, at the absolute position (query row t: s_kv - s_q + t; key s: s)"},
      {"k_norm", "LayerNorm of indexer.k with k_norm_w, k_norm_b, eps 1e-5: double, one rounding to f32"},
      {"weights", "indexer.weights = (weights_raw * f32(H^-1/2)) * f32(D^-1/2), two f32 products in that order"},
      {"scores", "sum_h weights[t,h] ReLU(q_rope[t,h] . k_rope[s]) (double, one rounding), -inf outside [ks, ke) = [0, p + 1)"},
      {"tie_rule", "indexer.topk: score descending, then key ascending; -1 past the row's p + 1 causal keys"},
      {"shared_indices", "a Shared layer runs no indexer: its attn.indices are its source (the last Full) layer's top-k"},
      {"softmax", "sparse MLA attention over attn.indices (absorbed: one latent kv head, V = the first dv columns), "
                  "sm_scale on q.k; the sink an UNSCALED logit of a zero value per head (denominator exp(sink) + sum exp(s_i))"},
      {"lse", "natural log, without the sink; empty row: out 0, lse +inf, max_logits -inf"},
      {"o_v", "attn.o_v[t,h,j] = sum_c w_uv[h,j,c] attn.out[t,h,c] (double, one rounding to f32)"},
      {"gate", "attn.gated = f32(o_v * f32(1 / (1 + exp(-gate)))), attn.gated_bf16 = bf16(attn.gated): o_proj's input"},
  };
}

}  // namespace

GoldenSet build_hyv4(const Hyv4Spec& s, const std::string& replay, Impl impl, std::vector<ref::hyv4::LayerInputs>* given) {
  const ref::hyv4::Config& c = s.cfg;
  c.validate();
  const Schedule sch = s.problem.schedule();
  const ref::Kernels kern = kernels_for(impl);
  require(!given || int(given->size()) == sch.n_layers(), "golden hyv4: the given inputs do not hold every layer");
  GoldenSet g;
  json layers = json::array();
  std::vector<Tensor<int32_t>> topk(size_t(sch.n_layers()));
  for (int l = 0; l < sch.n_layers(); ++l) {
    const bool full = sch.is_full(l);
    const ref::hyv4::LayerInputs in = given ? std::move((*given)[size_t(l)]) : ref::hyv4::make_layer_inputs(c, l, full, kern);
    // ref::hyv4::run_stack, layer by layer: a Full layer runs its indexer, a Shared layer attends over its source's top-k.
    ref::hyv4::LayerOutputs o;
    if (full) {
      o = ref::hyv4::run_layer(c, in, l, kern);
    } else {
      o.indices = topk[size_t(sch.source(l))];
      o.attn = ref::hyv4::gated_attention(in.attn_q, in.attn_kv, o.indices, in.sink, c.sm_scale, c.kv_lora, &in.w_uv, in.gate, kern);
    }
    topk[size_t(l)] = o.indices;
    const std::string pre = "layers." + std::to_string(l) + ".";
    if (full) {
      ref::hyv4::IndexerOutputs& ix = *o.indexer;
      for (const auto& [n, t] : {std::pair<const char*, const Tensor<float>*>{"indexer.q", &in.q}, {"indexer.k", &in.k}}) {
        io::TensorView v = values_of(*t);
        v.name = pre + n;
        g.tensors.push_back(std::move(v));
        g.roles[pre + n] = Role::input;
      }
      g.add(pre + "indexer.k_norm_w", in.k_norm_w, Role::input);
      g.add(pre + "indexer.k_norm_b", in.k_norm_b, Role::input);
      g.add(pre + "indexer.weights_raw", in.weights, Role::input);
      g.add(pre + "indexer.ks", std::move(ix.ks), Role::reference);
      g.add(pre + "indexer.ke", std::move(ix.ke), Role::reference);
      g.add(pre + "indexer.k_norm", std::move(ix.k_norm), Role::output);
      g.add(pre + "indexer.q_rope", std::move(ix.q_rope), Role::output);
      g.add(pre + "indexer.k_rope", std::move(ix.k_rope), Role::output);
      g.add(pre + "indexer.weights", std::move(ix.weights), Role::output);
      g.add(pre + "indexer.scores", std::move(ix.scores), Role::output);
      g.add(pre + "indexer.topk", Tensor<int32_t>(ix.indices), Role::output);
    }
    g.add(pre + "attn.q", in.attn_q, Role::input);
    g.add(pre + "attn.kv", in.attn_kv, Role::input);
    if (c.sink) g.add(pre + "attn.sink", in.sink, Role::input);
    g.add(pre + "attn.w_uv", bf16_of(in.w_uv), Role::input);
    g.add(pre + "attn.gate", bf16_of(in.gate), Role::input);
    Tensor<int32_t> idx = o.indices;
    idx.shape = {c.s_q, 1, c.index_topk};
    g.add(pre + "attn.indices", std::move(idx), Role::input);
    g.add(pre + "attn.out", std::move(o.attn.attn.out), Role::output);
    g.add(pre + "attn.out_bf16", std::move(o.attn.attn.out_bf16), Role::output);
    g.add(pre + "attn.lse", std::move(o.attn.attn.lse), Role::output);
    g.add(pre + "attn.max_logits", std::move(o.attn.attn.max_logits), Role::output);
    g.add(pre + "attn.o_v", std::move(o.attn.o_v), Role::output);
    g.add(pre + "attn.gated", std::move(o.attn.gated), Role::output);
    g.add(pre + "attn.gated_bf16", std::move(o.attn.gated_bf16), Role::output);
    layers.push_back({{"index", l}, {"kind", full ? "full" : "shared"}, {"source", sch.source(l)}, {"has_indexer", full}});
  }
  g.manifest = manifest_head("hyv4", to_string(s), replay, impl);
  g.manifest.update(json{
      {"config",
       {{"s_q", c.s_q}, {"s_kv", c.s_kv}, {"index_n_heads", c.heads}, {"index_head_dim", c.dim}, {"index_rope", c.rope},
        {"index_topk", c.index_topk}, {"norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta}, {"h_q", c.h_q},
        {"kv_lora", c.kv_lora}, {"attn_rope", c.attn_rope}, {"d_qk", c.d_qk()}, {"v_dim", c.v_dim}, {"sm_scale", c.sm_scale},
        {"sink", c.sink}, {"n_layers", sch.n_layers()}, {"seed", c.seed}, {"dist", dist_name(c.dist)}}},
      {"layers", layers},
      {"schedule", {{"spec", s.problem.sched}, {"pattern", sch.pattern()}}},
      {"conventions", conventions()},
      {"budgets", json::object()},
  });
  return g;
}

Hyv4Layout hyv4_layout(const json& m) {
  Hyv4Layout v;
  v.spec = parse_hyv4_spec(m.at("problem").get<std::string>());
  v.schedule = v.spec.problem.schedule();
  return v;
}

// ---- reading: the manifest and tensor checks of kind hyv4 ----------------------------------------

namespace {

// When a layer holds a tensor: every layer, Full layers, every layer of a set with the sink.
enum class HyNeed { always, full, sink };
struct HyRule {
  const char* name;
  Role role;
  io::DType dtype;
  HyNeed need;
};
const std::vector<HyRule>& hyv4_rules() {
  using io::DType;
  static const std::vector<HyRule> r = {
      {"indexer.q", Role::input, DType::BF16, HyNeed::full},
      {"indexer.k", Role::input, DType::BF16, HyNeed::full},
      {"indexer.k_norm_w", Role::input, DType::F32, HyNeed::full},
      {"indexer.k_norm_b", Role::input, DType::F32, HyNeed::full},
      {"indexer.weights_raw", Role::input, DType::F32, HyNeed::full},
      {"indexer.ks", Role::reference, DType::I32, HyNeed::full},
      {"indexer.ke", Role::reference, DType::I32, HyNeed::full},
      {"indexer.k_norm", Role::output, DType::F32, HyNeed::full},
      {"indexer.q_rope", Role::output, DType::F32, HyNeed::full},
      {"indexer.k_rope", Role::output, DType::F32, HyNeed::full},
      {"indexer.weights", Role::output, DType::F32, HyNeed::full},
      {"indexer.scores", Role::output, DType::F32, HyNeed::full},
      {"indexer.topk", Role::output, DType::I32, HyNeed::full},
      {"attn.q", Role::input, DType::BF16, HyNeed::always},
      {"attn.kv", Role::input, DType::BF16, HyNeed::always},
      {"attn.sink", Role::input, DType::F32, HyNeed::sink},
      {"attn.w_uv", Role::input, DType::BF16, HyNeed::always},
      {"attn.gate", Role::input, DType::BF16, HyNeed::always},
      {"attn.indices", Role::input, DType::I32, HyNeed::always},
      {"attn.out", Role::output, DType::F32, HyNeed::always},
      {"attn.out_bf16", Role::output, DType::BF16, HyNeed::always},
      {"attn.lse", Role::output, DType::F32, HyNeed::always},
      {"attn.max_logits", Role::output, DType::F32, HyNeed::always},
      {"attn.o_v", Role::output, DType::F32, HyNeed::always},
      {"attn.gated", Role::output, DType::F32, HyNeed::always},
      {"attn.gated_bf16", Role::output, DType::BF16, HyNeed::always},
  };
  return r;
}

Shape hyv4_shape(const std::string& rest, const ref::hyv4::Config& c) {
  const int64_t sq = c.s_q, skv = c.s_kv, H = c.heads, D = c.dim, k = c.index_topk, hq = c.h_q, V = c.v_dim;
  if (rest == "indexer.q" || rest == "indexer.q_rope") return {sq, H, D};
  if (rest == "indexer.k" || rest == "indexer.k_norm" || rest == "indexer.k_rope") return {skv, D};
  if (rest == "indexer.k_norm_w" || rest == "indexer.k_norm_b") return {D};
  if (rest == "indexer.weights_raw" || rest == "indexer.weights") return {sq, H};
  if (rest == "indexer.ks" || rest == "indexer.ke") return {sq};
  if (rest == "indexer.scores") return {sq, skv};
  if (rest == "indexer.topk") return {sq, k};
  if (rest == "attn.q") return {sq, hq, c.d_qk()};
  if (rest == "attn.kv") return {skv, 1, c.d_qk()};
  if (rest == "attn.sink") return {hq};
  if (rest == "attn.w_uv") return {hq, V, c.kv_lora};
  if (rest == "attn.indices") return {sq, 1, k};
  if (rest == "attn.out" || rest == "attn.out_bf16") return {sq, hq, c.kv_lora};
  if (rest == "attn.lse" || rest == "attn.max_logits") return {sq, hq};
  return {sq, hq, V};  // attn.gate, attn.o_v, attn.gated, attn.gated_bf16
}

class Hyv4Check : KindCheck {
 public:
  using KindCheck::KindCheck;
  void run() {
    problem();
    config();
    layers();
    tensors();
  }

 private:
  void problem() {
    try {
      spec_ = parse_hyv4_spec(m_["problem"].get<std::string>());
      sch_ = spec_.problem.schedule();
    } catch (const Error& e) {
      fail("problem", std::string("is not a hyv4 descriptor: ") + e.what());
    }
  }
  void config();
  void layers();
  void tensors();

  Hyv4Spec spec_;
  Schedule sch_;
};

// The config block: every field the problem gives, equal to it.
void Hyv4Check::config() {
  if (!m_.contains("config") || !m_["config"].is_object()) fail("config", "is missing or not an object");
  const json& c = m_["config"];
  const ref::hyv4::Config& k = spec_.cfg;
  const std::pair<const char*, json> want[] = {
      {"s_q", k.s_q},         {"s_kv", k.s_kv},       {"index_n_heads", k.heads},     {"index_head_dim", k.dim},
      {"index_rope", k.rope}, {"index_topk", k.index_topk}, {"h_q", k.h_q},           {"kv_lora", k.kv_lora},
      {"attn_rope", k.attn_rope}, {"d_qk", k.d_qk()}, {"v_dim", k.v_dim},             {"sink", k.sink},
      {"n_layers", sch_.n_layers()}, {"seed", k.seed}, {"dist", dist_name(k.dist)}};
  for (const auto& [f, v] : want)
    if (!c.contains(f) || c[f] != v)
      fail(std::string("config.") + f, "is " + (c.contains(f) ? c[f].dump() : std::string("missing")) + ", but the problem gives " + v.dump());
  for (const auto& [f, v] : std::vector<std::pair<const char*, float>>{{"sm_scale", k.sm_scale}, {"norm_eps", k.norm_eps}})
    if (!c.contains(f) || !c[f].is_number() || c[f].get<float>() != v)
      fail(std::string("config.") + f, "is " + (c.contains(f) ? c[f].dump() : std::string("missing")) + ", but the problem gives " +
                                           json(v).dump());
  if (!c.contains("rope_theta") || !c["rope_theta"].is_number() || c["rope_theta"].get<double>() != k.rope_theta)
    fail("config.rope_theta", "is not " + json(k.rope_theta).dump());
}

void Hyv4Check::layers() {
  if (!m_.contains("layers") || !m_["layers"].is_array()) fail("layers", "is missing or not an array");
  const json& L = m_["layers"];
  if (int64_t(L.size()) != sch_.n_layers())
    fail("layers", "lists " + std::to_string(L.size()) + " layers, but the problem gives " + std::to_string(sch_.n_layers()));
  for (int l = 0; l < sch_.n_layers(); ++l) {
    const std::string f = "layers[" + std::to_string(l) + "]";
    const json& e = L[size_t(l)];
    const bool full = sch_.is_full(l);
    if (!e.is_object() || e.value("index", -1) != l) fail(f + ".index", "is missing or not its position " + std::to_string(l));
    if (!e.contains("kind") || e["kind"] != (full ? "full" : "shared"))
      fail(f + ".kind", "is not \"" + std::string(full ? "full" : "shared") + "\" (schedule " + sch_.pattern() + ")");
    if (!e.contains("source") || e["source"] != sch_.source(l))
      fail(f + ".source", "is not " + std::to_string(sch_.source(l)) + ", the schedule's source of layer " + std::to_string(l));
    if (!e.contains("has_indexer") || e["has_indexer"] != full) fail(f + ".has_indexer", "is not " + json(full).dump());
  }
  if (!m_.contains("schedule") || !m_["schedule"].is_object() || m_["schedule"].value("pattern", "") != sch_.pattern())
    fail("schedule.pattern", "is not the problem's schedule " + sch_.pattern());
}

void Hyv4Check::tensors() {
  for (int l = 0; l < sch_.n_layers(); ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    for (const HyRule& r : hyv4_rules()) {
      if ((r.need == HyNeed::full && !sch_.is_full(l)) || (r.need == HyNeed::sink && !spec_.cfg.sink)) continue;
      // indexer.q and k: BF16, or F32 (a model dump's f32 projections)
      const bool either = r.dtype == io::DType::BF16 && (std::string(r.name) == "indexer.q" || std::string(r.name) == "indexer.k");
      expect_tensor(pre + r.name, r.dtype, hyv4_shape(r.name, spec_.cfg), r.role, sch_.is_full(l) ? "Full" : "Shared",
                    either ? std::optional<io::DType>(io::DType::F32) : std::nullopt);
    }
  }
  no_other_tensors("a hyv4 set of this problem");
}

}  // namespace

void check_hyv4_manifest(const Loaded& g, const std::string& mpath) { Hyv4Check(g, mpath).run(); }

}  // namespace indexshare::golden
