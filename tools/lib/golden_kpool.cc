// golden sets: GLM-5.3 KPool-DSA (kind "kpool", tools/lib/golden_kpool.h).
#include "tools/lib/golden_kpool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "ref/error.h"
#include "tools/lib/golden/internal.h"

namespace indexshare::golden {

using nlohmann::json;
using detail::KindCheck;
using detail::manifest_head;
using ref::kpool::KpoolConfig;

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& what) { throw Error("kpool spec field '" + key + "': " + what); }

int64_t count_of(const std::map<std::string, std::string>& kv, const std::string& key, int64_t lo, int64_t fallback) {
  const auto it = kv.find(key);
  if (it == kv.end()) return fallback;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 10 || v.find_first_not_of("0123456789") != std::string::npos)
    bad(key, "'" + v + "' is not a non-negative integer");
  const int64_t x = std::stoll(v);
  if (x < lo) bad(key, "must be >= " + std::to_string(lo) + ", got " + v);
  if (x > (int64_t(1) << 31) - 1) bad(key, "must be < 2^31, got " + v);
  return x;
}

const char* kKeys[] = {"sq", "skv", "h", "d", "pool", "k", "tail", "rounding", "hq", "dqk", "dv", "nl", "dsa", "sched", "fp8", "seed"};

}  // namespace

std::vector<bool> KpoolSpec::dsa() const {
  return all_dsa ? std::vector<bool>(size_t(n_layers), true) : ref::kpool::glm53_dsa_layers(n_layers);
}

std::vector<int> KpoolSpec::dsa_layers() const {
  std::vector<int> out;
  const std::vector<bool> d = dsa();
  for (size_t i = 0; i < d.size(); ++i)
    if (d[i]) out.push_back(int(i));
  return out;
}

KpoolSpec parse_kpool_spec(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream is(text);
  for (std::string tok; is >> tok;) {
    const size_t eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) throw Error("kpool spec: '" + tok + "' is not key=value");
    const std::string key = tok.substr(0, eq);
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      bad(key, "unknown key (sq skv h d pool k tail rounding hq dqk dv nl dsa sched fp8 seed)");
    if (!kv.emplace(key, tok.substr(eq + 1)).second) bad(key, "given twice");
  }
  for (const char* req : {"sq", "skv", "h", "d", "pool", "k", "nl"})
    if (!kv.count(req)) bad(req, "is missing");
  KpoolSpec s;
  KpoolConfig& c = s.cfg;
  c.s_kv = count_of(kv, "skv", 1, 0);
  c.s_q = count_of(kv, "sq", 1, 0);
  if (c.s_q > c.s_kv) bad("sq", "must be <= skv = " + std::to_string(c.s_kv) + ", got " + kv["sq"]);
  c.heads = count_of(kv, "h", 1, 0);
  c.dim = count_of(kv, "d", 1, 0);
  c.pool = count_of(kv, "pool", 1, 0);
  c.index_topk = count_of(kv, "k", 1, 0);
  if (c.index_topk % c.pool) bad("k", "must be a multiple of pool = " + std::to_string(c.pool) + " (whole pools), got " + kv["k"]);
  const std::string tail = kv.count("tail") ? kv["tail"] : "yes";
  if (tail != "yes" && tail != "no") bad("tail", "must be yes or no, got '" + tail + "'");
  c.tail = tail == "yes";
  if (kv.count("rounding")) {
    if (kv["rounding"] != "f32" && kv["rounding"] != "hf-bf16")
      bad("rounding", "must be f32 (the specification) or hf-bf16 (transformers' bf16 rounding points), got '" + kv["rounding"] + "'");
    c.rounding = ref::kpool::parse_rounding(kv["rounding"]);
  }
  c.h_q = count_of(kv, "hq", 1, 2);
  c.d_qk = count_of(kv, "dqk", 1, 512);
  c.d_v = count_of(kv, "dv", 1, 512);
  if (c.d_v > c.d_qk) bad("dv", "must be <= dqk = " + std::to_string(c.d_qk) + ", got " + std::to_string(c.d_v));
  c.seed = uint64_t(count_of(kv, "seed", 0, 1));
  s.n_layers = int(count_of(kv, "nl", 1, 0));
  if (kv.count("dsa") && kv["dsa"] != "glm53" && kv["dsa"] != "all")
    bad("dsa", "must be glm53 (layer i is DSA iff i % 4 == 3) or all, got '" + kv["dsa"] + "'");
  s.all_dsa = kv.count("dsa") && kv["dsa"] == "all";
  const std::vector<int> layers = s.dsa_layers();
  if (layers.empty()) bad("nl", "nl=" + kv["nl"] + " with dsa=glm53 holds no DSA layer (the first is layer 3): give nl >= 4");
  s.pattern = kv.count("sched") ? kv["sched"] : std::string(layers.size(), 'F');
  if (s.pattern.size() != layers.size())
    bad("sched", "'" + s.pattern + "' has " + std::to_string(s.pattern.size()) + " entries for the " +
                     std::to_string(layers.size()) + " DSA layers (one F or S per DSA layer)");
  for (size_t i = 0; i < s.pattern.size(); ++i)
    if (s.pattern[i] != 'F' && s.pattern[i] != 'S') bad("sched", "character '" + s.pattern.substr(i, 1) + "' is not F or S");
  if (s.pattern[0] != 'F')
    bad("sched", "the first DSA layer (model layer " + std::to_string(layers[0]) +
                     ") is Shared: a Shared layer needs a Full DSA layer before it");
  s.fp8 = kv.count("fp8") ? kv["fp8"] : "none";
  if (s.fp8 != "none" && s.fp8 != "amax" && s.fp8 != "pow2")
    bad("fp8", "must be none, amax or pow2 (SGLang's scale rules), got '" + s.fp8 + "'");
  if (s.fp8 != "none" && (c.dim & (c.dim - 1)))
    bad("fp8", "SGLang's FP8 pages rotate the pooled keys by a Hadamard transform: d must be a power of two, got " + kv["d"]);
  if (s.fp8 != "none" && kKpoolFp8Page % c.pool != 0)
    bad("pool", "SGLang's pooled-key pages sit in its token pages of " + std::to_string(kKpoolFp8Page) +
                    " (pooled entry p in token page (p / 64) P): the pool size must divide the page, got pool=" + kv["pool"]);
  c.validate();
  return s;
}

