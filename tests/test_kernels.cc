// The registry of GPU kernels (tools/lib/kernel_registry.h) and `golden --for`: every constraint is
// refused with its message, and a set written for a kernel holds every argument the manifest's
// `kernel` block names, with the block's dtype and shape.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "ref/problem.h"
#include "tests/cli_util.h"
#include "tools/lib/golden.h"
#include "tools/lib/golden_model1.h"
#include "tools/lib/kernel_registry.h"

using namespace indexshare;

namespace {

// A problem every registered kernel accepts: h_q 64, d_qk 576, d_v 512, top-k 128, a 64 x 128 FP8
// indexer, two sequences with next_n = 2.
const char* kValid = "sq4 skv512 hq64 dqk576 dv512 ih64 id128 k128 seed3 nseq2";
// The MODEL1 kernels: the prefill takes d_qk 512 with a sink; the decode a model1 spec
// (tools/lib/golden_model1.h; its constraints are golden::model1_violations, tested in test_paged_model1.cc).
std::string valid_problem(const kreg::Kernel& k) {
  if (k.name == "flashmla-sparse-prefill-model1") return "sq4 skv512 hq64 dqk512 dv512 ih64 id128 k128 seed3 nseq2 sink=random";
  if (k.kind == "decode-model1") return "model1 b2 nextn2 hq64 len300 win128 blk256 ek128 eblk2 elen260 seed3";
  // The training kernels: one sequence whose every token is a query row, the bf16 indexer.
  if (k.kind == "train") return "sq128 skv128 hq64 dqk576 dv512 ih64 id128 k64 seed3 indexer=bf16";
  return kValid;
}

// Sets `field` of p to a value outside what `c` allows (and its condition's field to its value).
void violate(Problem& p, const kreg::Constraint& c) {
  if (!c.when_field.empty()) {
    REQUIRE(c.when_field == "h_q");
    p.h_q = c.when_value;
  }
  const std::map<std::string, std::function<void()>> set = {
      {"h_q", [&] { p.h_q = 16; }},
      {"d_qk", [&] { p.d_qk = 640; }},
      {"d_v", [&] { p.d_v = 256; }},
      {"topk", [&] { p.index_topk = c.multiple_of == 128 && !c.when_field.empty() ? 192 : 96; }},
      {"index_n_heads", [&] { p.index_n_heads = 4; }},
      {"index_head_dim", [&] { p.index_head_dim = 16; }},
      {"next_n", [&] { p.s_q = 6; }},
      {"indexer_fp8", [&] { p.indexer = IndexerMode::bf16; }},
      {"sink", [&] { p.sink = SinkMode::none; }},
      {"indexer_bf16", [&] { p.indexer = IndexerMode::fp8; }},
      {"q_offset", [&] { p.s_q = p.s_kv / 2; }},
  };
  REQUIRE_MESSAGE(set.count(c.field), "no violation written for field " << c.field);
  set.at(c.field)();
}

}  // namespace

TEST_CASE("kernels: every constraint of every registered kernel is refused alone, with its message") {
  int checked = 0;
  for (const kreg::Kernel& k : kreg::kernels()) {
    CAPTURE(k.name);
    if (k.kind == "decode-model1") continue;  // a model1 spec, not a problem (see valid_problem)
    const Problem ok = parse_problem(valid_problem(k));
    CHECK(kreg::violations(k, ok).empty());
    for (const kreg::Constraint& c : k.constraints) {
      CAPTURE(c.field);
      Problem p = ok;
      violate(p, c);
      const std::vector<std::string> v = kreg::violations(k, p);
      REQUIRE(v.size() == 1);
      CHECK(v[0].find(k.name + " takes ") != std::string::npos);
      CHECK(v[0].find(c.field == "indexer_fp8" ? "indexer=bf16" : c.field == "indexer_bf16" ? "indexer=fp8" : c.field + " ") == 0);
      CHECK(v[0].find(c.source) != std::string::npos);
      ++checked;
    }
  }
  CHECK(checked >= 27);
  // The example, through the CLI: exit 2, nothing written.
  const std::string out = (std::filesystem::temp_directory_path() / ("indexshare-kernels-" + std::to_string(::getpid()))).string();
  const auto r = testing::run_cli("golden --problem \"sq8 skv512 hq16 k128\" --for flashmla-sparse-prefill-sm90 --out " + out);
  CHECK(r.status == 2);
  CHECK(r.out.find("h_q 16: flashmla-sparse-prefill-sm90 takes 64 or 128") != std::string::npos);
  CHECK(!std::filesystem::exists(out));
  const auto u = testing::run_cli("golden --problem \"sq8 skv512 hq64 k128\" --for flashmla-sparse-prefill-sm91 --out " + out);
  CHECK(u.status == 2);
  CHECK(u.out.find("unknown kernel 'flashmla-sparse-prefill-sm91'") != std::string::npos);
  const auto l = testing::run_cli("kernels");
  CHECK(l.status == 0);
  for (const kreg::Kernel& k : kreg::kernels()) CHECK(l.out.find(k.name) != std::string::npos);
}

TEST_CASE("kernels: a set written --for a kernel holds every argument its manifest block names, as named") {
  const std::string dir = (std::filesystem::temp_directory_path() / ("indexshare-kernels-set-" + std::to_string(::getpid()))).string();
  for (const kreg::Kernel& k : kreg::kernels()) {
    CAPTURE(k.name);
    const std::string problem = k.kind == "decode-model1" ? valid_problem(k) : valid_problem(k) + " nl2 sched=FS";
    const auto r = testing::run_cli("golden --problem \"" + problem + "\" --impl simd --for " + k.name + " --force --out " + dir);
    REQUIRE_MESSAGE(r.status == 0, r.out);
    const golden::Loaded g = golden::read(dir);
    REQUIRE(g.manifest.contains("kernel"));
    const nlohmann::json& kb = g.manifest["kernel"];
    CHECK(kb["name"] == k.name);
    CHECK(g.manifest["kind"] == k.kind);
    CHECK(g.manifest["replay"].get<std::string>().find("--for " + k.name) != std::string::npos);
    // The layers: every layer for attention kernels, the Full layers for the indexer kernels.
    std::vector<int> want;
    for (const auto& l : g.manifest["layers"])
      if (!k.per_full_layer || l["kind"] == "full") want.push_back(l["index"].get<int>());
    CHECK(kb["layers"].get<std::vector<int>>() == want);
    int args = 0;
    for (const char* part : {"args", "outputs"})
      for (const nlohmann::json& a : kb[part]) {
        CAPTURE(a["name"].get<std::string>());
        for (int l : want) {
          std::string name = a["tensor"];
          if (const auto at = name.find("{l}"); at != std::string::npos) name.replace(at, 3, std::to_string(l));
          const io::TensorView* v = g.find(name);
          if (!v) { CHECK(a["optional"].get<bool>()); continue; }
          const std::vector<int64_t> shape = a["shape"];
          int64_t want_n = 1, got_n = 1;
          for (int64_t d : shape) want_n *= d;
          for (int64_t d : v->shape) got_n *= d;
          // A view or a transpose (the same elements, reshaped or reordered) holds the same number.
          if (a["view"].get<bool>() || a.contains("transpose")) CHECK(got_n == want_n);
          else CHECK(std::vector<int64_t>(v->shape.begin(), v->shape.end()) == shape);
          // Outputs may be written in another dtype (attn.out F32 in the set, bf16 from the kernel).
          if (std::string(part) == "args") CHECK(io::dtype_name(v->dtype) == a["dtype"].get<std::string>());
          ++args;
        }
      }
    CHECK(args >= 4);
    if (kb["kwargs"].contains("sm_scale")) CHECK(kb["kwargs"]["sm_scale"].get<float>() == g.manifest["config"]["sm_scale"].get<float>());
  }
  std::filesystem::remove_all(dir);
}

