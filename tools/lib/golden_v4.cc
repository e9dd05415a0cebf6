#include "tools/lib/golden_v4.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "ref/error.h"
#include "tools/lib/golden/internal.h"
#include "ref/numerics.h"

namespace indexshare::golden {

using nlohmann::json;
using detail::KindCheck;
using detail::manifest_head;
using ref::v4::LayerType;

namespace {

[[noreturn]] void bad_field(const std::string& key, const std::string& what) {
  throw Error("v4 spec field '" + key + "': " + what);
}

int64_t int_value(const std::string& key, const std::string& v, int64_t lo) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    bad_field(key, "'" + v + "' is not an integer");
  }
  if (used != v.size() || v.empty() || !(std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '-'))
    bad_field(key, "'" + v + "' is not an integer");
  if (x < lo) bad_field(key, "must be >= " + std::to_string(lo) + ", got " + v);
  if (x > (int64_t(1) << 31) - 1) bad_field(key, "must be < 2^31, got " + v);
  return x;
}

}  // namespace

std::string csa_pattern(const ref::v4::Schedule& s) {
  std::string p;
  for (size_t l = 0; l < s.types.size(); ++l)
    if (s.types[l] == LayerType::csa) p += s.full(l) ? 'F' : 'S';
  return p;
}

ref::v4::Schedule V4Spec::schedule() const {
  const std::vector<LayerType> t = ref::v4::parse_layer_types(types);
  if (freq > 0) return ref::v4::from_freq(t, freq, rule);
  if (!pattern.empty()) return ref::v4::from_pattern(t, pattern);
  return ref::v4::all_full(t);
}