Tensor<uint8_t> kpool_fp8_pages(const Tensor<e4m3_t>& codes, const Tensor<float>& scale) {
  const int64_t n = codes.dim(0), D = codes.dim(1), page = kKpoolFp8Page * (D + 4);
  require(scale.numel() == n, "kpool fp8 pages: " + std::to_string(scale.numel()) + " scales for " + std::to_string(n) + " keys");
  Tensor<uint8_t> out({(n + kKpoolFp8Page - 1) / kKpoolFp8Page, page}, 0);
  for (int64_t p = 0; p < n; ++p) {
    uint8_t* base = &out[(p / kKpoolFp8Page) * page];
    const int64_t slot = p % kKpoolFp8Page;
    for (int64_t d = 0; d < D; ++d) base[slot * D + d] = codes.at(p, d).bits;
    std::memcpy(base + kKpoolFp8Page * D + 4 * slot, &scale[p], 4);  // little-endian hosts
  }
  return out;
}

void kpool_fp8_unpage(const Tensor<uint8_t>& pages, int64_t n, int64_t D, Tensor<e4m3_t>& codes, Tensor<float>& scale) {
  const int64_t page = kKpoolFp8Page * (D + 4);
  require(pages.rank() == 2 && pages.dim(1) == page && pages.dim(0) == (n + kKpoolFp8Page - 1) / kKpoolFp8Page,
          "kpool fp8 pages: expected [" + std::to_string((n + kKpoolFp8Page - 1) / kKpoolFp8Page) + ", " + std::to_string(page) +
              "] for " + std::to_string(n) + " pooled keys of " + std::to_string(D) + " dims, got " + shape_str(pages.shape));
  codes = Tensor<e4m3_t>({n, D});
  scale = Tensor<float>({n});
  for (int64_t p = 0; p < n; ++p) {
    const uint8_t* base = &pages[(p / kKpoolFp8Page) * page];
    const int64_t slot = p % kKpoolFp8Page;
    for (int64_t d = 0; d < D; ++d) codes.at(p, d).bits = base[slot * D + d];
    std::memcpy(&scale[p], base + kKpoolFp8Page * D + 4 * slot, 4);
  }
}

