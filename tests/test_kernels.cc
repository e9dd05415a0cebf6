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
#include "tools/lib/kernel_registry.h"

using namespace indexshare;

namespace {

// A problem every registered kernel accepts: h_q 64, d_qk 576, d_v 512, top-k 128, a 64 x 128 FP8
// indexer, two sequences with next_n = 2.
const char* kValid = "sq4 skv512 hq64 dqk576 dv512 ih64 id128 k128 seed3 nseq2";

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
  };
  REQUIRE_MESSAGE(set.count(c.field), "no violation written for field " << c.field);
  set.at(c.field)();
}

}  // namespace

TEST_CASE("kernels: every constraint of every registered kernel is refused alone, with its message") {
  const Problem ok = parse_problem(kValid);
  int checked = 0;
  for (const kreg::Kernel& k : kreg::kernels()) {
    CAPTURE(k.name);
    CHECK(kreg::violations(k, ok).empty());
    for (const kreg::Constraint& c : k.constraints) {
      CAPTURE(c.field);
      Problem p = ok;
      violate(p, c);
      const std::vector<std::string> v = kreg::violations(k, p);
      REQUIRE(v.size() == 1);
      CHECK(v[0].find(k.name + " takes ") != std::string::npos);
      CHECK(v[0].find(c.field == "indexer_fp8" ? "indexer=bf16" : c.field + " ") == 0);
      CHECK(v[0].find(c.source) != std::string::npos);
      ++checked;
    }
  }
  CHECK(checked >= 20);
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
    const auto r = testing::run_cli(std::string("golden --problem \"") + kValid + " nl2 sched=FS\" --impl simd --for " + k.name + " --force --out " + dir);
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
          if (a["view"].get<bool>()) CHECK(got_n == want_n);  // the same bytes, viewed in the kernel's shape
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
        if (a["view"].get<bool>()) CHECK(got == want);
        else CHECK(v.shape == shape);
        if (std::string(part) == "args") CHECK(v.dtype == a["dtype"].get<std::string>());
        ++n;
      }
  CHECK(n >= 4);
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
    CHECK(m["problem"] == to_string(parse_problem(pr.problem)));
    const TensorList t = tensor_list(m);
    const std::vector<std::string> bad = kernel_problems(pr.kernel, t);
    CHECK_MESSAGE(bad.empty(), (bad.empty() ? std::string() : bad[0]));
    check_kernel_block(m["kernel"], t);
    for (const nlohmann::json& e : m["tensors"]) CHECK(e["sha256"].get<std::string>().size() == 64);
    // The real shapes: prefill top-2048 over 8192 keys; decode next_n 2 over several
    // paged sequences; DeepGEMM at H 64, D 128.
    const Problem p = parse_problem(pr.problem);
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
    CHECK(p.s_q <= 8);  // few query rows: quick to regenerate
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
      {"deepgemm-fp8-mqa-logits-sm90", [](TensorList& t) { t["layers.0.indexer.q"].shape[1] = 16; }, "H 16"},
      {"deepgemm-fp8-mqa-logits-sm100", [](TensorList& t) { t["layers.0.indexer.q"].shape[2] = 96; }, "D 96"},
      {"deepgemm-fp8-mqa-logits-sm90", [](TensorList& t) { t["layers.0.indexer.q"].dtype = "BF16"; }, "indexer q dtype BF16"},
      {"deepgemm-fp8-paged-mqa-logits", [](TensorList& t) { t["context_lens"].shape = {t["context_lens"].shape[0] * 2}; },
       "context_lens rank 1"},
      {"deepgemm-fp8-paged-mqa-logits", [](TensorList& t) { t.erase("context_lens"); }, "missing tensor context_lens"},
      {"deepgemm-fp8-paged-mqa-logits", [](TensorList& t) { t["layers.0.indexer.k_cache"].shape[1] = 32; }, "kv_cache not"},
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
  CHECK(n >= 2);
}
}  // namespace

// The stack kernel presets (prefill, DeepGEMM fp8_mqa_logits): about 3 s on the 2-core machine.
TEST_CASE("kernels: the stack kernel presets regenerate to their checked-in manifests' hashes") {
  regenerate_kernel_presets("stack");
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