// ---- kernel presets ------------------------------------------------------------------------------
// One preset per registered kernel, at the kernel's real shapes; only its manifest is checked in
// (golden/kernels/NAME/manifest.json, hashes included). The checks below re-derive every constraint
// of the kernel from the set's tensors (names, dtypes, shapes as the manifest's tensor list gives
// them) with the numbers written out here from the kernels' own sources (FlashMLA's and DeepGEMM's csrc and tests), not through kreg::violations.

namespace {

struct TensorInfo {
  std::string dtype;
  std::vector<int64_t> shape;
};
using TensorList = std::map<std::string, TensorInfo>;

TensorList tensor_list(const nlohmann::json& manifest) {
  TensorList t;
  for (const nlohmann::json& e : manifest["tensors"])
    t[e["name"].get<std::string>()] = {e["dtype"].get<std::string>(), e["shape"].get<std::vector<int64_t>>()};
  return t;
}

bool in(int64_t v, std::initializer_list<int64_t> set) { return std::find(set.begin(), set.end(), v) != set.end(); }

// Every constraint of `kernel`, from the tensors: what FlashMLA / DeepGEMM assert on their inputs.
// Returns one line per broken fact (empty: the set fits the kernel).
std::vector<std::string> kernel_problems(const std::string& kernel, const TensorList& t) {
  std::vector<std::string> bad;
  auto need = [&](bool ok, const std::string& what) { if (!ok) bad.push_back(what); };
  auto get = [&](const std::string& n) -> TensorInfo {
    if (!t.count(n)) { bad.push_back("missing tensor " + n); return {"?", {0, 0, 0, 0}}; }
    return t.at(n);
  };
  auto rank = [&](const TensorInfo& v, size_t r, const std::string& n) {
    need(v.shape.size() == r, n + " rank " + std::to_string(v.shape.size()));
    return v.shape.size() == r;
  };
  if (kernel == "tilelang-sparse-mla-bwd") {
    // sparse_mla_bwd.py: q [B, S, H, 576], kv [B, S_kv, 1, 576], o / do [B, S, H, 512] bf16, indices
    // [B, S, 1, topk] int32 with topk in blocks of 64, lse [B, S, H] f32; causal only (index <= row).
    const TensorInfo q = get("layers.0.attn.q"), kv = get("layers.0.attn.kv"), o = get("layers.0.attn.out_bf16"),
                     dout = get("layers.0.attn.d_out"), ind = get("layers.0.attn.indices"), lse = get("layers.0.attn.lse"),
                     dq = get("layers.0.attn_bwd.dq"), dkv = get("layers.0.attn_bwd.dkv");
    need(q.dtype == "BF16" && kv.dtype == "BF16" && o.dtype == "BF16" && dout.dtype == "BF16", "q / kv / o / do dtype");
    need(ind.dtype == "I32" && lse.dtype == "F32", "indices / lse dtype");
    if (!rank(q, 3, "q") || !rank(kv, 3, "kv") || !rank(ind, 3, "indices") || !rank(dout, 3, "do")) return bad;
    const int64_t s = q.shape[0], h_q = q.shape[1];
    need(in(h_q, {64, 128}), "h_q " + std::to_string(h_q));
    need(q.shape[2] == 576 && kv.shape[2] == 576, "d_qk " + std::to_string(q.shape[2]));
    need(kv.shape[1] == 1, "kv_group " + std::to_string(kv.shape[1]));
    need(dout.shape == std::vector<int64_t>{s, h_q, 512} && o.shape == dout.shape, "do / o not [s_q, h_q, 512]");
    need(ind.shape[0] == s && ind.shape[1] == 1 && ind.shape[2] % 64 == 0, "topk " + std::to_string(ind.shape[2]));
    need(lse.shape == std::vector<int64_t>{s, h_q}, "lse not [s_q, h_q]");
    need(kv.shape[0] == s, "causal: s_q " + std::to_string(s) + " != s_kv " + std::to_string(kv.shape[0]));
    need(dq.shape == q.shape && dkv.shape == kv.shape, "dq / dkv shapes");
    return bad;
  }
  if (kernel == "megatron-dsa-indexer-loss") {
    // dsa_indexer_loss.py: the bf16 indexer's q [sq, H, D], k [skv, D], weights [sq, H] f32, top-k
    // [sq, topk]; the teacher's q / kv; causal over [sq, skv] (sq = skv); loss and grads.
    const TensorInfo q = get("layers.0.indexer.q"), k = get("layers.0.indexer.k"), w = get("layers.0.indexer.weights"),
                     tk = get("layers.0.indexer.topk"), aq = get("layers.0.attn.q"), akv = get("layers.0.attn.kv"),
                     loss = get("layers.0.indexer_loss.loss"), dq = get("layers.0.indexer_loss.dq"),
                     dk = get("layers.0.indexer_loss.dk"), dw = get("layers.0.indexer_loss.dw");
    need(q.dtype == "BF16" && k.dtype == "BF16", "indexer q / k dtype " + q.dtype);
    need(w.dtype == "F32" && tk.dtype == "I32", "weights / topk dtype");
    if (!rank(q, 3, "indexer q") || !rank(k, 2, "indexer k") || !rank(aq, 3, "attn q")) return bad;
    const int64_t s = q.shape[0];
    need(k.shape[0] == s && akv.shape[0] == s, "causal: s_q " + std::to_string(s) + " != s_kv " + std::to_string(k.shape[0]));
    need(k.shape[1] == q.shape[2] && w.shape == std::vector<int64_t>{s, q.shape[1]}, "k / weights shapes");
    need(aq.shape[0] == s, "teacher q rows");
    need(loss.shape == std::vector<int64_t>{1} && dq.shape == q.shape && dk.shape == k.shape && dw.shape == w.shape,
         "loss / dq / dk / dw shapes");
    return bad;
  }
  if (kernel.rfind("flashmla-sparse-prefill", 0) == 0) {
    const TensorInfo q = get("layers.0.attn.q"), kv = get("layers.0.attn.kv"), ind = get("layers.0.attn.indices"),
                     out = get("layers.0.attn.out");
    need(q.dtype == "BF16", "q dtype");
    need(kv.dtype == "BF16", "kv dtype");
    need(ind.dtype == "I32", "indices dtype");
    if (!rank(q, 3, "q") || !rank(kv, 3, "kv") || !rank(ind, 3, "indices") || !rank(out, 3, "out")) return bad;
    const int64_t h_q = q.shape[1], d_qk = q.shape[2], topk = ind.shape[2];
    need(in(h_q, {64, 128}), "h_q " + std::to_string(h_q));  // sparse_fwd.h
    need(in(d_qk, {576, 512}), "d_qk " + std::to_string(d_qk));
    need(kv.shape[1] == 1, "h_kv " + std::to_string(kv.shape[1]));
    need(kv.shape[2] == d_qk, "kv d_qk");
    need(ind.shape[0] == q.shape[0] && ind.shape[1] == 1, "indices [s_q, 1, topk]");
    need(out.shape[2] == 512, "d_v " + std::to_string(out.shape[2]));
    const int64_t mult = kernel == "flashmla-sparse-prefill-sm90" ? 128 : h_q == 128 ? 128 : 64;  // sm90 phase1 / sm100 head64, head128
    need(topk % mult == 0, "topk " + std::to_string(topk) + " not a multiple of " + std::to_string(mult));
    if (kernel == "flashmla-sparse-prefill-model1") {  // MODEL1: d_qk 512 = d_v 512, with the sink
      need(d_qk == 512, "MODEL1 d_qk " + std::to_string(d_qk));
      need(t.count("layers.0.attn.sink") && t.at("layers.0.attn.sink").shape == std::vector<int64_t>{h_q}, "attn_sink not [h_q]");
    }
  } else if (kernel == "flashmla-sparse-decode-model1") {
    // flash_mla_with_kvcache with extra_k_cache: q [b, s_q, h_q, 512], both caches the MODEL1 bytes
    // (blocks of ceil(584 B / 576) * 576 bytes), indices [b, s_q, topk] with topk % 64 == 0 in both scopes.
    const TensorInfo q = get("layers.0.attn.q"), kc = get("layers.0.attn.model1.k_cache"), xc = get("layers.0.attn.model1.extra_k_cache"),
                     ind = get("layers.0.attn.model1.indices"), xind = get("layers.0.attn.model1.extra_indices"),
                     tl = get("layers.0.attn.model1.topk_length"), xtl = get("layers.0.attn.model1.extra_topk_length");
    need(q.dtype == "BF16" && kc.dtype == "U8" && xc.dtype == "U8" && ind.dtype == "I32" && xind.dtype == "I32", "dtypes");
    if (!rank(q, 3, "q") || !rank(kc, 2, "k_cache") || !rank(xc, 2, "extra_k_cache") || !rank(ind, 3, "indices") ||
        !rank(xind, 3, "extra_indices"))
      return bad;
    const int64_t b = ind.shape[0], next_n = ind.shape[1];
    need(in(q.shape[1], {64, 128}), "h_q " + std::to_string(q.shape[1]));
    need(q.shape[0] == b * next_n && q.shape[2] == 512, "q not [b * next_n, h_q, 512]");
    need(xind.shape[0] == b && xind.shape[1] == next_n, "extra indices not [b, next_n, extra_topk]");
    need(ind.shape[2] % 64 == 0, "topk " + std::to_string(ind.shape[2]) + " not a multiple of 64");
    need(xind.shape[2] % 64 == 0, "extra topk " + std::to_string(xind.shape[2]) + " not a multiple of 64");
    need(tl.shape == std::vector<int64_t>{b} && xtl.shape == std::vector<int64_t>{b}, "topk_length not [b]");
    auto padded = [](int64_t bytes) { return bytes % 576 == 0 && bytes >= 584; };
    need(padded(kc.shape[1]), "k_cache block bytes " + std::to_string(kc.shape[1]) + " not padded to 576");
    need(padded(xc.shape[1]), "extra_k_cache block bytes " + std::to_string(xc.shape[1]) + " not padded to 576");
  } else if (kernel == "flashmla-sparse-decode") {
    const TensorInfo q = get("layers.0.attn.q"), cache = get("layers.0.attn.kv_cache_fp8"),
                     ind = get("layers.0.attn.indices_physical"), out = get("layers.0.attn.out");
    need(q.dtype == "BF16", "q dtype");
    need(cache.dtype == "U8", "k_cache dtype");
    need(ind.dtype == "I32", "indices dtype");
    if (!rank(q, 3, "q") || !rank(cache, 4, "k_cache") || !rank(ind, 3, "indices") || !rank(out, 3, "out")) return bad;
    const int64_t b = ind.shape[0], next_n = ind.shape[1], topk = ind.shape[2];
    need(q.shape[0] == b * next_n && q.shape[2] == 576, "q not [b * next_n, h_q, 576]");
    need(cache.shape[1] == 64 && cache.shape[2] == 1, "k_cache not [num_blocks, 64, 1, ...]");
    need(cache.shape[3] == 512 + 4 * 4 + 64 * 2, "k_cache bytes per token " + std::to_string(cache.shape[3]));  // V32: 656
    need(topk % 64 == 0, "topk " + std::to_string(topk) + " not a multiple of 64");
    need(out.shape[2] == 512, "d_v " + std::to_string(out.shape[2]));
  } else {
    const bool paged = kernel == "deepgemm-fp8-paged-mqa-logits";
    const TensorInfo q = get("layers.0.indexer.q"), w = get("layers.0.indexer.weights");
    need(q.dtype == "F8_E4M3", "indexer q dtype " + q.dtype);
    need(w.dtype == "F32", "weights dtype");
    if (!rank(q, 3, "indexer q") || !rank(w, 2, "weights")) return bad;
    const int64_t H = q.shape[1], D = q.shape[2];
    if (kernel == "deepgemm-fp8-mqa-logits-sm100") {
      need(in(H, {8, 16, 32, 64}), "H " + std::to_string(H));
      need(in(D, {32, 64, 128}), "D " + std::to_string(D));
    } else {
      need(in(H, {32, 64}), "H " + std::to_string(H));
      need(D == 128, "D " + std::to_string(D));
    }
    need(w.shape == std::vector<int64_t>{q.shape[0], H}, "weights not [rows, H]");
    if (!paged) {
      const TensorInfo k = get("layers.0.indexer.k"), ksc = get("layers.0.indexer.k_scale"), ks = get("layers.0.indexer.ks"),
                       ke = get("layers.0.indexer.ke");
      need(k.dtype == "F8_E4M3", "kv dtype");
      need(ksc.dtype == "F32", "kv_scale dtype");
      need(k.shape == std::vector<int64_t>{ksc.shape[0], D}, "kv not [s_kv, D]");
      need(ks.dtype == "I32" && ke.dtype == "I32", "ks / ke dtype");
      need(ks.shape == std::vector<int64_t>{q.shape[0]} && ke.shape == ks.shape, "ks / ke not [s_q]");
    } else {
      const TensorInfo cache = get("layers.0.indexer.k_cache"), cl = get("context_lens"), bt = get("block_table");
      need(cache.dtype == "U8", "kv_cache dtype");
      need(cache.shape.size() == 4 && cache.shape[1] == 64 && cache.shape[2] == 1 && cache.shape[3] == D + 4,
           "kv_cache not [num_blocks, 64, 1, D + 4]");
      need(cl.dtype == "I32", "context_lens dtype");
      if (!rank(cl, 2, "context_lens")) return bad;  // the 2-D form [b, next_n]
      need(in(cl.shape[1], {1, 2}), "next_n " + std::to_string(cl.shape[1]));
      need(cl.shape[0] * cl.shape[1] == q.shape[0], "q rows != b * next_n");
      need(bt.dtype == "I32" && !bt.shape.empty() && bt.shape[0] == cl.shape[0], "block_table not I32 [b, ...]");
    }
  }
  return bad;
}

// The kernel block: every argument and output names a tensor of the set (per listed layer), with the
// block's dtype (arguments) and shape (or, for a view, the same number of elements).
void check_kernel_block(const nlohmann::json& kb, const TensorList& t) {
  int n = 0;
  for (const char* part : {"args", "outputs"})
    for (const nlohmann::json& a : kb[part])
      for (const nlohmann::json& l : kb["layers"]) {
        std::string name = a["tensor"];
        CAPTURE(name);
        if (const auto at = name.find("{l}"); at != std::string::npos) name.replace(at, 3, std::to_string(l.get<int>()));
        if (!t.count(name)) { CHECK(a["optional"].get<bool>()); continue; }
        const TensorInfo& v = t.at(name);
        const std::vector<int64_t> shape = a["shape"];
        int64_t want = 1, got = 1;
        for (int64_t d : shape) want *= d;
        for (int64_t d : v.shape) got *= d;
        if (a["view"].get<bool>() || a.contains("transpose")) CHECK(got == want);
        else CHECK(v.shape == shape);
        if (std::string(part) == "args") CHECK(v.dtype == a["dtype"].get<std::string>());
        ++n;
      }
  CHECK(n >= 4);
}

TEST_CASE("kernels: MODEL1 decode's lse is a transpose of the set's, not a view") {
  const kreg::Kernel& k = kreg::kernel("flashmla-sparse-decode-model1");
  const auto lse = std::find_if(k.outputs.begin(), k.outputs.end(), [](const kreg::Arg& a) { return a.name == "lse"; });
  REQUIRE(lse != k.outputs.end());
  CHECK_FALSE(lse->view);
  CHECK(lse->transpose == std::pair<int, int>{1, 2});
}

std::string kernel_manifest_path(const std::string& name) {
  return std::string(INDEXSHARE_SOURCE_DIR) + "/golden/kernels/" + name + "/manifest.json";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot read " << path);
  return nlohmann::json::parse(f);
}

}  // namespace

