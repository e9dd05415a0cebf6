// The registry of GPU kernels (tools/lib/kernel_registry.h) and `golden --for`: every constraint is
// refused with its message, and a set written for a kernel holds every argument the manifest's
// `kernel` block names, with the block's dtype and shape.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>

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
    const auto r = testing::run_cli(std::string("golden --problem \"") + kValid + " nl2 sched=FS\" --for " + k.name + " --force --out " + dir);
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