V4Spec parse_v4_spec(const std::string& text) {
  V4Spec s;
  s.cfg = ref::v4::tiny_config();
  s.cfg.compress_rope.original_max_pos = 65536;
  std::map<std::string, std::string> kv;
  std::istringstream is(text);
  std::string tok;
  static const std::vector<std::string> keys = {"t",  "h",   "d",     "w",    "csa",  "hca",   "ih",   "id",  "k",
                                                "rope", "ctx", "types", "sched", "freq", "rule", "rot", "seed"};
  while (is >> tok) {
    const size_t eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("v4 spec: '" + tok + "' is not key=value");
    const std::string key = tok.substr(0, eq), val = tok.substr(eq + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      throw Error("v4 spec field '" + key + "': unknown key (t h d w csa hca ih id k rope ctx types sched freq rule rot seed)");
    if (!kv.emplace(key, val).second) bad_field(key, "given twice");
  }
  for (const char* req : {"t", "h", "d", "w", "csa", "hca", "ih", "id", "k", "rope", "types"})
    if (!kv.count(req)) bad_field(req, "is missing");
  ref::v4::Config& c = s.cfg;
  c.n_tokens = int_value("t", kv["t"], 1);
  c.n_heads = int_value("h", kv["h"], 1);
  c.head_dim = int_value("d", kv["d"], 1);
  c.window = int_value("w", kv["w"], 1);
  c.csa_ratio = int_value("csa", kv["csa"], 1);
  c.hca_ratio = int_value("hca", kv["hca"], 1);
  c.index_n_heads = int_value("ih", kv["ih"], 1);
  c.index_head_dim = int_value("id", kv["id"], 1);
  c.index_topk = int_value("k", kv["k"], 1);
  const int64_t rope = int_value("rope", kv["rope"], 2);
  if (rope % 2 || rope > c.head_dim || rope > c.index_head_dim)
    bad_field("rope", "must be even and <= d and id, got " + kv["rope"]);
  c.main_rope.rope_dim = c.compress_rope.rope_dim = int(rope);
  if (kv.count("ctx")) c.compress_rope.original_max_pos = int(int_value("ctx", kv["ctx"], 1));
  if (kv.count("rot")) {
    if (kv["rot"] != "hf" && kv["rot"] != "megatron") bad_field("rot", "must be hf or megatron, got '" + kv["rot"] + "'");
    c.rotation = ref::v4::parse_rotation(kv["rot"]);
    if (c.rotation == ref::v4::IndexerRotation::hadamard && (c.index_head_dim & (c.index_head_dim - 1)))
      bad_field("rot", "megatron's Hadamard rotation needs id a power of two, got " + kv["id"]);
  }
  if (kv.count("seed")) c.seed = uint64_t(int_value("seed", kv["seed"], 0));
  s.types = kv["types"];
  if (s.types.empty()) bad_field("types", "is empty");
  for (size_t i = 0; i < s.types.size(); ++i)
    if (s.types[i] != 'S' && s.types[i] != 'C' && s.types[i] != 'H')
      bad_field("types", "character '" + s.types.substr(i, 1) + "' at " + std::to_string(i) + " is not S, C or H");
  if (kv.count("sched") && kv.count("freq")) bad_field("sched", "give sched= or freq=, not both");
  if (kv.count("rule") && !kv.count("freq")) bad_field("rule", "needs freq=");
  if (kv.count("sched")) s.pattern = kv["sched"];
  if (kv.count("freq")) {
    s.freq = int(int_value("freq", kv["freq"], 1));
    if (!kv.count("rule")) bad_field("rule", "is missing (with freq=: j%f==0 or max(j-1,0)%f)");
    try {
      s.rule = ref::v4::parse_freq_rule(kv["rule"]);
    } catch (const Error&) {
      bad_field("rule", "must be j%f==0 or max(j-1,0)%f, got '" + kv["rule"] + "'");
    }
  }
  try {
    (void)s.schedule();
  } catch (const Error& e) {
    bad_field("sched", e.what());
  }
  try {
    c.validate();
  } catch (const Error& e) {
    bad_field("t", e.what());
  }
  return s;
}

std::string to_string(const V4Spec& s) {
  const ref::v4::Config& c = s.cfg;
  std::ostringstream os;
  os << "t=" << c.n_tokens << " h=" << c.n_heads << " d=" << c.head_dim << " w=" << c.window << " csa=" << c.csa_ratio
     << " hca=" << c.hca_ratio << " ih=" << c.index_n_heads << " id=" << c.index_head_dim << " k=" << c.index_topk
     << " rope=" << c.main_rope.rope_dim << " ctx=" << c.compress_rope.original_max_pos << " types=" << s.types;
  if (s.freq > 0) os << " freq=" << s.freq << " rule=" << ref::v4::freq_rule_name(s.rule);
  else os << " sched=" << csa_pattern(s.schedule());
  os << " rot=" << ref::v4::rotation_name(c.rotation) << " seed=" << c.seed;
  return os.str();
}


namespace {

json rope_json(const ref::v4::RopeParams& r) {
  return {{"rope_dim", r.rope_dim}, {"theta", r.theta}, {"yarn", r.yarn}, {"factor", r.factor},
          {"original_max_pos", r.original_max_pos}, {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow}};
}

ref::v4::RopeParams rope_of(const json& j) {
  ref::v4::RopeParams r;
  r.rope_dim = j.at("rope_dim").get<int>();
  r.theta = j.at("theta").get<double>();
  r.yarn = j.at("yarn").get<bool>();
  r.factor = j.at("factor").get<double>();
  r.original_max_pos = j.at("original_max_pos").get<int>();
  r.beta_fast = j.at("beta_fast").get<double>();
  r.beta_slow = j.at("beta_slow").get<double>();
  return r;
}

int64_t n_entries(const ref::v4::Config& c, LayerType t) {
  return t == LayerType::csa ? c.n_tokens / c.csa_ratio : t == LayerType::hca ? c.n_tokens / c.hca_ratio : 0;
}

std::string kind_of(const ref::v4::Schedule& s, size_t l) {
  return s.types[l] != LayerType::csa ? "none" : s.full(l) ? "full" : "shared";
}

json conventions(const V4Spec& s) {
  return {
      {"window_padding", "attn.indices slot i of row t is t - W + 1 + i, -1 where negative (the first W slots of every row)"},
      {"kv_full", "attn.kv = [the T token rows ; bf16(compressor.entries)] [T + n_c, 1, D]: compressed entry j is row T + j"},
      {"compressed_indices", "C4A: T + block for each of the row's indexer.blocks (-1 kept); HCA: T + j for every "
                             "j < floor((t + 1) / hca_ratio), -1 past it"},
      {"block_rule", "block s is causal at row t iff s < floor((t + 1) / csa_ratio) (indexer.scores -inf otherwise)"},
      {"softmax", "one softmax over the window and the compressed entries together with the per-head sink "
                  "(denominator exp(sink) + sum exp(s_i)); K = V = all D columns; sm_scale = f32(D^-0.5)"},
      {"lse", "natural log, without the sink; empty row: out 0, lse +inf, max_logits -inf"},
      {"attn_out", "attn.out: the sparse attention kernel's output before the inverse RoPE; attn.out_rotated: "
                   "after it (-sin, at the query position, trailing rope_dim channels, f32)"},
      {"tie_rule", "indexer.blocks: score descending, then block ascending; -1 past the row's causal blocks"},
      {"shared_blocks", "a Shared C4A layer runs no indexer: its indexer.blocks are its source layer's"},
      {"freq_rule", s.freq > 0 ? ref::v4::freq_rule_name(s.rule) : std::string("pattern")},
      {"compressor", "ref/v4/compressor.h, rounding f32 (Megatron): f32 softmax weights, pooled in double, RMSNorm, RoPE"},
      {"rotation", ref::v4::rotation_name(s.cfg.rotation)},
  };
}

}  // namespace

V4LayerResult compute_v4_layer(const ref::v4::Config& cfg, const ref::v4::Schedule& sch, size_t l, const ref::v4::LayerInputs& in,
                               std::vector<Tensor<int32_t>>& blocks, const ref::Kernels& kern, bool keep_unrotated) {
  const LayerType t = sch.types[l];
  const bool own = t == LayerType::csa && sch.full(l);
  const int64_t T = cfg.n_tokens, D = cfg.head_dim;
  V4LayerResult r;
  if (t != LayerType::sliding)
    r.entries = kern.v4_compress(in.comp_kv, in.comp_gate, in.comp_bias, in.comp_norm, ref::v4::compressor_params(cfg, t));
  const int64_t n_c = r.entries.numel() ? r.entries.dim(0) : 0;
  if (own) {
    r.index_entries = kern.v4_compress(in.index_kv, in.index_gate, in.index_bias, in.index_norm, ref::v4::indexer_compressor_params(cfg));
    r.scores = ref::v4::index_scores(in.index_q, r.index_entries, in.index_weights, cfg.csa_ratio, cfg.rotation, kern);
    blocks[l] = ref::v4::select_blocks(r.scores, cfg.csa_ratio, cfg.index_topk, kern);
  } else if (t == LayerType::csa) {
    blocks[l] = blocks[size_t(sch.source[l])];
  }
  r.indices = ref::v4::attention_indices(cfg, t, n_c, t == LayerType::csa ? &blocks[l] : nullptr);
  r.kv_full = Tensor<bf16_t>({T + n_c, 1, D});
  std::copy(in.kv.data.begin(), in.kv.data.end(), r.kv_full.data.begin());
  for (int64_t i = 0; i < n_c * D; ++i) r.kv_full[T * D + i] = f32_to_bf16(r.entries[i]);
  r.attn = kern.sparse_attention(in.q, r.kv_full, r.indices, cfg.sm_scale(), D, nullptr, &in.sink);
  if (!keep_unrotated) {  // attn.out becomes attn.out_rotated in place; its bf16 copy goes
    r.rotated = std::move(r.attn.out);
    r.attn.out = {};
    r.attn.out_bf16 = {};
    rotate_v4_rows(cfg, t, r.rotated.ptr(), 0, T, r.rotated.ptr(), true);
  }
  return r;
}

// Rows are independent: the same bits on any thread count. Each row's angles are computed once,
// for all its heads.
void rotate_v4_rows(const ref::v4::Config& cfg, LayerType type, const float* out, int64_t first, int64_t n, float* dst, bool parallel) {
  const int64_t H = cfg.n_heads, D = cfg.head_dim;
  const ref::v4::RopeParams& rope = type == LayerType::sliding ? cfg.main_rope : cfg.compress_rope;
  const std::vector<float> freq = ref::v4::inv_freq(rope);
  const int rd = rope.rope_dim;
#pragma omp parallel for schedule(static) if (parallel && n >= 64)
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> c(freq.size()), s(freq.size());
    ref::v4::rope_cos_sin(first + i, freq, c.data(), s.data());
    float* row = dst + i * H * D;
    if (out + (first + i) * H * D != row) std::copy_n(out + (first + i) * H * D, H * D, row);
    for (int64_t h = 0; h < H; ++h) ref::v4::apply_rope_inverse(row + h * D + D - rd, rd, c.data(), s.data());
  }
}