TEST_CASE("kernels: one preset per kernel at its real shapes, each checked-in manifest satisfying its kernel") {
  std::set<std::string> served;
  for (const golden::Preset& pr : golden::presets()) {
    if (pr.kernel.empty()) continue;
    CAPTURE(pr.name);
    CHECK(pr.name == pr.kernel);  // named after the kernel
    CHECK(served.insert(pr.kernel).second);
    const nlohmann::json m = read_json(kernel_manifest_path(pr.name));
    REQUIRE(m.contains("kernel"));
    CHECK(m["kernel"]["name"] == pr.kernel);
    CHECK(m["kind"] == pr.kind);
    const bool model1 = pr.kind == "decode-model1";  // a model1 spec (tools/lib/golden_model1.h), not a descriptor
    CHECK(m["problem"] == (model1 ? golden::to_string(golden::parse_model1_spec(pr.problem)) : to_string(parse_problem(pr.problem))));
    const TensorList t = tensor_list(m);
    const std::vector<std::string> bad = kernel_problems(pr.kernel, t);
    CHECK_MESSAGE(bad.empty(), (bad.empty() ? std::string() : bad[0]));
    check_kernel_block(m["kernel"], t);
    for (const nlohmann::json& e : m["tensors"]) CHECK(e["sha256"].get<std::string>().size() == 64);
    // The real shapes: prefill top-2048 over 8192 keys; decode next_n 2 over several
    // paged sequences; DeepGEMM at H 64, D 128.
    if (model1) {  // FlashMLA's MODEL1 decode config: main top-k 128 in blocks of 256, extra top-512 in blocks of 64
      CHECK(t.at("layers.0.attn.model1.indices").shape == std::vector<int64_t>{8, 2, 128});
      CHECK(t.at("layers.0.attn.model1.extra_indices").shape[2] == 512);
      CHECK(t.at("layers.0.attn.model1.k_cache").shape[1] == 149760);      // B = 256
      CHECK(t.at("layers.0.attn.model1.extra_k_cache").shape[1] == 37440); // B = 64
      CHECK(m["kernel"]["views"]["k_cache"]["strides_bytes"] == nlohmann::json({149760, 584, 584, 1}));
      continue;
    }
    const Problem p = parse_problem(pr.problem);
    if (pr.kind == "train") {  // the kernels' causal masks: every token a query row, a few hundred of them
      CHECK(m["replay"].get<std::string>().find("--kind train --for " + pr.kernel) != std::string::npos);
      CHECK(p.s_q == p.s_kv);
      CHECK(p.s_q <= 256);
      CHECK(t.at("layers.0.attn.q").shape == std::vector<int64_t>{p.s_q, 64, 576});
      continue;
    }
    if (pr.kernel.rfind("flashmla-sparse-prefill", 0) == 0) {
      CHECK(t.at("layers.0.attn.indices").shape[2] == 2048);
      CHECK(t.at("layers.0.attn.kv").shape[0] == 8192);
    }
    if (pr.kind == "decode") {
      CHECK(t.at("layers.0.attn.indices_physical").shape[1] == 2);
      CHECK(t.at("layers.0.attn.indices_physical").shape[0] >= 3);
    }
    if (pr.kernel.rfind("deepgemm", 0) == 0) {
      CHECK(t.at("layers.0.indexer.q").shape[1] == 64);
      CHECK(t.at("layers.0.indexer.q").shape[2] == 128);
    }
    CHECK(p.s_q <= 16);  // few query rows: quick to regenerate
  }
  // Every registered kernel has its preset; the prefill presets cover h_q 64 and 128.
  for (const kreg::Kernel& k : kreg::kernels()) CHECK_MESSAGE(served.count(k.name), "no preset serves " << k.name);
  CHECK(parse_problem(golden::preset("flashmla-sparse-prefill-sm90").problem).h_q == 64);
  CHECK(parse_problem(golden::preset("flashmla-sparse-prefill-sm100").problem).h_q == 128);
  // `indexshare presets` says which kernel each serves.
  const auto r = testing::run_cli("presets");
  CHECK(r.status == 0);
  for (const std::string& k : served) CHECK(r.out.find("serves kernel " + k) != std::string::npos);
}