std::string to_string(const KpoolSpec& s) {
  const KpoolConfig& c = s.cfg;
  std::ostringstream os;
  os << "sq=" << c.s_q << " skv=" << c.s_kv << " h=" << c.heads << " d=" << c.dim << " pool=" << c.pool << " k=" << c.index_topk
     << " tail=" << (c.tail ? "yes" : "no") << " rounding=" << ref::kpool::rounding_name(c.rounding) << " hq=" << c.h_q
     << " dqk=" << c.d_qk << " dv=" << c.d_v << " nl=" << s.n_layers << " dsa=" << (s.all_dsa ? "all" : "glm53")
     << " sched=" << s.pattern << (s.fp8 == "none" ? "" : " fp8=" + s.fp8) << " seed=" << c.seed;
  return os.str();
}

std::string kpool_replay(const KpoolSpec& s, Impl impl) {
  return "indexshare golden --kind kpool --problem \"" + to_string(s) + "\"" + (impl == Impl::ref ? "" : " --impl " + impl_name(impl));
}

namespace {

json conventions(const KpoolConfig& c) {
  return {
      {"pools", "pool p covers tokens pP .. pP + P - 1 and exists only when complete: n = floor(s_kv / P)"},
      {"pool_keys", "Kbar[p, d] = sum_j softmax_j(z[p, :, d]) k[pP + j, d], z = f32(gate + ape) (indexer.pool_logits); "
                    "rounding " + ref::kpool::rounding_name(c.rounding) + " (ref/kpool/pool.h)"},
      {"scores", "I[t, p] = sum_h w[t, h] ReLU(q[t, h] . Kbar[p]) D^-1/2 for p < ke[t] = floor((pos + 1) / P), pos = "
                 "s_kv - s_q + t; -inf otherwise"},
      {"tie_rule", "indexer.pools: score descending, then pool ascending; select_k = min(index_topk / P, n); -1 padded"},
      {"tail", c.tail ? "the query's incomplete pool, (pos + 1) mod P tokens ending at pos, ascending, -1 padded (P - 1 "
                        "columns); empty when (pos + 1) mod P = 0"
                      : "none (index_kpool_always_select_tail false)"},
      {"union", "indexer.indices = history | tail | -1, width index_topk + P - 1 (index_topk without the tail); judge "
                "it as a set: SGLang places the tail elsewhere"},
      {"shared", "a Shared DSA layer runs no indexer: attn.indices is the union list of the last Full DSA layer, tail "
                 "included; KDA layers neither make nor consume a list"},
      {"attention", "NoPE MLA: one latent kv head, K = the d_qk columns, V = the first d_v, sm_scale 256^-1/2; the -1 "
                    "slots ignored; lse natural log; empty row: out 0, lse +inf"},
      {"sglang_cache", "SGLang's serving cache: bf16(Kbar), Hadamard (Sylvester, times D^-1/2) in f32, bf16, e4m3 with one "
                       "f32 scale per pooled key, max(amax, 1e-4) / 448 (fp8=pow2: its power-of-two ceiling); "
                       "indexer.pool_keys_fp8 (with fp8=amax|pow2) holds it in pages of 64 pooled slots, [64 x D e4m3, "
                       "slot-major][64 f32 scales, little-endian], key p in page p / 64 slot p % 64, unused slots 0"},
  };
}

}  // namespace