std::string v4_replay(const V4Spec& s, Impl impl) {
  return "indexshare golden --kind v4 --problem \"" + to_string(s) + "\"" + (impl == Impl::ref ? "" : " --impl " + impl_name(impl));
}

json emit_v4(const V4Spec& s, const std::string& replay, Impl impl, std::vector<ref::v4::LayerInputs>* given, const PutTensor& put) {
  const ref::v4::Config& cfg = s.cfg;
  const ref::v4::Schedule sch = s.schedule();
  const ref::Kernels kern = kernels_for(impl);
  const int64_t T = cfg.n_tokens, D = cfg.head_dim, H = cfg.n_heads;
  const TensorSink g{put};
  std::vector<Tensor<int32_t>> blocks(sch.types.size());
  json layers = json::array();
  for (size_t l = 0; l < sch.types.size(); ++l) {
    const LayerType t = sch.types[l];
    const bool own = t == LayerType::csa && sch.full(l);
    const std::string pre = "layers." + std::to_string(l) + ".";
    ref::v4::LayerInputs in = given ? std::move(given->at(l)) : ref::v4::make_layer_inputs(cfg, int(l), t, own, kern);
    V4LayerResult r = compute_v4_layer(cfg, sch, l, in, blocks, kern, true);
    const int64_t n_c = r.entries.numel() ? r.entries.dim(0) : 0;
    g.add(pre + "attn.q", std::move(in.q), Role::input);
    g.add(pre + "attn.kv", std::move(r.kv_full), Role::input);
    g.add(pre + "attn.sink", std::move(in.sink), Role::input);
    if (t != LayerType::sliding) {
      g.add(pre + "compressor.kv", std::move(in.comp_kv), Role::input);
      g.add(pre + "compressor.gate", std::move(in.comp_gate), Role::input);
      g.add(pre + "compressor.position_bias", std::move(in.comp_bias), Role::input);
      g.add(pre + "compressor.norm_weight", std::move(in.comp_norm), Role::input);
    }
    if (own) {
      g.add(pre + "indexer.kv", std::move(in.index_kv), Role::input);
      g.add(pre + "indexer.gate", std::move(in.index_gate), Role::input);
      g.add(pre + "indexer.position_bias", std::move(in.index_bias), Role::input);
      g.add(pre + "indexer.norm_weight", std::move(in.index_norm), Role::input);
      g.add(pre + "indexer.q", std::move(in.index_q), Role::input);
      g.add(pre + "indexer.weights", std::move(in.index_weights), Role::input);
    }
    g.add(pre + "attn.indices", std::move(r.indices), Role::input);
    if (t != LayerType::sliding) g.add(pre + "compressor.entries", std::move(r.entries), Role::output);
    if (own) {
      g.add(pre + "indexer.entries", std::move(r.index_entries), Role::output);
      g.add(pre + "indexer.scores", std::move(r.scores), Role::output);
    }
    if (t == LayerType::csa) g.add(pre + "indexer.blocks", Tensor<int32_t>(blocks[l]), Role::output);
    // attn.out_rotated is made from attn.out where it is consumed (a writer makes it a chunk of rows
    // at a time), never held beside it: the view keeps attn.out's bytes alive until then.
    io::TensorView out = io::make_view(pre + "attn.out", std::move(r.attn.out));
    const io::TensorBytes out_bytes = out.bytes;
    put(Handed{std::move(out), Role::output, nullptr});
    g.add(pre + "attn.out_bf16", std::move(r.attn.out_bf16), Role::output);
    put(Handed{io::TensorView{pre + "attn.out_rotated", io::DType::F32, {T, H, D}, {}}, Role::output,
               [&cfg, t, out_bytes](int64_t first, int64_t n, uint8_t* dst) {
                 // on the consumer's thread (a writer's), beside the layers computing on OpenMP's
                 rotate_v4_rows(cfg, t, reinterpret_cast<const float*>(out_bytes.data()), first, n, reinterpret_cast<float*>(dst), false);
               }});
    g.add(pre + "attn.lse", std::move(r.attn.lse), Role::output);
    g.add(pre + "attn.max_logits", std::move(r.attn.max_logits), Role::output);
    layers.push_back({{"index", l}, {"type", std::string(1, ref::v4::layer_type_char(t))}, {"type_name", ref::v4::layer_type_name(t)},
                      {"kind", kind_of(sch, l)}, {"source", sch.source[l]}, {"n_c", n_c}});
  }
  json sched = {{"types", s.types}, {"pattern", sch.pattern()}, {"indexers", sch.indexers()}};
  if (s.freq > 0) sched["freq"] = s.freq, sched["freq_rule"] = ref::v4::freq_rule_name(s.rule);
  else sched["csa_pattern"] = csa_pattern(sch);
  json manifest = manifest_head("v4", to_string(s), replay, impl);
  manifest.update(json{
      {"config",
       {{"n_tokens", T}, {"n_heads", H}, {"head_dim", D}, {"window", cfg.window}, {"csa_ratio", cfg.csa_ratio},
        {"hca_ratio", cfg.hca_ratio}, {"index_n_heads", cfg.index_n_heads}, {"index_head_dim", cfg.index_head_dim},
        {"index_topk", cfg.index_topk}, {"eps", cfg.eps}, {"sm_scale", cfg.sm_scale()}, {"n_layers", sch.types.size()},
        {"rotation", ref::v4::rotation_name(cfg.rotation)}, {"seed", cfg.seed}, {"main_rope", rope_json(cfg.main_rope)},
        {"compress_rope", rope_json(cfg.compress_rope)}}},
      {"layers", layers},
      {"schedule", sched},
      {"conventions", conventions(s)},
      {"budgets", json::object()},
  });
  return manifest;
}