TEST_CASE("kernels: the independent constraint checks fail a set that breaks one constraint") {
  // Each fault, applied to the kernel preset's checked-in tensor list, must be named.
  struct Fault {
    const char* kernel;
    std::function<void(TensorList&)> apply;
    const char* named;
  };
  const std::vector<Fault> faults = {
      {"flashmla-sparse-prefill-sm90", [](TensorList& t) { t["layers.0.attn.q"].shape[1] = 32; }, "h_q 32"},
      {"flashmla-sparse-prefill-sm90", [](TensorList& t) { t["layers.0.attn.indices"].shape[2] = 2048 - 64; }, "topk 1984"},
      {"flashmla-sparse-prefill-sm100", [](TensorList& t) { t["layers.0.attn.indices"].shape[2] = 2048 - 64; }, "topk 1984"},
      {"flashmla-sparse-prefill-sm100", [](TensorList& t) { t["layers.0.attn.out"].shape[2] = 256; }, "d_v 256"},
      {"flashmla-sparse-prefill-sm90", [](TensorList& t) { t["layers.0.attn.kv"].dtype = "F32"; }, "kv dtype"},
      {"flashmla-sparse-decode", [](TensorList& t) { t["layers.0.attn.kv_cache_fp8"].shape[3] = 584; }, "bytes per token 584"},
      {"flashmla-sparse-decode", [](TensorList& t) { t["layers.0.attn.indices_physical"].shape[2] = 2000; }, "topk 2000"},
      {"flashmla-sparse-decode-model1", [](TensorList& t) { t["layers.0.attn.model1.k_cache"].shape[1] = 584 * 256; },
       "k_cache block bytes 149504"},
      {"flashmla-sparse-decode-model1", [](TensorList& t) { t["layers.0.attn.model1.extra_indices"].shape[2] = 500; }, "extra topk 500"},
      {"flashmla-sparse-decode-model1", [](TensorList& t) { t["layers.0.attn.q"].shape[1] = 32; }, "h_q 32"},
      {"flashmla-sparse-prefill-model1", [](TensorList& t) { t.erase("layers.0.attn.sink"); }, "attn_sink"},
      {"deepgemm-fp8-mqa-logits-sm90", [](TensorList& t) { t["layers.0.indexer.q"].shape[1] = 16; }, "H 16"},
      {"deepgemm-fp8-mqa-logits-sm100", [](TensorList& t) { t["layers.0.indexer.q"].shape[2] = 96; }, "D 96"},
      {"deepgemm-fp8-mqa-logits-sm90", [](TensorList& t) { t["layers.0.indexer.q"].dtype = "BF16"; }, "indexer q dtype BF16"},
      {"deepgemm-fp8-paged-mqa-logits", [](TensorList& t) { t["context_lens"].shape = {t["context_lens"].shape[0] * 2}; },
       "context_lens rank 1"},
      {"deepgemm-fp8-paged-mqa-logits", [](TensorList& t) { t.erase("context_lens"); }, "missing tensor context_lens"},
      {"deepgemm-fp8-paged-mqa-logits", [](TensorList& t) { t["layers.0.indexer.k_cache"].shape[1] = 32; }, "kv_cache not"},
      {"tilelang-sparse-mla-bwd", [](TensorList& t) { t["layers.0.attn.indices"].shape[2] = 100; }, "topk 100"},
      {"tilelang-sparse-mla-bwd", [](TensorList& t) { t["layers.0.attn.q"].shape[1] = 16; }, "h_q 16"},
      {"tilelang-sparse-mla-bwd", [](TensorList& t) { t["layers.0.attn.kv"].shape[0] = 512; }, "causal: s_q 256 != s_kv 512"},
      {"tilelang-sparse-mla-bwd", [](TensorList& t) { t.erase("layers.0.attn.d_out"); }, "missing tensor layers.0.attn.d_out"},
      {"megatron-dsa-indexer-loss", [](TensorList& t) { t["layers.0.indexer.q"].dtype = "F8_E4M3"; }, "indexer q / k dtype F8_E4M3"},
      {"megatron-dsa-indexer-loss", [](TensorList& t) { t.erase("layers.0.indexer_loss.dw"); }, "missing tensor layers.0.indexer_loss.dw"},
  };
  for (const Fault& f : faults) {
    CAPTURE(f.kernel);
    CAPTURE(f.named);
    TensorList t = tensor_list(read_json(kernel_manifest_path(f.kernel)));
    REQUIRE(kernel_problems(f.kernel, t).empty());
    f.apply(t);
    const std::vector<std::string> bad = kernel_problems(f.kernel, t);
    REQUIRE(!bad.empty());
    CHECK(bad[0].find(f.named) != std::string::npos);
  }
}

