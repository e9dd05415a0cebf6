// golden sets: the manifest check read() runs (ManifestCheck: every field the tools rely on,
// consistent with the tensors and each other).

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <cmath>
#include <map>
#include <set>

#include "ref/config.h"
#include "ref/cost.h"
#include "ref/layer.h"
#include "tools/lib/golden_hyv4.h"
#include "tools/lib/golden_kpool.h"
#include "tools/lib/golden_model1.h"
#include "tools/lib/golden_mtp.h"
#include "tools/lib/golden_v4.h"

namespace indexshare::golden {

using nlohmann::json;
using namespace detail;

namespace {

// The manifest fields the tools rely on: present, of the right type and range, and consistent
// with the tensors and with each other. Every refusal names the manifest and the field.
// read() has checked the "tensors" list (names unique, each in the file with its dtype, shape and
// SHA-256, roles known) and that the file holds nothing else. The checks run as the steps of
// ManifestCheck::run, in that order (the first refusal is the one reported).
class ManifestCheck {
 public:
  ManifestCheck(const Loaded& g, const std::string& mpath) : g_(g), m_(g.manifest), mpath_(mpath) {}
  void run() {
    top_fields();
    if (kbit_ == kKindV4) {  // a DeepSeek-V4 set: its own config, layers and tensor list
      check_v4_manifest(g_, mpath_);
      return;
    }
    if (kbit_ == kKindHyv4) {  // a Hunyuan HY V4 set: likewise (tools/lib/golden_hyv4.h)
      check_hyv4_manifest(g_, mpath_);
      return;
    }
    if (kbit_ == kKindKpool) {  // a GLM-5.3 KPool-DSA set: its own config, layers and tensor list
      check_kpool_manifest(g_, mpath_);
      return;
    }
    config();
    layers();
    rows();
    sequences();
    kernel_block();
    tensors_held();
    tensors_required();
    kernel_tensors();
    cu_seqlens();
    context_lens();
    budgets();
    kind_fields();
  }

 private:
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(mpath_ + ": field '" + field + "' " + what);
  }
  int64_t int_field(const char* f, int64_t lo, int64_t hi, const std::string& hi_name = "") const;
  void top_fields();
  void config();
  void layers();
  void layer_entry(size_t l);
  void rows();
  void sequences();
  void tensors_held();
  void tensors_required();
  void cu_seqlens();
  void kernel_block();
  void kernel_tensors();
  void context_lens();
  void budgets();
  void kind_fields();
  void module_fields();