GoldenSet build_v4(const V4Spec& s, const std::string& replay, Impl impl, std::vector<ref::v4::LayerInputs>* given) {
  s.cfg.validate();
  GoldenSet g;
  g.manifest = emit_v4(s, replay, impl, given, collect(g));
  return g;
}

V4Layout v4_layout(const json& m) {
  V4Layout v;
  const json& c = m.at("config");
  ref::v4::Config& k = v.cfg;
  k.n_tokens = c.at("n_tokens").get<int64_t>();
  k.n_heads = c.at("n_heads").get<int64_t>();
  k.head_dim = c.at("head_dim").get<int64_t>();
  k.window = c.at("window").get<int64_t>();
  k.csa_ratio = c.at("csa_ratio").get<int64_t>();
  k.hca_ratio = c.at("hca_ratio").get<int64_t>();
  k.index_n_heads = c.at("index_n_heads").get<int64_t>();
  k.index_head_dim = c.at("index_head_dim").get<int64_t>();
  k.index_topk = c.at("index_topk").get<int64_t>();
  k.eps = c.at("eps").get<float>();
  k.rotation = ref::v4::parse_rotation(c.at("rotation").get<std::string>());
  k.seed = c.at("seed").get<uint64_t>();
  k.main_rope = rope_of(c.at("main_rope"));
  k.compress_rope = rope_of(c.at("compress_rope"));
  const json& L = m.at("layers");
  v.schedule.types.clear();
  for (const json& e : L) {
    const LayerType t = ref::v4::parse_layer_type(e.at("type").get<std::string>());
    v.schedule.types.push_back(t);
    v.schedule.source.push_back(e.at("source").get<int>());
    v.n_c.push_back(n_entries(k, t));
  }
  return v;
}