namespace {
// The replay line without its --out folder.
std::string replay_sans_out(const nlohmann::json& m) {
  std::string r = m["replay"];
  return r.substr(0, r.find(" --out "));
}

// Regenerates the kernel presets of `kind` and compares each tensor's SHA-256 with the checked-in
// manifest, then reads the set's values where a constraint is about them (the paged indexer's
// context_lens against cache_seqlens and the rows' windows).
void regenerate_kernel_presets(const std::string& kind) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("indexshare-kernel-preset-" + std::to_string(::getpid()))).string();
  int n = 0;
  for (const golden::Preset& pr : golden::presets()) {
    if (pr.kernel.empty() || pr.kind != kind) continue;
    ++n;
    CAPTURE(pr.name);
    const nlohmann::json want = read_json(kernel_manifest_path(pr.name));
    const auto r = testing::run_cli("golden --preset " + pr.name + " --force --out " + dir);
    REQUIRE_MESSAGE(r.status == 0, r.out);
    const golden::Loaded g = golden::read(dir);  // verifies every tensor against the new manifest
    const nlohmann::json& got = g.manifest;
    std::map<std::string, std::string> a, b;
    for (const nlohmann::json& e : want["tensors"]) a[e["name"]] = e["dtype"].get<std::string>() + e["shape"].dump() + e["sha256"].get<std::string>();
    for (const nlohmann::json& e : got["tensors"]) b[e["name"]] = e["dtype"].get<std::string>() + e["shape"].dump() + e["sha256"].get<std::string>();
    CHECK(a == b);
    CHECK(got["kernel"] == want["kernel"]);
    CHECK(got["config"] == want["config"]);
    CHECK(replay_sans_out(got) == replay_sans_out(want));
    const std::vector<std::string> bad = kernel_problems(pr.kernel, tensor_list(got));
    CHECK_MESSAGE(bad.empty(), (bad.empty() ? std::string() : bad[0]));
    if (pr.kernel == "deepgemm-fp8-paged-mqa-logits") {
      // context_lens[b, j] = cache_seqlens[b] - next_n + j + 1, and row b * next_n + j's window
      // [ks, ke) holds exactly context_lens[b, j] keys of sequence b.
      const Tensor<int32_t> cl = g.tensor<int32_t>("context_lens"), lens = g.tensor<int32_t>("cache_seqlens"),
                            ks = g.tensor<int32_t>("layers.0.indexer.ks"), ke = g.tensor<int32_t>("layers.0.indexer.ke"),
                            cu = g.tensor<int32_t>("cu_seqlens_k");
      const int64_t B = cl.dim(0), next_n = cl.dim(1);
      for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t j = 0; j < next_n; ++j) {
          CHECK(cl.at(bb, j) == lens[bb] - next_n + j + 1);
          CHECK(ks[bb * next_n + j] == cu[bb]);
          CHECK(ke[bb * next_n + j] - ks[bb * next_n + j] == cl.at(bb, j));
        }
    }
  }
  std::filesystem::remove_all(dir);
  CHECK(n >= (kind == "decode-model1" ? 1 : 2));
}
}  // namespace