  const Loaded& g_;
  const json& m_;
  const std::string& mpath_;
  std::string kind_;
  unsigned kbit_ = 0;
  int64_t s_q_ = 0, s_kv_ = 0, topk_ = 0, h_q_ = 0, d_qk_ = 0, d_v_ = 0, H_ = 0, D_ = 0, n_layers_ = 0, n_seqs_ = 0;
  bool fp8_ = false, sampled_ = false;
  std::set<std::string> kernel_args_;  // the set-wide tensors the `kernel` block names as arguments
};

// kernel (sets written --for a kernel): an object whose args name tensors; the set-wide ones
// (without {l}) decide which kernel-only tensors the set must hold (context_lens).
void ManifestCheck::kernel_block() {
  if (!m_.contains("kernel")) return;
  const json& k = m_["kernel"];
  if (!k.is_object() || !k.contains("name") || !k["name"].is_string() || !k.contains("args") || !k["args"].is_array())
    fail("kernel", "is not an object with a name and an args list");
  // kwargs: diff reads clean_logits from it (false: the values outside the windows are masked).
  if (k.contains("kwargs") &&
      (!k["kwargs"].is_object() || (k["kwargs"].contains("clean_logits") && !k["kwargs"]["clean_logits"].is_boolean())))
    fail("kernel.kwargs", "is not an object, or its clean_logits is not true / false");
  for (size_t i = 0; i < k["args"].size(); ++i) {
    const json& a = k["args"][i];
    if (!a.is_object() || !a.contains("tensor") || !a["tensor"].is_string())
      fail("kernel.args[" + std::to_string(i) + "]", "is not an object with a tensor name");
    const std::string t = a["tensor"];
    if (t.find("{l}") == std::string::npos) kernel_args_.insert(t);
  }
}

// The kernel block's arguments and outputs name tensors the set holds (on each layer the block
// lists), with the kernel's shape (a `view`: the same number of elements) and, for arguments, the
// kernel's dtype (an output may come in another one: attn.out F32 here, BF16 from the kernel).
void ManifestCheck::kernel_tensors() {
  if (!m_.contains("kernel")) return;
  const json& k = m_["kernel"];
  if (!k.contains("layers") || !k["layers"].is_array()) fail("kernel.layers", "is missing or not a list");
  for (const json& l : k["layers"])
    if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= n_layers_)
      fail("kernel.layers", "holds " + l.dump() + ", not a layer of the set (0 to " + std::to_string(n_layers_ - 1) + ")");
  for (const char* part : {"args", "outputs"}) {
    if (!k.contains(part) || !k[part].is_array()) fail(std::string("kernel.") + part, "is missing or not a list");
    for (size_t i = 0; i < k[part].size(); ++i) {
      const json& a = k[part][i];
      const std::string f = std::string("kernel.") + part + "[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("tensor") || !a["tensor"].is_string() || !a.contains("dtype") || !a["dtype"].is_string() ||
          !a.contains("shape") || !a["shape"].is_array() || !a.contains("view") || !a["view"].is_boolean() ||
          !a.contains("optional") || !a["optional"].is_boolean())
        fail(f, "is not an object with tensor, dtype, shape, view and optional");
      int64_t numel = 1;
      Shape shape;
      for (const json& d : a["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(f + ".shape", "holds " + d.dump() + ", not a size");
        shape.push_back(d.get<int64_t>());
        numel *= d.get<int64_t>();
      }
      const std::string pattern = a["tensor"];
      const size_t at = pattern.find("{l}");
      std::vector<std::string> names;
      if (at == std::string::npos) names.push_back(pattern);
      else
        for (const json& l : k["layers"]) names.push_back(std::string(pattern).replace(at, 3, std::to_string(l.get<int64_t>())));
      for (const std::string& name : names) {
        const io::TensorView* v = g_.data.find(name);
        if (!v) {
          if (!a["optional"].get<bool>()) fail(f, "names tensor '" + name + "', which the set does not hold");
          continue;
        }
        int64_t n = 1;
        for (int64_t d : v->shape) n *= d;
        const bool transposed = a.contains("transpose");
        if (transposed && (!a["transpose"].is_array() || a["transpose"].size() != 2 || !a["transpose"][0].is_number_integer() ||
                           !a["transpose"][1].is_number_integer() || a["transpose"][0].get<int64_t>() < 0 ||
                           a["transpose"][1].get<int64_t>() < 0 || a["transpose"][0].get<int64_t>() >= int64_t(shape.size()) ||
                           a["transpose"][1].get<int64_t>() >= int64_t(shape.size()) || a["view"].get<bool>()))
          fail(f + ".transpose", "is not two dims of its shape (and view false)");
        if (a["view"].get<bool>() || transposed ? n != numel : v->shape != shape)
          fail(f + ".shape", "is " + a["shape"].dump() + ", but tensor '" + name + "' is " + shape_str(v->shape));
        if (std::string(part) == "args" && io::dtype_name(v->dtype) != a["dtype"].get<std::string>())
          fail(f + ".dtype", "is " + a["dtype"].get<std::string>() + ", but tensor '" + name + "' is " + io::dtype_name(v->dtype));
      }
    }
  }
}