// ---- reading: the manifest and tensor checks of kind v4 ------------------------------------------

namespace {

// When a layer holds a tensor: every layer, layers with a compressor (C4A, HCA), Full C4A layers,
// C4A layers (Full or Shared). v4_rules lists a layer's tensors in the order emit_v4 writes them
// (v4_plan: the streamed writer's plan).
enum class V4Need { always, compressed, full, csa };
struct V4Rule {
  const char* name;
  Role role;
  io::DType dtype;
  V4Need need;
};
const std::vector<V4Rule>& v4_rules() {
  using io::DType;
  static const std::vector<V4Rule> r = {
      {"attn.q", Role::input, DType::BF16, V4Need::always},
      {"attn.kv", Role::input, DType::BF16, V4Need::always},
      {"attn.sink", Role::input, DType::F32, V4Need::always},
      {"compressor.kv", Role::input, DType::F32, V4Need::compressed},
      {"compressor.gate", Role::input, DType::F32, V4Need::compressed},
      {"compressor.position_bias", Role::input, DType::F32, V4Need::compressed},
      {"compressor.norm_weight", Role::input, DType::F32, V4Need::compressed},
      {"indexer.kv", Role::input, DType::F32, V4Need::full},
      {"indexer.gate", Role::input, DType::F32, V4Need::full},
      {"indexer.position_bias", Role::input, DType::F32, V4Need::full},
      {"indexer.norm_weight", Role::input, DType::F32, V4Need::full},
      {"indexer.q", Role::input, DType::F32, V4Need::full},
      {"indexer.weights", Role::input, DType::F32, V4Need::full},
      {"attn.indices", Role::input, DType::I32, V4Need::always},
      {"compressor.entries", Role::output, DType::F32, V4Need::compressed},
      {"indexer.entries", Role::output, DType::F32, V4Need::full},
      {"indexer.scores", Role::output, DType::F32, V4Need::full},
      {"indexer.blocks", Role::output, DType::I32, V4Need::csa},
      {"attn.out", Role::output, DType::F32, V4Need::always},
      {"attn.out_bf16", Role::output, DType::BF16, V4Need::always},
      {"attn.out_rotated", Role::output, DType::F32, V4Need::always},
      {"attn.lse", Role::output, DType::F32, V4Need::always},
      {"attn.max_logits", Role::output, DType::F32, V4Need::always},
  };
  return r;
}

// The shape of `rest` on a layer of type t with n_c entries.
Shape v4_shape(const std::string& rest, const ref::v4::Config& c, LayerType t, int64_t n_c) {
  (void)n_c;
  return v4_tensor_shape(rest, c, t);
}
}  // namespace