json emit_kpool(const KpoolSpec& s, const std::string& replay, Impl impl, std::vector<ref::kpool::KpoolLayerInputs>* given,
                const PutTensor& put) {
  const KpoolConfig& c = s.cfg;
  c.validate();
  const ref::Kernels kern = kernels_for(impl);
  const std::vector<int> dsa = s.dsa_layers();
  require(!given || given->size() == dsa.size(), "build_kpool: " + std::to_string(given ? given->size() : 0) +
                                                    " given layers for " + std::to_string(dsa.size()) + " DSA layers");
  const TensorSink g{put};
  json layers = json::array();
  Tensor<int32_t> current;  // the union list of the last Full DSA layer
  int source = -1;
  int64_t select_k = 0;
  for (size_t i = 0; i < dsa.size(); ++i) {
    const int l = dsa[i];
    const bool full = s.pattern[i] == 'F';
    const std::string pre = "layers." + std::to_string(l) + ".";
    ref::kpool::KpoolLayerInputs in = given ? std::move((*given)[i]) : ref::kpool::make_kpool_layer_inputs(c, l, full, kern);
    if (full) {
      ref::kpool::KpoolIndexerOutputs o = ref::kpool::run_kpool_indexer(c, in, kern);
      Tensor<uint8_t> pages;  // SGLang's FP8 cache of the pooled keys
      if (s.fp8 != "none") {
        const ref::kpool::PooledFp8 f = ref::kpool::sglang_pooled_fp8(o.kbar, s.fp8 == "pow2");
        pages = kpool_fp8_pages(f.codes, f.scale);
      }
      current = o.sel.indices;
      source = l;
      select_k = o.sel.select_k;
      g.add(pre + "indexer.q", std::move(in.q), Role::input);
      g.add(pre + "indexer.k", std::move(in.k), Role::input);
      g.add(pre + "indexer.gate", std::move(in.g), Role::input);
      g.add(pre + "indexer.ape", std::move(in.ape), Role::input);
      g.add(pre + "indexer.weights", std::move(in.weights), Role::input);
      g.add(pre + "indexer.ke", std::move(o.ke), Role::reference);
      g.add(pre + "indexer.pool_logits", std::move(o.z), Role::output);
      g.add(pre + "indexer.pool_keys", std::move(o.kbar), Role::output);
      g.add(pre + "indexer.scores", std::move(o.scores), Role::output);
      g.add(pre + "indexer.pools", std::move(o.sel.pools), Role::output);
      g.add(pre + "indexer.history", std::move(o.sel.history), Role::output);
      if (c.tail) g.add(pre + "indexer.tail", std::move(o.sel.tail), Role::output);
      g.add(pre + "indexer.indices", std::move(o.sel.indices), Role::output);
      if (s.fp8 != "none") g.add(pre + "indexer.pool_keys_fp8", std::move(pages), Role::output);
    }
    ref::AttentionOut a = ref::kpool::kpool_attention(c, in, current, kern);
    Tensor<int32_t> idx = current;
    idx.shape = {c.s_q, 1, c.width()};
    g.add(pre + "attn.q", std::move(in.attn_q), Role::input);
    g.add(pre + "attn.kv", std::move(in.attn_kv), Role::input);
    g.add(pre + "attn.indices", std::move(idx), Role::input);
    g.add(pre + "attn.out", std::move(a.out), Role::output);
    g.add(pre + "attn.out_bf16", std::move(a.out_bf16), Role::output);
    g.add(pre + "attn.lse", std::move(a.lse), Role::output);
    g.add(pre + "attn.max_logits", std::move(a.max_logits), Role::output);
    layers.push_back({{"index", l}, {"dsa_rank", i}, {"kind", full ? "full" : "shared"}, {"source", source}});
  }
  json manifest = manifest_head("kpool", to_string(s), replay, impl);
  manifest.update(json{
      {"config",
       {{"s_q", c.s_q}, {"s_kv", c.s_kv}, {"heads", c.heads}, {"dim", c.dim}, {"pool", c.pool}, {"index_topk", c.index_topk},
        {"tail", c.tail}, {"rounding", ref::kpool::rounding_name(c.rounding)}, {"h_q", c.h_q}, {"d_qk", c.d_qk}, {"d_v", c.d_v},
        {"sm_scale", c.sm_scale}, {"seed", c.seed}, {"n_layers", s.n_layers}, {"dsa", s.all_dsa ? "all" : "glm53"},
        {"n_pools", c.n_pools()}, {"select_k", select_k}, {"width", c.width()}, {"fp8", s.fp8}}},
      {"layers", layers},
      {"schedule", {{"dsa_layers", dsa}, {"pattern", s.pattern}}},
      {"conventions", conventions(c)},
      {"budgets", json::object()},
  });
  return manifest;
}