// context_lens (the paged indexer's 2-D form): context_lens[b, j] = cache_seqlens[b] - next_n + j + 1.
void ManifestCheck::context_lens() {
  const io::TensorView* cl = g_.data.find("context_lens");
  const io::TensorView* cs = g_.data.find("cache_seqlens");
  if (!cl || !cs) return;
  const Tensor<int32_t> c = g_.tensor<int32_t>("context_lens"), lens = g_.tensor<int32_t>("cache_seqlens");
  const int64_t next_n = s_q_ / n_seqs_;
  for (int64_t b = 0; b < n_seqs_; ++b)
    for (int64_t j = 0; j < next_n; ++j)
      if (int64_t(c[b * next_n + j]) != int64_t(lens[b]) - next_n + j + 1)
        fail("kernel", "names tensor 'context_lens', whose element [" + std::to_string(b) + ", " + std::to_string(j) + "] is " +
                           std::to_string(c[b * next_n + j]) + ", expected cache_seqlens[b] - next_n + j + 1 = " +
                           std::to_string(int64_t(lens[b]) - next_n + j + 1));
}

void ManifestCheck::top_fields() {
  for (const char* f : {"generator", "kind", "problem", "replay"})
    if (!m_.contains(f) || !m_[f].is_string()) fail(f, "is missing or not a string");
  kind_ = m_["kind"];
  kbit_ = kind_bit(kind_);
  if (!kbit_) fail("kind", "is '" + kind_ + "', not a known kind (stack, stack-from-file, attention-edge, decode, module, train, decode-model1, v4, mtp, hyv4, kpool)");
  if (!m_.contains("conventions") || !m_["conventions"].is_object()) fail("conventions", "is missing or not an object");
  if (!m_.contains("budgets") || !m_["budgets"].is_object()) fail("budgets", "is missing or not an object");
}