// The stack kernel presets (prefill, DeepGEMM fp8_mqa_logits): about 3 s on the 2-core machine.
TEST_CASE("kernels: the stack kernel presets regenerate to their checked-in manifests' hashes") {
  regenerate_kernel_presets("stack");
}

// The MODEL1 decode preset (two paged caches, 0.4 s).
TEST_CASE("kernels: the decode-model1 kernel preset regenerates to its checked-in manifest's hashes") {
  regenerate_kernel_presets("decode-model1");
}

// The training kernel presets (kind train: TileLang's sparse MLA backward, Megatron's indexer loss).
TEST_CASE("kernels: the train kernel presets regenerate to their checked-in manifests' hashes") {
  regenerate_kernel_presets("train");
}

// The decode kernel presets (16384 keys in paged caches): about 5.5 s on 2 cores, so the `slow`
// tier (tests/README.md): build/indexshare_tests -tc='kernels: slow:*' --no-skip
TEST_CASE("kernels: slow: the decode kernel presets regenerate to their checked-in manifests' hashes" * doctest::skip()) {
  regenerate_kernel_presets("decode");
}

// ---- context_lens and clean_logits=False ---------------------------------------------------------

namespace {
// A small set for the paged indexer: two sequences of 128 tokens, next_n 2, H 32.
struct PagedSet {
  Problem p = parse_problem("sq4 skv256 hq2 dqk576 dv512 ih32 id128 k64 seed9 nseq2");
  golden::GoldenSet set;
  PagedSet() {
    set = golden::build(p, "decode", true, "test");
    golden::for_kernel(set, kreg::kernel("deepgemm-fp8-paged-mqa-logits"), p);
  }
  io::TensorView& tensor(const std::string& name) {
    for (io::TensorView& v : set.tensors)
      if (v.name == name) return v;
    FAIL("no tensor " << name);
    return set.tensors[0];
  }
};

std::string temp_dir(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("indexshare-kernels-" + tag + "-" + std::to_string(::getpid()))).string();
}
}  // namespace