Shape v4_tensor_shape(const std::string& rest, const ref::v4::Config& c, LayerType t) {
  const int64_t n_c = n_entries(c, t);
  const int64_t T = c.n_tokens, D = c.head_dim, H = c.n_heads, DI = c.index_head_dim, HI = c.index_n_heads;
  const int64_t n_b = T / c.csa_ratio, k = std::min(c.index_topk, n_b);
  const int64_t width = t == LayerType::csa ? k : t == LayerType::hca ? n_c : 0;
  const int64_t cw = t == LayerType::csa ? 2 * D : D, m = t == LayerType::csa ? c.csa_ratio : c.hca_ratio;
  if (rest == "attn.q" || rest == "attn.out" || rest == "attn.out_bf16" || rest == "attn.out_rotated") return {T, H, D};
  if (rest == "attn.kv") return {T + n_c, 1, D};
  if (rest == "attn.sink") return {H};
  if (rest == "attn.indices") return {T, 1, c.window + width};
  if (rest == "attn.lse" || rest == "attn.max_logits") return {T, H};
  if (rest == "compressor.kv" || rest == "compressor.gate") return {T, cw};
  if (rest == "compressor.position_bias") return {m, cw};
  if (rest == "compressor.norm_weight") return {D};
  if (rest == "compressor.entries") return {n_c, D};
  if (rest == "indexer.kv" || rest == "indexer.gate") return {T, 2 * DI};
  if (rest == "indexer.position_bias") return {c.csa_ratio, 2 * DI};
  if (rest == "indexer.norm_weight") return {DI};
  if (rest == "indexer.q") return {T, HI, DI};
  if (rest == "indexer.weights") return {T, HI};
  if (rest == "indexer.entries") return {n_b, DI};
  if (rest == "indexer.scores") return {T, n_b};
  return {T, k};  // indexer.blocks
}

namespace {

bool needed(V4Need n, LayerType t, bool full) {
  switch (n) {
    case V4Need::always: return true;
    case V4Need::compressed: return t != LayerType::sliding;
    case V4Need::full: return t == LayerType::csa && full;
    case V4Need::csa: return t == LayerType::csa;
  }
  return false;
}

class V4Check : KindCheck {
 public:
  using KindCheck::KindCheck;
  void run() {
    config();
    layers();
    schedule();
    conventions();
    tensors();
  }

 private:
  void config();
  void rope(const json& c, const std::string& f);
  void layers();
  void schedule();
  void conventions();
  void tensors();