GoldenSet build_kpool(const KpoolSpec& s, const std::string& replay, Impl impl, std::vector<ref::kpool::KpoolLayerInputs>* given) {
  GoldenSet g;
  g.manifest = emit_kpool(s, replay, impl, given, collect(g));
  return g;
}

const KpoolLayer* KpoolLayout::find(int layer) const {
  for (const KpoolLayer& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

KpoolLayout kpool_layout(const json& m) {
  KpoolLayout v;
  const json& j = m.at("config");
  KpoolConfig& c = v.cfg;
  c.s_q = j.at("s_q").get<int64_t>();
  c.s_kv = j.at("s_kv").get<int64_t>();
  c.heads = j.at("heads").get<int64_t>();
  c.dim = j.at("dim").get<int64_t>();
  c.pool = j.at("pool").get<int64_t>();
  c.index_topk = j.at("index_topk").get<int64_t>();
  c.tail = j.at("tail").get<bool>();
  c.rounding = ref::kpool::parse_rounding(j.at("rounding").get<std::string>());
  c.h_q = j.at("h_q").get<int64_t>();
  c.d_qk = j.at("d_qk").get<int64_t>();
  c.d_v = j.at("d_v").get<int64_t>();
  c.sm_scale = j.at("sm_scale").get<float>();
  c.seed = j.at("seed").get<uint64_t>();
  v.select_k = std::min(c.index_topk / c.pool, c.n_pools());
  v.fp8 = j.at("fp8").get<std::string>();
  for (const json& e : m.at("layers"))
    v.layers.push_back({e.at("index").get<int>(), e.at("kind") == "full", e.at("source").get<int>()});
  return v;
}

// ---- reading: the manifest and tensor checks of kind kpool ----------------------------------------

namespace {

// A DSA layer's tensors, in the order emit_kpool hands them over (kpool_plan: the streamed writer's plan).
struct KpoolRule {
  const char* name;
  Role role;
  io::DType dtype;
  bool full_only;
};
const KpoolRule kRules[] = {
    {"indexer.q", Role::input, io::DType::F32, true},           {"indexer.k", Role::input, io::DType::F32, true},
    {"indexer.gate", Role::input, io::DType::F32, true},        {"indexer.ape", Role::input, io::DType::F32, true},
    {"indexer.weights", Role::input, io::DType::F32, true},     {"indexer.ke", Role::reference, io::DType::I32, true},
    {"indexer.pool_logits", Role::output, io::DType::F32, true}, {"indexer.pool_keys", Role::output, io::DType::F32, true},
    {"indexer.scores", Role::output, io::DType::F32, true},     {"indexer.pools", Role::output, io::DType::I32, true},
    {"indexer.history", Role::output, io::DType::I32, true},    {"indexer.tail", Role::output, io::DType::I32, true},
    {"indexer.indices", Role::output, io::DType::I32, true},    {"indexer.pool_keys_fp8", Role::output, io::DType::U8, true},
    {"attn.q", Role::input, io::DType::BF16, false},
    {"attn.kv", Role::input, io::DType::BF16, false},           {"attn.indices", Role::input, io::DType::I32, false},
    {"attn.out", Role::output, io::DType::F32, false},          {"attn.out_bf16", Role::output, io::DType::BF16, false},
    {"attn.lse", Role::output, io::DType::F32, false},          {"attn.max_logits", Role::output, io::DType::F32, false},
};

Shape kpool_shape(const std::string& rest, const KpoolConfig& c, int64_t select_k) {
  const int64_t n = c.n_pools();
  if (rest == "indexer.q") return {c.s_q, c.heads, c.dim};
  if (rest == "indexer.k" || rest == "indexer.gate") return {c.s_kv, c.dim};
  if (rest == "indexer.ape") return {c.pool, c.dim};
  if (rest == "indexer.weights") return {c.s_q, c.heads};
  if (rest == "indexer.ke") return {c.s_q};
  if (rest == "indexer.pool_logits") return {n, c.pool, c.dim};
  if (rest == "indexer.pool_keys") return {n, c.dim};
  if (rest == "indexer.scores") return {c.s_q, n};
  if (rest == "indexer.pools") return {c.s_q, select_k};
  if (rest == "indexer.history") return {c.s_q, select_k * c.pool};
  if (rest == "indexer.tail") return {c.s_q, c.pool - 1};
  if (rest == "indexer.indices") return {c.s_q, c.width()};
  if (rest == "attn.q") return {c.s_q, c.h_q, c.d_qk};
  if (rest == "attn.kv") return {c.s_kv, 1, c.d_qk};
  if (rest == "attn.indices") return {c.s_q, 1, c.width()};
  if (rest == "attn.out" || rest == "attn.out_bf16") return {c.s_q, c.h_q, c.d_v};
  if (rest == "indexer.pool_keys_fp8") return {(n + kKpoolFp8Page - 1) / kKpoolFp8Page, kKpoolFp8Page * (c.dim + 4)};
  return {c.s_q, c.h_q};  // attn.lse, attn.max_logits
}

class KpoolCheck : KindCheck {
 public:
  using KindCheck::KindCheck;
  void run() {
    config();
    layers();
    tensors();
  }

 private:
  void config();
  void layers();
  void tensors();

  KpoolSpec spec_;
  int64_t select_k_ = 0;
};

void KpoolCheck::config() {
  if (!m_.contains("config") || !m_["config"].is_object()) fail("config", "is missing or not an object");
  const json& c = m_["config"];
  const int64_t kMax = (int64_t(1) << 31) - 1;
  KpoolConfig& k = spec_.cfg;
  k.s_q = int_field(c, "s_q", 1, kMax);
  k.s_kv = int_field(c, "s_kv", k.s_q, kMax);
  k.heads = int_field(c, "heads", 1, 1 << 16);
  k.dim = int_field(c, "dim", 1, 1 << 16);
  k.pool = int_field(c, "pool", 1, kMax);
  k.index_topk = int_field(c, "index_topk", k.pool, kMax);
  if (k.index_topk % k.pool) fail("config.index_topk", "is not a multiple of config.pool = " + std::to_string(k.pool));
  k.h_q = int_field(c, "h_q", 1, 1 << 16);
  k.d_qk = int_field(c, "d_qk", 1, 1 << 16);
  k.d_v = int_field(c, "d_v", 1, k.d_qk);
  (void)int_field(c, "seed", 0, INT64_MAX);
  spec_.n_layers = int(int_field(c, "n_layers", 1, 1000000));
  if (!c.contains("tail") || !c["tail"].is_boolean()) fail("config.tail", "is missing or not a boolean");
  k.tail = c["tail"].get<bool>();
  if (!c.contains("rounding") || (c["rounding"] != "f32" && c["rounding"] != "hf-bf16"))
    fail("config.rounding", "is missing or not \"f32\" / \"hf-bf16\"");
  if (!c.contains("dsa") || (c["dsa"] != "glm53" && c["dsa"] != "all")) fail("config.dsa", "is missing or not \"glm53\" / \"all\"");
  spec_.all_dsa = c["dsa"] == "all";
  if (!c.contains("fp8") || (c["fp8"] != "none" && c["fp8"] != "amax" && c["fp8"] != "pow2"))
    fail("config.fp8", "is missing or not \"none\" / \"amax\" / \"pow2\"");
  spec_.fp8 = c["fp8"].get<std::string>();
  if (spec_.fp8 != "none" && (k.dim & (k.dim - 1))) fail("config.fp8", "is " + spec_.fp8 + ", but config.dim is not a power of two");
  if (!c.contains("sm_scale") || !c["sm_scale"].is_number() || c["sm_scale"].get<float>() != k.sm_scale)
    fail("config.sm_scale", "is missing or not GLM-5.3's 256^-1/2 = 0.0625");
  select_k_ = std::min(k.index_topk / k.pool, k.n_pools());
  const std::pair<const char*, int64_t> derived[] = {{"n_pools", k.n_pools()}, {"select_k", select_k_}, {"width", k.width()}};
  for (const auto& [f, want] : derived)
    if (!c.contains(f) || c[f] != want) fail(std::string("config.") + f, "is not " + std::to_string(want) + " (from the config)");
  if (!m_.contains("conventions") || !m_["conventions"].is_object()) fail("conventions", "is missing or not an object");
  for (const char* f : {"pools", "pool_keys", "scores", "tie_rule", "tail", "union", "shared", "attention"})
    if (!m_["conventions"].contains(f) || !m_["conventions"][f].is_string()) fail(std::string("conventions.") + f, "is missing or not a string");
}

void KpoolCheck::layers() {
  const std::vector<int> dsa = spec_.dsa_layers();
  if (dsa.empty()) fail("config.n_layers", "gives no DSA layer");
  if (!m_.contains("layers") || !m_["layers"].is_array() || m_["layers"].size() != dsa.size())
    fail("layers", "is missing or does not list the " + std::to_string(dsa.size()) + " DSA layers");
  int source = -1;
  for (size_t i = 0; i < dsa.size(); ++i) {
    const std::string f = "layers[" + std::to_string(i) + "]";
    const json& e = m_["layers"][i];
    if (!e.is_object() || !e.contains("index") || e["index"] != dsa[i])
      fail(f + ".index", "is not the DSA layer " + std::to_string(dsa[i]) + " (config.dsa " + m_["config"]["dsa"].dump() + ")");
    if (!e.contains("dsa_rank") || e["dsa_rank"] != i) fail(f + ".dsa_rank", "is missing or not " + std::to_string(i));
    if (!e.contains("kind") || (e["kind"] != "full" && e["kind"] != "shared")) fail(f + ".kind", "is missing or not \"full\" / \"shared\"");
    const bool full = e["kind"] == "full";
    if (full) source = dsa[i];
    if (source < 0) fail(f + ".kind", "is \"shared\", but no Full DSA layer precedes it");
    if (!e.contains("source") || e["source"] != source)
      fail(f + ".source", "is not " + std::to_string(source) + " (the layer itself when Full, else the last Full DSA layer)");
    spec_.pattern += full ? 'F' : 'S';
  }
  const json& s = m_.value("schedule", json());
  if (!s.is_object() || s.value("pattern", json()) != spec_.pattern || s.value("dsa_layers", json()) != json(dsa))
    fail("schedule", "is missing or not {dsa_layers, pattern} of the layers (" + spec_.pattern + ")");
}

// Whether DSA layer `full` (or Shared) of a set of spec s holds the tensor of rule r.
bool holds(const KpoolRule& r, const KpoolSpec& s, bool full) {
  return !(r.full_only && !full) && !(std::string(r.name) == "indexer.tail" && !s.cfg.tail) &&
         !(std::string(r.name) == "indexer.pool_keys_fp8" && s.fp8 == "none");
}

void KpoolCheck::tensors() {
  for (size_t i = 0; i < spec_.pattern.size(); ++i) {
    const std::string pre = "layers." + std::to_string(spec_.dsa_layers()[i]) + ".";
    for (const KpoolRule& r : kRules)
      if (holds(r, spec_, spec_.pattern[i] == 'F'))
        expect_tensor(pre + r.name, r.dtype, kpool_shape(r.name, spec_.cfg, select_k_), r.role,
                      spec_.pattern[i] == 'F' ? "Full DSA" : "Shared DSA");
  }
  no_other_tensors("a kpool set of this config");
}

}  // namespace

void check_kpool_manifest(const Loaded& g, const std::string& mpath) { KpoolCheck(g, mpath).run(); }

std::vector<SetWriter::Planned> kpool_plan(const KpoolSpec& s) {
  const int64_t select_k = std::min(s.cfg.index_topk / s.cfg.pool, s.cfg.n_pools());
  const std::vector<int> dsa = s.dsa_layers();
  std::vector<SetWriter::Planned> plan;
  for (size_t i = 0; i < dsa.size(); ++i)
    for (const KpoolRule& r : kRules)
      if (holds(r, s, s.pattern[i] == 'F'))
        plan.push_back({{"layers." + std::to_string(dsa[i]) + "." + r.name, r.dtype, kpool_shape(r.name, s.cfg, select_k)}, r.role});
  return plan;
}

json write_kpool(const std::string& dir, bool force, const KpoolSpec& s, const std::string& replay, Impl impl,
                 std::vector<ref::kpool::KpoolLayerInputs>* given, const std::string& inputs_note) {
  s.cfg.validate();
  return write_streamed(dir, force, kpool_plan(s), [&](const PutTensor& put) { return emit_kpool(s, replay, impl, given, put); },
                        inputs_note);
}

}  // namespace indexshare::golden