TEST_CASE("kernels: context_lens is the paged indexer's 2-D form, held exactly when the kernel block names it, checked by verify") {
  const std::string dir = temp_dir("ctx");
  {
    PagedSet s;
    golden::write(dir, s.set, true);
    const golden::Loaded g = golden::read(dir);
    const Tensor<int32_t> cl = g.tensor<int32_t>("context_lens");
    REQUIRE(cl.shape == Shape{2, 2});
    // cache_seqlens 128 each, next_n 2: rows see 127 and 128 keys.
    CHECK(cl.data == std::vector<int32_t>{127, 128, 127, 128});
  }
  {  // without the logits (--no-logits) the block's logits output is optional: the set reads
    const Problem p = parse_problem("sq4 skv256 hq2 dqk576 dv512 ih32 id128 k64 seed9 nseq2");
    golden::GoldenSet set = golden::build(p, "decode", false, "test");
    golden::for_kernel(set, kreg::kernel("deepgemm-fp8-paged-mqa-logits"), p);
    golden::write(dir, set, true);
    CHECK_NOTHROW(golden::read(dir));
  }
  {  // another kernel's set (or none) holds no context_lens
    const Problem p = parse_problem("sq4 skv256 hq2 dqk576 dv512 ih32 id128 k64 seed9 nseq2");
    golden::GoldenSet set = golden::build(p, "decode", true, "test");
    golden::for_kernel(set, kreg::kernel("flashmla-sparse-decode"), p);
    for (const io::TensorView& v : set.tensors) CHECK(v.name != "context_lens");
  }
  {  // the tensor without the block naming it
    PagedSet s;
    s.set.manifest.erase("kernel");
    golden::write(dir, s.set, true);
    CHECK_THROWS_WITH_AS(golden::read(dir), doctest::Contains("names no argument 'context_lens'"), Error);
  }
  {  // the block naming it without the tensor
    PagedSet s;
    s.set.tensors.erase(std::remove_if(s.set.tensors.begin(), s.set.tensors.end(), [](const io::TensorView& v) { return v.name == "context_lens"; }),
                        s.set.tensors.end());
    golden::write(dir, s.set, true);
    CHECK_THROWS_WITH_AS(golden::read(dir), doctest::Contains("tensor 'context_lens' is missing"), Error);
  }
  {  // the block's tensors: a name the set lacks, a shape and a dtype not the tensor's, a layer outside the set
    const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> faults = {
        {[](nlohmann::json& k) { k["args"][1]["tensor"] = "layers.{l}.indexer.kv_cache"; },
         "field 'kernel.args[1]' names tensor 'layers.0.indexer.kv_cache', which the set does not hold"},
        {[](nlohmann::json& k) { k["args"][3]["shape"] = {2, 3}; }, "field 'kernel.args[3].shape' is [2,3], but tensor 'context_lens' is [2,2]"},
        {[](nlohmann::json& k) { k["args"][0]["shape"] = {2, 2, 32, 64}; }, "field 'kernel.args[0].shape'"},  // a view of another size
        {[](nlohmann::json& k) { k["args"][2]["dtype"] = "BF16"; }, "field 'kernel.args[2].dtype' is BF16, but tensor 'layers.0.indexer.weights' is F32"},
        {[](nlohmann::json& k) { k["layers"] = {0, 1}; }, "field 'kernel.layers' holds 1"},
        {[](nlohmann::json& k) { k["outputs"][0]["view"] = "yes"; }, "field 'kernel.outputs[0]' is not an object with"},
    };
    for (const auto& [apply, message] : faults) {
      CAPTURE(message);
      PagedSet s;
      apply(s.set.manifest["kernel"]);
      golden::write(dir, s.set, true);
      CHECK_THROWS_WITH_AS(golden::read(dir), doctest::Contains(message.c_str()), Error);
    }
  }
  {  // a kwargs block diff could not read
    PagedSet s;
    s.set.manifest["kernel"]["kwargs"]["clean_logits"] = "no";
    golden::write(dir, s.set, true);
    CHECK_THROWS_WITH_AS(golden::read(dir), doctest::Contains("field 'kernel.kwargs'"), Error);
  }
  {  // values other than cache_seqlens[b] - next_n + j + 1
    PagedSet s;
    s.tensor("context_lens").bytes.mutable_data()[0] += 1;  // element [0, 0]: 128 instead of 127
    golden::write(dir, s.set, true);
    CHECK_THROWS_WITH_AS(golden::read(dir), doctest::Contains("element [0, 0] is 128, expected cache_seqlens[b] - next_n + j + 1 = 127"), Error);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("kernels: diff masks the values outside the windows when the set's kernel runs with clean_logits=False") {
  const std::string dir = temp_dir("clean"), other = temp_dir("clean-other"), cand = dir + "-cand.safetensors";
  PagedSet s;
  golden::write(dir, s.set, true);
  golden::GoldenSet plain = golden::build(s.p, "decode", true, "test");  // the same numbers, no kernel block
  golden::write(other, plain, true);
  const golden::Loaded g = golden::read(dir);
  const Tensor<float> logits = g.tensor<float>("layers.0.indexer.logits");
  const Tensor<int32_t> ks = g.tensor<int32_t>("layers.0.indexer.ks"), ke = g.tensor<int32_t>("layers.0.indexer.ke");
  // What the kernel leaves outside the windows with clean_logits=False: anything, NaN included.
  Tensor<float> dirty = logits;
  int64_t outside = 0;
  for (int64_t t = 0; t < dirty.dim(0); ++t)
    for (int64_t c = 0; c < dirty.dim(1); ++c)
      if (c < ks[t] || c >= ke[t]) dirty.at(t, c) = (++outside % 3 == 0) ? std::nanf("") : 1.0e30f;
  REQUIRE(outside > 0);
  io::write_safetensors(cand, {io::make_view("layers.0.indexer.logits", dirty)});
  auto r = testing::run_cli("diff --golden " + dir + " --candidate " + cand);
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK(r.out.find(std::to_string(outside) + " values outside the rows' windows [ks, ke) set to -inf") != std::string::npos);
  CHECK(r.out.find("clean_logits=False") != std::string::npos);
  // Without the block the -inf positions must match: the same candidate fails.
  r = testing::run_cli("diff --golden " + other + " --candidate " + cand);
  CHECK(r.status == 1);
  // Inside a window nothing is masked: one wrong value there fails even with the block.
  Tensor<float> wrong = logits;
  wrong.at(1, ke[1] - 1) = wrong.at(1, ke[1] - 1) * 1.01f + 1.0f;
  io::write_safetensors(cand, {io::make_view("layers.0.indexer.logits", wrong)});
  r = testing::run_cli("diff --golden " + dir + " --candidate " + cand);
  CHECK(r.status == 1);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
  std::filesystem::remove(cand);
}

TEST_CASE("kernels: a kernel preset refuses another --for and --rows") {
  const std::string dir = temp_dir("preset-refuse");
  auto r = testing::run_cli("golden --preset flashmla-sparse-prefill-sm90 --for flashmla-sparse-prefill-sm100 --out " + dir);
  CHECK(r.status == 2);
  CHECK(r.out.find("preset 'flashmla-sparse-prefill-sm90' is written for flashmla-sparse-prefill-sm90, not --for flashmla-sparse-prefill-sm100") !=
        std::string::npos);
  r = testing::run_cli("golden --preset deepgemm-fp8-mqa-logits-sm90 --rows 0,1 --out " + dir);
  CHECK(r.status == 2);
  CHECK(r.out.find("--rows (sampled query rows) is not a kernel's input layout") != std::string::npos);
  CHECK(!std::filesystem::exists(dir));
}

// ---- training kernels: golden --kind train --for KERNEL ----------------------------------------

TEST_CASE("kernels: golden --kind train --for refuses each broken constraint by name, before writing anything") {
  const std::string dir = temp_dir("train-refuse");
  struct Case {
    std::string args;
    std::vector<std::string> named;
  };
  const std::vector<Case> cases = {
      // h_q, top-k and the causal alignment broken at once: each is listed.
      {"--problem \"sq64 skv128 hq16 dqk576 dv512 ih8 id32 k96 indexer=bf16\" --kind train --for tilelang-sparse-mla-bwd",
       {"h_q 16: tilelang-sparse-mla-bwd takes 64 or 128", "topk 96: tilelang-sparse-mla-bwd takes a multiple of 64",
        "q_offset 64: tilelang-sparse-mla-bwd takes the whole sequence as query rows (s_q = s_kv)", "sparse_mla_bwd.py"}},
      {"--problem \"sq64 skv64 hq64 dqk512 dv512 ih8 id32 k64 indexer=bf16\" --for tilelang-sparse-mla-bwd",
       {"d_qk 512: tilelang-sparse-mla-bwd takes 576"}},
      {"--problem \"sq32 skv64 hq4 dqk576 dv512 ih8 id32 k16\" --kind train --for megatron-dsa-indexer-loss",
       {"indexer=fp8: megatron-dsa-indexer-loss takes the bf16 indexer (indexer=bf16)", "q_offset 32", "dsa_indexer_loss.py"}},
      {"--problem \"sq32 skv32 hq4 dqk576 dv512 ih8 id32 k16 indexer=bf16 nl2 sched=FS\" --kind train --train-target "
       "served-layers --for megatron-dsa-indexer-loss",
       {"--train-target served-layers: megatron-dsa-indexer-loss takes own-layer"}},
      {"--problem \"sq32 skv32 hq64 dqk576 dv512 ih8 id32 k64 indexer=bf16\" --kind stack --for tilelang-sparse-mla-bwd",
       {"--for tilelang-sparse-mla-bwd writes a train set, not --kind stack"}},
      {"--problem \"sq32 skv32 hq64 dqk576 dv512 ih8 id32 k128 indexer=bf16\" --kind train --for flashmla-sparse-prefill-sm90",
       {"flashmla-sparse-prefill-sm90 writes a stack set, not a train set"}},
      {"--preset tilelang-sparse-mla-bwd --for megatron-dsa-indexer-loss",
       {"preset 'tilelang-sparse-mla-bwd' is written for tilelang-sparse-mla-bwd, not --for megatron-dsa-indexer-loss"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.args);
    const auto r = testing::run_cli("golden " + c.args + " --out " + dir);
    CHECK(r.status == 2);
    for (const std::string& n : c.named) CHECK_MESSAGE(r.out.find(n) != std::string::npos, r.out);
    CHECK(!std::filesystem::exists(dir));
  }
}

TEST_CASE("kernels: a train set --for a training kernel: the kernel block, its kwargs from the train options, the replay") {
  const std::string dir = temp_dir("train-set");
  const auto r = testing::run_cli("golden --problem \"sq64 skv64 hq64 dqk576 dv512 ih8 id32 k64 seed5 indexer=bf16 nl2 sched=FS\" "
                                  "--kind train --loss-coeff 0.5 --for megatron-dsa-indexer-loss --force --out " + dir);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  const golden::Loaded g = golden::read(dir);
  const nlohmann::json& kb = g.manifest["kernel"];
  CHECK(g.manifest["kind"] == "train");
  CHECK(kb["name"] == "megatron-dsa-indexer-loss");
  CHECK(kb["layers"] == nlohmann::json({0}));  // the Full layer only: Shared layers carry no loss
  CHECK(kb["kwargs"]["loss_coeff"].get<double>() == 0.5);
  CHECK(kb["kwargs"]["sparse_loss"] == true);
  CHECK(kb["kwargs"]["softmax_scale"].get<float>() == g.manifest["config"]["sm_scale"].get<float>());
  std::set<std::string> args;
  for (const nlohmann::json& a : kb["args"]) args.insert(a["tensor"].get<std::string>());
  CHECK(args == std::set<std::string>{"layers.{l}.indexer.q", "layers.{l}.indexer.k", "layers.{l}.indexer.weights",
                                      "layers.{l}.attn.q", "layers.{l}.attn.kv", "layers.{l}.indexer.topk"});
  const std::string replay = g.manifest["replay"];
  CHECK(replay.find("--kind train --loss-coeff 0.5 --for megatron-dsa-indexer-loss") != std::string::npos);
  // The TileLang block: the base-2 lse and the -1 convention are stated; every argument is in the set.
  const auto t = testing::run_cli("golden --problem \"sq64 skv64 hq64 dqk576 dv512 ih8 id32 k64 seed5 indexer=bf16\" "
                                  "--for tilelang-sparse-mla-bwd --force --out " + dir);
  REQUIRE_MESSAGE(t.status == 0, t.out);
  const golden::Loaded h = golden::read(dir);
  const std::string conv = h.manifest["kernel"]["conventions"].dump();
  CHECK(conv.find("base 2") != std::string::npos);
  CHECK(conv.find("log2(e)") != std::string::npos);
  CHECK(conv.find("-1 passes as a key") != std::string::npos);
  CHECK(conv.find("1e-4") != std::string::npos);
  CHECK(h.manifest["kernel"]["kwargs"]["is_casual"] == true);
  for (const nlohmann::json& a : h.manifest["kernel"]["args"]) {
    std::string name = a["tensor"];
    name.replace(name.find("{l}"), 3, "0");
    CHECK_MESSAGE(h.find(name) != nullptr, name);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("kernels: every checked-in manifest's replay writes to its own folder") {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(INDEXSHARE_SOURCE_DIR) + "/golden")) {
    if (e.path().filename() != "manifest.json") continue;
    const std::string rel = std::filesystem::relative(e.path().parent_path(), INDEXSHARE_SOURCE_DIR).string();
    const std::string replay = read_json(e.path().string())["replay"].get<std::string>();
    CAPTURE(replay);
    CHECK(replay.size() >= rel.size() + 6);
    CHECK(replay.substr(replay.size() - rel.size() - 6) == "--out " + rel);
    ++n;
  }
  CHECK(n >= 18);
}