  ref::v4::Config cfg_;
  std::vector<LayerType> types_;
  std::vector<int> source_;
};

void V4Check::rope(const json& c, const std::string& f) {
  if (!c.contains(f) || !c[f].is_object()) fail("config." + f, "is missing or not an object");
  const json& r = c[f];
  for (const char* n : {"theta", "factor", "beta_fast", "beta_slow"})
    if (!r.contains(n) || !r[n].is_number() || !std::isfinite(r[n].get<double>()) || r[n].get<double>() <= 0)
      fail("config." + f + "." + n, "is missing or not a finite number > 0");
  if (!r.contains("yarn") || !r["yarn"].is_boolean()) fail("config." + f + ".yarn", "is missing or not a boolean");
  for (const char* n : {"rope_dim", "original_max_pos"})
    if (!r.contains(n) || !r[n].is_number_integer() || r[n].get<int64_t>() < 1 || r[n].get<int64_t>() > (int64_t(1) << 30))
      fail("config." + f + "." + n, "is missing or not an integer >= 1");
  const int64_t rd = r["rope_dim"].get<int64_t>();
  if (rd % 2 || rd > cfg_.head_dim || rd > cfg_.index_head_dim)
    fail("config." + f + ".rope_dim", "must be even and <= head_dim and index_head_dim, got " + std::to_string(rd));
}

void V4Check::config() {
  if (!m_.contains("config") || !m_["config"].is_object()) fail("config", "is missing or not an object");
  const json& c = m_["config"];
  const int64_t kMax = (int64_t(1) << 31) - 1;
  cfg_.n_tokens = int_field(c, "n_tokens", 1, kMax);
  cfg_.n_heads = int_field(c, "n_heads", 1, 1 << 16);
  cfg_.head_dim = int_field(c, "head_dim", 1, 1 << 16);
  cfg_.window = int_field(c, "window", 1, kMax);
  cfg_.csa_ratio = int_field(c, "csa_ratio", 1, kMax);
  cfg_.hca_ratio = int_field(c, "hca_ratio", 1, kMax);
  cfg_.index_n_heads = int_field(c, "index_n_heads", 1, 1 << 16);
  cfg_.index_head_dim = int_field(c, "index_head_dim", 1, 1 << 16);
  cfg_.index_topk = int_field(c, "index_topk", 1, kMax);
  (void)int_field(c, "n_layers", 1, 1000000);
  (void)int_field(c, "seed", 0, INT64_MAX);
  for (const char* f : {"eps", "sm_scale"})
    if (!c.contains(f) || !c[f].is_number() || !std::isfinite(c[f].get<double>()) || c[f].get<double>() <= 0)
      fail(std::string("config.") + f, "is missing or not a finite number > 0");
  if (c["sm_scale"].get<float>() != float(1.0 / std::sqrt(double(cfg_.head_dim))))
    fail("config.sm_scale", "is " + c["sm_scale"].dump() + ", not f32(head_dim^-0.5)");
  if (!c.contains("rotation") || !c["rotation"].is_string() || (c["rotation"] != "hf" && c["rotation"] != "megatron"))
    fail("config.rotation", "is missing or not \"hf\" / \"megatron\"");
  rope(c, "main_rope");
  rope(c, "compress_rope");
}

void V4Check::layers() {
  if (!m_.contains("layers") || !m_["layers"].is_array() || m_["layers"].empty()) fail("layers", "is missing, empty or not an array");
  const json& L = m_["layers"];
  if (int64_t(L.size()) != m_["config"]["n_layers"].get<int64_t>())
    fail("config.n_layers", "is " + m_["config"]["n_layers"].dump() + ", but field 'layers' lists " + std::to_string(L.size()));
  for (size_t l = 0; l < L.size(); ++l) {
    const std::string f = "layers[" + std::to_string(l) + "]";
    const json& e = L[l];
    if (!e.is_object() || !e.contains("index") || e["index"] != l) fail(f + ".index", "is missing or not its position " + std::to_string(l));
    if (!e.contains("type") || !e["type"].is_string() || (e["type"] != "S" && e["type"] != "C" && e["type"] != "H"))
      fail(f + ".type", "is missing or not \"S\", \"C\" or \"H\"");
    const LayerType t = ref::v4::parse_layer_type(e["type"].get<std::string>());
    if (!e.contains("source") || !e["source"].is_number_integer()) fail(f + ".source", "is missing or not an integer");
    const int64_t src = e["source"].get<int64_t>();
    const std::string want_kind = t != LayerType::csa ? "none" : src == int64_t(l) ? "full" : "shared";
    if (!e.contains("kind") || e["kind"] != want_kind)
      fail(f + ".kind", "is " + (e.contains("kind") ? e["kind"].dump() : std::string("missing")) + ", expected \"" + want_kind +
                            "\" (type " + e["type"].get<std::string>() + ", source " + std::to_string(src) + ")");
    if (t != LayerType::csa && src != -1) fail(f + ".source", "must be -1 on a layer without an indexer, got " + std::to_string(src));
    if (t == LayerType::csa && (src < 0 || src > int64_t(l) || L[size_t(src)]["type"] != "C" || L[size_t(src)]["source"] != src))
      fail(f + ".source", "is " + std::to_string(src) + ", not this layer or an earlier Full C4A layer");
    const int64_t want_nc = n_entries(cfg_, t);
    if (!e.contains("n_c") || e["n_c"] != want_nc) fail(f + ".n_c", "is not floor(n_tokens / ratio) = " + std::to_string(want_nc));
    types_.push_back(t);
    source_.push_back(int(src));
  }
}

void V4Check::schedule() {
  if (!m_.contains("schedule") || !m_["schedule"].is_object()) fail("schedule", "is missing or not an object");
  const json& s = m_["schedule"];
  if (!s.contains("types") || s["types"] != ref::v4::format_layer_types(types_))
    fail("schedule.types", "is not the layers' types " + ref::v4::format_layer_types(types_));
  ref::v4::Schedule sch;
  sch.types = types_;
  sch.source = source_;
  if (!s.contains("pattern") || s["pattern"] != sch.pattern()) fail("schedule.pattern", "is not the layers' pattern " + sch.pattern());
  if (s.contains("freq")) {
    if (!s["freq"].is_number_integer() || s["freq"].get<int64_t>() < 1 || s["freq"].get<int64_t>() > 1000000)
      fail("schedule.freq", "is not an integer >= 1");
    if (!s.contains("freq_rule") || !s["freq_rule"].is_string()) fail("schedule.freq_rule", "is missing or not a string");
    ref::v4::FreqRule r;
    try {
      r = ref::v4::parse_freq_rule(s["freq_rule"].get<std::string>());
    } catch (const Error&) {
      fail("schedule.freq_rule", "is " + s["freq_rule"].dump() + ", not \"j%f==0\" or \"max(j-1,0)%f\"");
    }
    if (ref::v4::from_freq(types_, s["freq"].get<int>(), r).source != source_)
      fail("schedule.freq", "and freq_rule do not give the layers' sources");
  }
}

void V4Check::conventions() {
  if (!m_.contains("conventions") || !m_["conventions"].is_object()) fail("conventions", "is missing or not an object");
  for (const char* f : {"window_padding", "kv_full", "softmax", "lse", "attn_out", "freq_rule", "shared_blocks"})
    if (!m_["conventions"].contains(f) || !m_["conventions"][f].is_string())
      fail(std::string("conventions.") + f, "is missing or not a string");
}

void V4Check::tensors() {
  for (size_t l = 0; l < types_.size(); ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    const int64_t n_c = n_entries(cfg_, types_[l]);
    for (const V4Rule& r : v4_rules())
      if (needed(r.need, types_[l], source_[l] == int(l)))
        expect_tensor(pre + r.name, r.dtype, v4_shape(r.name, cfg_, types_[l], n_c), r.role, ref::v4::layer_type_name(types_[l]));
  }
  no_other_tensors("a v4 set of this config");
}

}  // namespace

void check_v4_manifest(const Loaded& g, const std::string& mpath) { V4Check(g, mpath).run(); }

std::vector<SetWriter::Planned> v4_plan(const V4Spec& s) {
  const ref::v4::Schedule sch = s.schedule();
  std::vector<SetWriter::Planned> plan;
  for (size_t l = 0; l < sch.types.size(); ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    for (const V4Rule& r : v4_rules())
      if (needed(r.need, sch.types[l], sch.full(l)))
        plan.push_back({{pre + r.name, r.dtype, v4_tensor_shape(r.name, s.cfg, sch.types[l])}, r.role});
  }
  return plan;
}

json write_v4(const std::string& dir, bool force, const V4Spec& s, const std::string& replay, Impl impl,
              std::vector<ref::v4::LayerInputs>* given, const std::string& inputs_note) {
  s.cfg.validate();
  return write_streamed(dir, force, v4_plan(s), [&](const PutTensor& put) { return emit_v4(s, replay, impl, given, put); }, inputs_note);
}

}  // namespace indexshare::golden
