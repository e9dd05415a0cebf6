#include "tools/lib/golden_train.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ref/error.h"
#include "ref/kernels.h"
#include "ref/numerics.h"
#include "ref/rng.h"
#include "ref/train/attention_bwd.h"
#include "ref/train/indexer_loss.h"
#include "tools/lib/golden/internal.h"
#include "tools/lib/safetensors.h"

namespace indexshare::golden {

namespace {

using nlohmann::json;

// A tensor of the set being built, decoded (the views hold little-endian bytes).
template <class T>
Tensor<T> get(const GoldenSet& g, const std::string& name) {
  for (const io::TensorView& v : g.tensors)
    if (v.name == name) return io::as_tensor<T>(v, "golden set");
  throw Error("golden --kind train: internal: the stack set holds no tensor '" + name + "'");
}

bool has(const GoldenSet& g, const std::string& name) {
  return std::any_of(g.tensors.begin(), g.tensors.end(), [&](const io::TensorView& v) { return v.name == name; });
}

// The upstream gradients of --d-out FILE, one per layer, checked against the problem's shapes.
std::vector<Tensor<bf16_t>> read_d_out(const std::string& file, const Problem& p) {
  const io::SafetensorsFile f = io::read_safetensors(file);
  const std::vector<int64_t> want = {p.s_q, p.h_q, p.d_v};
  std::vector<Tensor<bf16_t>> out;
  for (int l = 0; l < p.n_layers; ++l) {
    const std::string name = "layers." + std::to_string(l) + ".attn.d_out";
    const io::TensorView* v = f.find(name);
    require(v != nullptr, "golden --d-out " + file + ": holds no tensor '" + name + "' (every layer's upstream gradient, BF16 [s_q, h_q, d_v])");
    require(v->shape == want, "golden --d-out " + file + ": tensor '" + name + "': shape " + shape_str(v->shape) +
                                  ", expected [s_q, h_q, d_v] = " + shape_str(want) + " (config.s_q/h_q/d_v of the problem)");
    out.push_back(io::as_tensor<bf16_t>(*v, "golden --d-out " + file));
  }
  for (const io::TensorView& v : f.tensors) {
    bool known = false;
    for (int l = 0; l < p.n_layers && !known; ++l) known = v.name == "layers." + std::to_string(l) + ".attn.d_out";
    require(known, "golden --d-out " + file + ": tensor '" + v.name + "' is not the attn.d_out of one of the stack's " +
                       std::to_string(p.n_layers) + " layers");
  }
  return out;
}

// The attention's backward of layer l: dO given (--d-out) or drawn, the gradients added.
void attention_backward(GoldenSet& g, const Problem& p, const std::string& pre, float sm, const ref::Kernels& k,
                        const Tensor<bf16_t>* given) {
  const Tensor<bf16_t> q = get<bf16_t>(g, pre + "attn.q"), kv = get<bf16_t>(g, pre + "attn.kv");
  const Tensor<int32_t> ind = get<int32_t>(g, pre + "attn.indices");
  std::optional<Tensor<float>> sink;
  if (has(g, pre + "attn.sink")) sink = get<float>(g, pre + "attn.sink");
  std::optional<Tensor<int32_t>> len;
  if (has(g, pre + "attn.topk_length")) len = get<int32_t>(g, pre + "attn.topk_length");
  const int64_t s_q = q.dim(0), h_q = q.dim(1);
  Tensor<bf16_t> d_out({s_q, h_q, p.d_v});
  if (given) d_out = *given;
  else fill_range_bf16(d_out.ptr(), 0, d_out.numel(), Dist::normal, 1.0f, p.seed, stream_tag(pre + "attn.d_out"));
  ref::AttentionBackwardOut b = k.sparse_attention_backward(q, kv, ind, sm, p.d_v, d_out, len ? &*len : nullptr, sink ? &*sink : nullptr);
  g.add(pre + "attn.d_out", std::move(d_out), Role::input);
  g.add(pre + "attn_bwd.delta", std::move(b.delta), Role::output);
  g.add(pre + "attn_bwd.p", std::move(b.p), Role::reference);
  g.add(pre + "attn_bwd.ds", std::move(b.ds), Role::reference);
  g.add(pre + "attn_bwd.dq", std::move(b.dq), Role::output);
  g.add(pre + "attn_bwd.dq_bf16", std::move(b.dq_bf16), Role::output);
  g.add(pre + "attn_bwd.dkv", std::move(b.dkv), Role::output);
  g.add(pre + "attn_bwd.dkv_bf16", std::move(b.dkv_bf16), Role::output);
  if (sink) g.add(pre + "attn_bwd.d_sink", std::move(b.d_sink), Role::output);
}

// The indexer loss of Full layer l, taught by `teachers` (its own layer first).
void indexer_loss(GoldenSet& g, const TrainSpec& t, int l, const std::vector<int>& teachers, float sm, const ref::Kernels& k) {
  const std::string pre = "layers." + std::to_string(l) + ".";
  const Tensor<bf16_t> iq = get<bf16_t>(g, pre + "indexer.q"), ik = get<bf16_t>(g, pre + "indexer.k");
  const Tensor<float> w = get<float>(g, pre + "indexer.weights");
  const Tensor<int32_t> ks = get<int32_t>(g, pre + "indexer.ks"), ke = get<int32_t>(g, pre + "indexer.ke");
  const Tensor<int32_t> topk = get<int32_t>(g, pre + "indexer.topk");
  std::vector<Tensor<bf16_t>> aq, akv;
  aq.reserve(teachers.size());
  akv.reserve(teachers.size());
  std::vector<ref::train::TeacherLayer> tl;
  for (int m : teachers) {
    const std::string tp = "layers." + std::to_string(m) + ".";
    aq.push_back(get<bf16_t>(g, tp + "attn.q"));
    akv.push_back(get<bf16_t>(g, tp + "attn.kv"));
  }
  for (size_t i = 0; i < teachers.size(); ++i) tl.push_back({&aq[i], &akv[i], sm, nullptr});
  ref::train::IndexerLossOptions o;
  o.relu = t.relu;
  o.sparse = t.sparse;
  o.loss_coeff = t.loss_coeff;
  o.target = ref::train::parse_target(t.target);
  o.kl_form = ref::train::parse_kl_form(t.kl_form);
  ref::train::IndexerLossOut r = k.indexer_loss(bf16_to_f32(iq), bf16_to_f32(ik), w, ks, ke, &topk, tl, o);
  g.add(pre + "indexer_loss.p", std::move(r.p), Role::output);
  g.add(pre + "indexer_loss.log_q", std::move(r.log_q), Role::output);
  g.add(pre + "indexer_loss.kl", std::move(r.kl), Role::output);
  g.add(pre + "indexer_loss.loss", Tensor<float>({1}, float(r.loss)), Role::output);
  g.add(pre + "indexer_loss.d_scores", std::move(r.d_scores), Role::output);
  // bf16 copies (round to nearest even) of the gradients of the bf16 q and k and of the weights.
  g.add(pre + "indexer_loss.dq_bf16", detail::to_bf16_tensor(r.dq), Role::output);
  g.add(pre + "indexer_loss.dk_bf16", detail::to_bf16_tensor(r.dk), Role::output);
  g.add(pre + "indexer_loss.dw_bf16", detail::to_bf16_tensor(r.dw), Role::output);
  g.add(pre + "indexer_loss.dq", std::move(r.dq), Role::output);
  g.add(pre + "indexer_loss.dk", std::move(r.dk), Role::output);
  g.add(pre + "indexer_loss.dw", std::move(r.dw), Role::output);
}

// Per layer: is its indexer distilled (the Full layers of --loss-layers, or every Full layer)?
std::vector<bool> distilled_layers(const Problem& p, const TrainSpec& t) {
  const Schedule sched = p.schedule();
  std::vector<bool> on(size_t(p.n_layers), t.loss_layers.empty());
  for (int l : t.loss_layers) {
    require(l < p.n_layers, "golden --loss-layers: layer " + std::to_string(l) + " does not exist (the stack has " +
                                std::to_string(p.n_layers) + " layers)");
    if (sched.is_full(l)) {
      on[size_t(l)] = true;
      continue;
    }
    const int src = int(sched.source(l));
    require(t.target == "served-layers",
            "golden --loss-layers: layer " + std::to_string(l) + " is Shared (its positions are layer " + std::to_string(src) +
                "'s): it has no indexer to distil under the own-layer target; give layer " + std::to_string(src) +
                ", or --train-target served-layers to let layer " + std::to_string(l) + "'s attention teach layer " +
                std::to_string(src) + "'s indexer");
    on[size_t(src)] = true;
  }
  return on;
}

}  // namespace

std::vector<int> parse_loss_layers(const std::string& text) {
  std::vector<int> out;
  size_t b = 0;
  while (b <= text.size()) {
    const size_t e = std::min(text.find(',', b), text.size());
    const std::string tok = text.substr(b, e - b);
    char* end = nullptr;
    const long v = tok.empty() ? -1 : std::strtol(tok.c_str(), &end, 10);
    require(!tok.empty() && end && *end == 0 && v >= 0 && v < 1000000,
            "golden --loss-layers: '" + tok + "' in '" + text + "' is not a layer number (expected e.g. 0,2)");
    out.push_back(int(v));
    b = e + 1;
  }
  return out;
}

std::string train_options_text(const TrainSpec& t) {
  std::string s;
  if (!t.sparse) s += " --loss dense";
  if (t.target != "own-layer") s += " --train-target " + t.target;
  if (t.kl_form != "kl-of-mean") s += " --kl-form " + t.kl_form;
  if (!t.relu) s += " --relu no";
  if (t.edges) s += " --train-edges yes";
  if (!t.d_out_file.empty()) s += " --d-out " + t.d_out_file;
  if (!t.loss_layers.empty()) {
    s += " --loss-layers ";
    for (size_t i = 0; i < t.loss_layers.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(t.loss_layers[i]);
    }
  }
  if (t.loss_coeff != 1.0) {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", t.loss_coeff);
    s += std::string(" --loss-coeff ") + b;
  }
  return s;
}

GoldenSet build_train(const Problem& p, const TrainSpec& t, const std::string& replay, Impl impl) {
  require(p.indexer == IndexerMode::bf16,
          "golden --kind train: the indexer loss is defined on the indexer's unquantized q and k: give indexer=bf16 in "
          "the problem (got indexer=fp8)");
  (void)ref::train::parse_target(t.target);  // a bad name is refused before computing
  require(t.loss_coeff > 0 && std::isfinite(t.loss_coeff), "golden --kind train: --loss-coeff must be finite and > 0");
  require(!t.edges || (p.s_q >= 9 && p.index_topk >= 3),
          "golden --kind train --train-edges: the edge rows need sq >= 9 and k >= 3 (rows 0-6 rewrite the attention's "
          "indices, rows 7-8 have no indexer keys)");
  const std::vector<bool> distilled = distilled_layers(p, t);  // refused before computing
  const std::vector<Tensor<bf16_t>> given = t.d_out_file.empty() ? std::vector<Tensor<bf16_t>>() : read_d_out(t.d_out_file, p);
  const InputEdit no_keys = [](std::vector<ref::LayerInputs>& in) {
    for (ref::LayerInputs& l : in)
      for (int64_t r : kEdgeEmptyRows)
        if (r < l.ke.numel()) l.ke[r] = l.ks[r];  // (Shared layers may carry no indexer inputs)
  };
  GoldenSet g = t.edges ? build(p, "attention-edge", true, replay, impl, nullptr, nullptr, no_keys)
                        : build(p, "stack", true, replay, impl);
  g.manifest["kind"] = "train";
  const float sm = g.manifest["config"]["sm_scale"].get<float>();
  const json& layers = g.manifest["layers"];
  const ref::Kernels k = kernels_for(impl);
  for (int l = 0; l < p.n_layers; ++l)
    attention_backward(g, p, "layers." + std::to_string(l) + ".", sm, k, given.empty() ? nullptr : &given[size_t(l)]);
  json losses = json::array();
  for (int l = 0; l < p.n_layers; ++l) {
    if (layers[size_t(l)]["kind"] != "full" || !distilled[size_t(l)]) continue;
    std::vector<int> teachers = {l};
    if (t.target == "served-layers")
      for (int m = l + 1; m < p.n_layers; ++m)
        if (layers[size_t(m)]["kind"] == "shared" && layers[size_t(m)]["source"].get<int>() == l) teachers.push_back(m);
    indexer_loss(g, t, l, teachers, sm, k);
    losses.push_back({{"layer", l}, {"teachers", teachers}});
  }
  g.manifest["train"] = {
      {"loss", t.sparse ? "sparse" : "dense"},
      {"target", t.target},
      {"relu", t.relu},
      {"loss_coeff", t.loss_coeff},
      {"grad", 1.0},
      {"rows", "N = the query rows with at least one valid key (Megatron's valid rows), at least 1"},
      {"indexer_losses", losses},
      {"d_out", t.d_out_file.empty() ? "layers.{l}.attn.d_out: bf16 normal draws from the stream named after it"
                                     : "layers.{l}.attn.d_out: given (--d-out " + t.d_out_file + ")"},
      {"invalid_index", "attention backward: indices outside [0, s_kv) are ignored (no gradient), as in the forward"},
      {"duplicates", "attention backward: each occurrence of a duplicated index is one softmax term and adds its own "
                     "dkv contribution (the forward's rule, TileLang's kernel); the loss's sparse support counts a "
                     "duplicate once (Megatron's scatter mask)"},
      {"delta", "attn_bwd.delta = sum_c O_c dO_c of the exact O (computed as sum_i P_i dP_i, equal in exact arithmetic); "
                "a kernel's Delta from its bf16 out in f32 is within the bounds"},
      {"sink", "attn_bwd.d_sink = -sum_t (1 - f) Delta, f = 1 / (1 + exp(sink - lse))"},
      {"ds", "attn_bwd.ds is dL/d(scaled logit); TileLang's dS is sm_scale times it"},
      {"shared_layers", "no indexer loss on Shared layers; their attention's gradients flow through the shared positions"},
  };
  if (p.n_seqs > 1)
    g.manifest["train"]["sequences"] = "each row's keys are its own sequence's (indexer.ks / ke, attn.indices); N counts "
                                       "the valid rows of every sequence, and the loss is their sum over N (Megatron's b "
                                       "sq rows; packed sequences as one batch)";
  if (t.target == "served-layers") {
    g.manifest["train"]["kl_form"] = t.kl_form;
    g.manifest["train"]["kl_form_meaning"] =
        t.kl_form == "kl-of-mean"
            ? "indexer_loss.kl and .loss hold KL(p-bar || q), p-bar the mean of the served layers' targets; the definition "
              "mean_j KL(p_j || q) exceeds it by H(p-bar) - mean_j H(p_j) per row, a constant without gradient (diff "
              "--precision kl=mean-of-kl judges a loss of that form)"
            : "indexer_loss.kl and .loss hold mean_j KL(p_j || q) over the served layers' targets p_j; KL(p-bar || q) is "
              "below it by H(p-bar) - mean_j H(p_j) per row, a constant without gradient (diff --precision kl=kl-of-mean "
              "judges a loss of that form)";
  }
  if (t.edges)
    g.manifest["train"]["edges"] = "attention indices of rows 0-6 rewritten as an attention-edge set's (all -1, leading and "
                                   "middle -1, indices >= s_kv and INT_MIN, a duplicate, attn.topk_length 3 and 0); rows "
                                   "7-8 have an empty indexer window (ke = ks): no keys, not counted in N";
  return g;
}

const kreg::Kernel& check_train_kernel(const std::string& name, const Problem& p, const TrainSpec& t) {
  const kreg::Kernel& k = kreg::kernel(name);
  require(k.kind == "train", "golden --kind train --for " + k.name + ": " + k.name + " writes a " + k.kind +
                                 " set, not a train set (the training kernels: tilelang-sparse-mla-bwd, megatron-dsa-indexer-loss)");
  std::vector<std::string> bad = kreg::violations(k, p);
  if (p.n_seqs > 1)  // both kernels mask causally with one sequence's queries aligned to its keys at 0
    bad.push_back("nseq" + std::to_string(p.n_seqs) + ": " + k.name + " takes one sequence per call (nseq1)");
  if (k.name == "megatron-dsa-indexer-loss" && t.target != "own-layer")
    bad.push_back("--train-target " + t.target + ": " + k.name + " takes own-layer (the Full layer's own attention is the teacher)");
  std::string msg;
  for (const std::string& b : bad) msg += (msg.empty() ? "" : "; ") + b;
  require(msg.empty(), "golden --for: " + msg);
  return k;
}

void for_train_kernel(GoldenSet& set, const kreg::Kernel& k, const Problem& p, const TrainSpec& t) {
  for_kernel(set, k, p);
  nlohmann::json& kw = set.manifest["kernel"]["kwargs"];
  if (kw.contains("loss_coeff")) kw["loss_coeff"] = t.loss_coeff;
  if (kw.contains("sparse_loss")) kw["sparse_loss"] = t.sparse;
}

}  // namespace indexshare::golden