int64_t ManifestCheck::int_field(const char* f, int64_t lo, int64_t hi, const std::string& hi_name) const {
  const json& c = m_["config"];
  const std::string field = std::string("config.") + f;
  if (!c.contains(f) || !c[f].is_number_integer()) fail(field, "is missing or not an integer");
  if (c[f].is_number_unsigned() && c[f].get<uint64_t>() > uint64_t(INT64_MAX)) fail(field, "must be <= " + std::to_string(hi) + hi_name + ", got " + c[f].dump());
  const int64_t v = c[f].get<int64_t>();
  if (v < lo) fail(field, "must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
  if (v > hi) fail(field, "must be <= " + std::to_string(hi) + hi_name + ", got " + std::to_string(v));
  return v;
}

// config: types and ranges.
void ManifestCheck::config() {
  if (!m_.contains("config") || !m_["config"].is_object()) fail("config", "is missing or not an object");
  const json& c = m_["config"];
  const int64_t kMax = (int64_t(1) << 31) - 1;
  s_q_ = int_field("s_q", 1, kMax), s_kv_ = int_field("s_kv", 1, kMax), topk_ = int_field("topk", 1, kMax);
  h_q_ = int_field("h_q", 1, kMax), d_qk_ = int_field("d_qk", 1, kMax);
  d_v_ = int_field("d_v", 1, d_qk_, " (config.d_qk)");
  H_ = int_field("index_n_heads", 1, kMax), D_ = int_field("index_head_dim", 1, int64_t(1) << 17);
  n_layers_ = int_field("n_layers", 1, 1000000), n_seqs_ = int_field("n_seqs", 1, kMax);
  // seed: the generator's, replayed by overlap --golden; int64 >= 0 (what a descriptor and --seed hold).
  if (!c.contains("seed") || !c["seed"].is_number_integer() ||
      (c["seed"].is_number_unsigned() ? c["seed"].get<uint64_t>() > uint64_t(INT64_MAX) : c["seed"].get<int64_t>() < 0))
    fail("config.seed", "is not an integer >= 0");
  if (!c.contains("start_pos") || !c["start_pos"].is_number_integer()) fail("config.start_pos", "is missing or not an integer");
  if (!c.contains("indexer") || !c["indexer"].is_string() || (c["indexer"] != "fp8" && c["indexer"] != "bf16"))
    fail("config.indexer", "is " + (c.contains("indexer") ? c["indexer"].dump() : std::string("missing")) + ", not \"fp8\" or \"bf16\"");
  fp8_ = c["indexer"] == "fp8";
  if (!c.contains("sm_scale") || !c["sm_scale"].is_number()) fail("config.sm_scale", "is missing or not a number");
  const double sm = c["sm_scale"].get<double>();
  if (!std::isfinite(sm) || std::fabs(sm) > 3.4e38) fail("config.sm_scale", "is not a finite f32 number");
}

// layers: index, kind, source (this layer if Full, an earlier Full layer if Shared), has_indexer.
void ManifestCheck::layers() {
  if (!m_.contains("layers") || !m_["layers"].is_array() || m_["layers"].empty()) fail("layers", "is missing, empty or not an array");
  const json& layers = m_["layers"];
  for (size_t l = 0; l < layers.size(); ++l) layer_entry(l);
  if (g_.data.find("layers." + std::to_string(layers.size()) + ".attn.q"))
    fail("layers", "lists " + std::to_string(layers.size()) + " layers, but the file holds more");
  if (int64_t(layers.size()) != n_layers_)
    fail("config.n_layers", "is " + std::to_string(n_layers_) + ", but field 'layers' lists " + std::to_string(layers.size()) + " layers");
}

void ManifestCheck::layer_entry(size_t l) {
  const json& layers = m_["layers"];
  const std::string f = "layers[" + std::to_string(l) + "]";
  const json& e = layers[l];
  if (!e.is_object() || !e.contains("kind") || !e["kind"].is_string() || (e["kind"] != "full" && e["kind"] != "shared"))
    fail(f + ".kind", "is missing or not \"full\" / \"shared\"");
  if (!e.contains("index") || !e["index"].is_number_integer() || e["index"] != l)
    fail(f + ".index", "is " + (e.contains("index") ? e["index"].dump() : std::string("missing")) + ", not its position " + std::to_string(l));
  if (!e.contains("source") || !e["source"].is_number_integer()) fail(f + ".source", "is missing or not an integer");
  const int64_t src = e["source"].is_number_unsigned() && e["source"].get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : e["source"].get<int64_t>();
  if (src < 0 || src > int64_t(l) || layers[size_t(src)]["kind"] != "full" || (e["kind"] == "full" && src != int64_t(l)))
    fail(f + ".source", "is " + e["source"].dump() + ": not this layer (Full) or an earlier Full layer (Shared)");
  if (!e.contains("has_indexer") || !e["has_indexer"].is_boolean()) fail(f + ".has_indexer", "is missing or not true / false");
  const bool has_ix = e["has_indexer"].get<bool>();
  // (decode-model1: one layer of attention alone, its indices given, no indexer)
  if (e["kind"] == "full" && !has_ix && kind_ != "decode-model1")
    fail(f + ".has_indexer", "is false on a Full layer (a Full layer runs its indexer)");
  const std::string pre = "layers." + std::to_string(l) + ".";
  if (has_ix != (g_.data.find(pre + "indexer.q") != nullptr))
    fail(f + ".has_indexer", std::string("is ") + (has_ix ? "true, but tensor '" : "false, but the file holds '") + pre + "indexer.q'" +
                                 (has_ix ? " is missing" : ""));
  // Every layer's attention tensors must be there, with the config's shapes.
  const io::TensorView* q = g_.data.find(pre + "attn.q");
  if (!q) fail("layers", "lists layer " + std::to_string(l) + ", but tensor '" + pre + "attn.q' is missing");
  if (q->shape != Shape{s_q_, h_q_, d_qk_}) fail("config.s_q/h_q/d_qk", "disagree with " + pre + "attn.q " + shape_str(q->shape));
  const io::TensorView* kv = g_.data.find(pre + "attn.kv");
  if (!kv || kv->shape != Shape{s_kv_, 1, d_qk_}) fail("config.s_kv", "disagrees with " + pre + "attn.kv");
  const io::TensorView* ind = g_.data.find(pre + "attn.indices");
  if (!ind || ind->shape != Shape{s_q_, 1, topk_}) fail("config.topk", "disagrees with " + pre + "attn.indices");
  const io::TensorView* out = g_.data.find(pre + "attn.out");
  if (!out || out->shape != Shape{s_q_, h_q_, d_v_}) fail("config.d_v", "disagrees with " + pre + "attn.out");
}

// Sampled sets (--rows): the row list, the `rows` tensor and config.s_q agree.
void ManifestCheck::rows() {
  sampled_ = m_.contains("rows");
  if (!sampled_) {
    if (g_.data.find("rows")) fail("rows", "is missing, but the file holds tensor 'rows'");
    return;
  }
  if (kind_ != "stack") fail("rows", "is present, but kind is '" + kind_ + "' (sampled query rows are for kind 'stack' only)");
  const json& r = m_["rows"];
  if (!r.is_object() || !r.contains("count") || !r["count"].is_number_integer() || r["count"].get<int64_t>() != s_q_)
    fail("rows.count", "is missing or differs from config.s_q (" + std::to_string(s_q_) + ")");
  if (!r.contains("problem_s_q") || !r["problem_s_q"].is_number_integer() || r["problem_s_q"].get<int64_t>() < s_q_ ||
      r["problem_s_q"].get<int64_t>() > s_kv_)
    fail("rows.problem_s_q", "is missing or outside [config.s_q, config.s_kv]");
  if (!r.contains("list") || !r["list"].is_string()) fail("rows.list", "is missing or not a string");
  const io::TensorView* rt = g_.data.find("rows");
  if (!rt || rt->dtype != io::DType::I32 || rt->shape != Shape{s_q_})
    fail("rows", "needs tensor 'rows' I32 [" + std::to_string(s_q_) + "] (config.s_q)");
  const Tensor<int32_t> rv = g_.tensor<int32_t>(rt->name);
  std::vector<int64_t> list(rv.data.begin(), rv.data.end());
  Problem whole;
  whole.s_q = r["problem_s_q"].get<int64_t>();
  try {
    ref::check_rows(whole, list);
  } catch (const Error& e) {
    fail("rows", std::string("tensor 'rows': ") + e.what());
  }
  if (ref::format_rows(list) != r["list"].get<std::string>()) fail("rows.list", "differs from tensor 'rows'");
}

// Sequences: n_seqs flattened sequences of equal length, the queries the last positions of each.
void ManifestCheck::sequences() {
  if (kind_ == "decode-model1") return;  // attn.kv is two paged pools' slots, not n_seqs sequences
  const int64_t s_q_all = sampled_ ? m_["rows"]["problem_s_q"].get<int64_t>() : s_q_;
  const std::string sq_name = sampled_ ? "rows.problem_s_q" : "config.s_q";
  if (s_q_all > s_kv_) fail("config.s_q", "is " + std::to_string(s_q_all) + ", above config.s_kv (" + std::to_string(s_kv_) + "): queries are the last positions");
  if (s_q_all % n_seqs_ || s_kv_ % n_seqs_)
    fail("config.n_seqs", "is " + std::to_string(n_seqs_) + ": it must divide " + sq_name + " (" + std::to_string(s_q_all) +
                              ") and config.s_kv (" + std::to_string(s_kv_) + ")");
  const int64_t start = (s_kv_ - s_q_all) / n_seqs_;
  if (m_["config"]["start_pos"] != start)
    fail("config.start_pos", "is " + m_["config"]["start_pos"].dump() + ", expected (config.s_kv - " + sq_name + ") / config.n_seqs = " +
                                 std::to_string(start) + " (the first query row's position in its sequence)");
}

// Tensors: exactly the names a set of this kind holds (by the layers' has_indexer, the indexer
// mode, sampled or whole), each with its role, dtype and the config's shape. First what it holds:
void ManifestCheck::tensors_held() {
  const json& layers = m_["layers"];
  const Dims dims{s_q_, s_kv_, topk_, H_, D_, h_q_, d_qk_, d_v_, n_seqs_, fp8_};
  std::map<std::string, size_t> entry;  // name -> index in the manifest's list
  for (size_t i = 0; i < m_["tensors"].size(); ++i) entry[m_["tensors"][i]["name"].get<std::string>()] = i;
  for (const io::TensorView& v : g_.data.tensors) {
    int64_t l = -1;
    const TensorRule* r = rule_of(v.name, kbit_, l);
    if (!r) {
      int64_t other_l = -1;
      std::string owners;
      if (const TensorRule* o = rule_of(v.name, kAllKinds, other_l))
        for (const char* k : {"stack", "stack-from-file", "attention-edge", "decode", "module", "train", "decode-model1", "mtp"})
          if (o->kinds & kind_bit(k)) owners += (owners.empty() ? "" : ", ") + std::string(k);
      fail("kind", "is '" + kind_ + "', but the set holds tensor '" + v.name + "', " +
                       (owners.empty() ? "not a golden tensor name" : "which only sets of kind " + owners + " hold"));
    }
    if (l >= n_layers_) fail("layers", "lists " + std::to_string(n_layers_) + " layers, but the set holds tensor '" + v.name + "'");
    const bool has_ix = l >= 0 && layers[size_t(l)]["has_indexer"].get<bool>();
    const std::string lf = "layers[" + std::to_string(l) + "].has_indexer";
    if ((r->need == Need::indexer || r->need == Need::optional_indexer || r->need == Need::indexer_fp8) && !has_ix)
      fail(lf, "is false, but the set holds tensor '" + v.name + "'");
    if (r->need == Need::indexer_fp8 && !fp8_) fail("config.indexer", "is \"bf16\", but the set holds tensor '" + v.name + "' (FP8 indexer cache)");
    if (r->need == Need::whole_rows && sampled_) fail("rows", "is present (sampled query rows), but the set holds tensor '" + v.name + "'");
    if (r->need == Need::full && layers[size_t(l)]["kind"] != "full")
      fail("layers[" + std::to_string(l) + "].kind", "is \"shared\", but the set holds tensor '" + v.name + "' (Full layers' indexer loss only)");
    if (r->need == Need::kernel_arg && !kernel_args_.count(v.name))
      fail("kernel", "names no argument '" + v.name +
                         "', but the set holds that tensor (only sets written --for a kernel that takes it do)");
    const size_t i = entry.at(v.name);
    const std::string role = m_["tensors"][i]["role"];
    if (role != role_name(r->role))
      fail("tensors[" + std::to_string(i) + "].role", "is '" + role + "', but '" + v.name + "' is " + role_name(r->role));
    const Layout want = layout_of(l >= 0 ? v.name.substr(v.name.find('.', 7) + 1) : v.name, dims);
    if (v.dtype != want.dtype || (want.known_shape && !shape_matches(want.shape, v.shape)))
      fail(want.fields, "disagrees with tensor '" + v.name + "': expected " +
                            (want.known_shape ? layout_str(want.dtype, want.shape) : io::dtype_name(want.dtype)) +
                            ", the set holds " + layout_str(v.dtype, v.shape));
  }
}

// ... then every tensor a set of this kind must hold.
void ManifestCheck::tensors_required() {
  const json& layers = m_["layers"];
  const auto distilled = [&](int64_t l) {
    if (!m_.contains("train") || !m_["train"].is_object() || !m_["train"].contains("indexer_losses")) return false;
    for (const json& e : m_["train"]["indexer_losses"])
      if (e.is_object() && e.contains("layer") && e["layer"].is_number_integer() && e["layer"].get<int64_t>() == l) return true;
    return false;
  };
  for (const TensorRule& r : tensor_rules()) {
    if (!(r.kinds & kbit_)) continue;
    for (int64_t l = r.per_layer ? 0 : -1; l < (r.per_layer ? n_layers_ : 0); ++l) {
      const bool has_ix = l >= 0 && layers[size_t(l)]["has_indexer"].get<bool>();
      const bool needed = r.need == Need::always || (r.need == Need::indexer && has_ix) ||
                          (r.need == Need::indexer_fp8 && has_ix && fp8_) || (r.need == Need::whole_rows && !sampled_) ||
                          (r.need == Need::sampled && sampled_) || (r.need == Need::kernel_arg && kernel_args_.count(r.name)) ||
                          (r.need == Need::full && layers[size_t(l)]["kind"] == "full") ||
                          (r.need == Need::distilled && distilled(l));
      const std::string name = l >= 0 ? "layers." + std::to_string(l) + "." + r.name : std::string(r.name);
      if (needed && !g_.data.find(name)) fail("kind", "is '" + kind_ + "', but tensor '" + name + "' is missing (a " + kind_ + " set holds it)");
    }
  }
}

// The boundaries of the sequences.
void ManifestCheck::cu_seqlens() {
  for (const char* name : {"cu_seqlens_q", "cu_seqlens_k"}) {
    const io::TensorView* cu = g_.data.find(name);
    if (!cu) continue;
    const int64_t total = std::string(name) == "cu_seqlens_q" ? s_q_ : s_kv_;
    const Tensor<int32_t> t = g_.tensor<int32_t>(cu->name);
    for (int64_t i = 0; i <= n_seqs_; ++i)
      if (int64_t(t[i]) != i * (total / n_seqs_))
        fail("config.n_seqs", "disagrees with tensor '" + std::string(name) + "': element [" + std::to_string(i) + "] is " +
                                  std::to_string(t[i]) + ", expected " + std::to_string(i * (total / n_seqs_)) +
                                  " (sequences of equal length)");
  }
}

// budgets: one per layer, for its attn.out.
void ManifestCheck::budgets() {
  for (const auto& [name, e] : m_["budgets"].items()) {
    const std::string f = "budgets." + name;
    int64_t l = -1;
    std::string rest;
    if (!split_layer_name(name, l, rest) || rest != "attn.out" || l >= n_layers_)
      fail(f, "is not a budget of a layer's attn.out (expected 'layers.{l}.attn.out', l < " + std::to_string(n_layers_) + ")");
    if (!e.is_object() || !e.contains("budget_max_abs") || !e["budget_max_abs"].is_number())
      fail(f, "is not an object with a numeric budget_max_abs");
    const double b = e["budget_max_abs"].get<double>();
    if (!std::isfinite(b) || b < 0) fail(f + ".budget_max_abs", "is not a finite number >= 0");
    if (!e.contains("multiple") || !e["multiple"].is_number()) fail(f + ".multiple", "is missing or not a number");
    const double mult = e["multiple"].get<double>();
    if (!std::isfinite(mult) || mult <= 0) fail(f + ".multiple", "must be a finite number > 0, got " + e["multiple"].dump());
    if (e.contains("emulation_max_abs") && (!e["emulation_max_abs"].is_number() || !std::isfinite(e["emulation_max_abs"].get<double>()) ||
                                            e["emulation_max_abs"].get<double>() < 0))
      fail(f + ".emulation_max_abs", "is not a finite number >= 0");
    if (e.contains("emulation") && !e["emulation"].is_string()) fail(f + ".emulation", "is not a string");
  }
  for (int64_t l = 0; l < n_layers_; ++l)
    if (!m_["budgets"].contains("layers." + std::to_string(l) + ".attn.out"))
      fail("budgets", "has no entry 'layers." + std::to_string(l) + ".attn.out'");
}

// Kind-specific fields: the indexer variant, a module set's model_config, a dump's source_file.
void ManifestCheck::kind_fields() {
  const json& conv = m_["conventions"];
  if (conv.contains("indexer_variant") &&
      (!conv["indexer_variant"].is_string() || (conv["indexer_variant"] != "deepseek_fp8" && conv["indexer_variant"] != "hf_bf16")))
    fail("conventions.indexer_variant", "is " + conv["indexer_variant"].dump() + ", not \"deepseek_fp8\" or \"hf_bf16\"");
  if (kind_ == "decode-model1") check_model1_set(g_, mpath_);  // tools/lib/golden_model1.h
  if (kind_ == "mtp") {
    check_mtp_manifest(g_, mpath_);  // tools/lib/golden_mtp.h
  } else if (m_.contains("mtp")) {
    fail("mtp", "is present, but kind is '" + kind_ + "' (mtp sets only)");
  }
  if (kind_ == "module") {
    module_fields();
  } else if (m_.contains("model_config")) {
    fail("model_config", "is present, but kind is '" + kind_ + "' (module sets only)");
  }
  if (kind_ == "train") {
    if (!m_.contains("train") || !m_["train"].is_object()) fail("train", "is missing or not an object (kind train)");
    const json& t = m_["train"];
    if (!t.contains("loss") || (t["loss"] != "sparse" && t["loss"] != "dense")) fail("train.loss", "is not \"sparse\" or \"dense\"");
    if (!t.contains("target") || (t["target"] != "own-layer" && t["target"] != "served-layers"))
      fail("train.target", "is not \"own-layer\" or \"served-layers\"");
    if (!t.contains("relu") || !t["relu"].is_boolean()) fail("train.relu", "is missing or not a boolean");
    if (t.contains("kl_form") && (t["target"] != "served-layers" || (t["kl_form"] != "kl-of-mean" && t["kl_form"] != "mean-of-kl")))
      fail("train.kl_form", "is not \"kl-of-mean\" or \"mean-of-kl\" on a served-layers set");
    if (!t.contains("loss_coeff") || !t["loss_coeff"].is_number() || !(t["loss_coeff"].get<double>() > 0))
      fail("train.loss_coeff", "is missing or not a number > 0");
    if (fp8_) fail("config.indexer", "is \"fp8\", but a train set's indexer loss is defined on the bf16 indexer");
  } else if (m_.contains("train")) {
    fail("train", "is present, but kind is '" + kind_ + "' (train sets only)");
  }
  if (kind_ == "stack-from-file") {
    if (!m_.contains("source_file") || !m_["source_file"].is_string()) fail("source_file", "is missing or not a string (kind stack-from-file)");
  } else if (m_.contains("source_file")) {
    fail("source_file", "is present, but kind is '" + kind_ + "' (stack-from-file sets only)");
  }
}

// A module set: its indexer variant and model_config agree with config and the layers.
void ManifestCheck::module_fields() {
  const json& conv = m_["conventions"];
  if (!conv.contains("indexer_variant")) fail("conventions.indexer_variant", "is missing (a module set records its indexer variant)");
  if ((conv["indexer_variant"] == "deepseek_fp8") != fp8_)
    fail("conventions.indexer_variant", "is " + conv["indexer_variant"].dump() + ", but config.indexer is " + m_["config"]["indexer"].dump());
  if (!m_.contains("model_config") || !m_["model_config"].is_object()) fail("model_config", "is missing or not an object (a module set)");
  const ModelConfig mc = parse_config_json(m_["model_config"].dump(), mpath_ + ": field 'model_config'");
  const std::pair<const char*, std::pair<int64_t, int64_t>> agree[] = {
      {"n_layers", {mc.n_layers, n_layers_}},       {"h_q", {mc.n_heads, h_q_}},
      {"d_qk", {mc.d_qk(), d_qk_}},                 {"d_v", {mc.d_v(), d_v_}},
      {"index_n_heads", {mc.index_n_heads, H_}},    {"index_head_dim", {mc.index_head_dim, D_}},
      {"topk", {mc.index_topk, topk_}},             {"s_q", {mc.seq, s_q_}},
      {"s_kv", {mc.seq, s_kv_}}};
  for (const auto& [f, ab] : agree)
    if (ab.first != ab.second)
      fail(std::string("config.") + f, "is " + std::to_string(ab.second) + ", but field 'model_config' gives " + std::to_string(ab.first));
  std::string pattern;
  for (const json& l : m_["layers"]) pattern += l["kind"] == "full" ? 'F' : 'S';
  std::string mc_pattern;
  try {
    mc_pattern = mc.resolve_schedule().pattern();
  } catch (const Error& e) {
    fail("model_config.schedule", e.what());
  }
  if (mc_pattern != pattern) fail("layers", "give the schedule " + pattern + ", field 'model_config' " + mc_pattern);
}

}  // namespace

namespace detail {
void check_manifest(const Loaded& g, const std::string& mpath) { ManifestCheck(g, mpath).run(); }
}  // namespace detail

}  // namespace indexshare::golden
