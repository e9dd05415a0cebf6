// Tests of ref/problem: canonical string round trip and parse errors that name the bad token.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "ref/problem.h"
#include "ref/rng.h"

using namespace indexshare;

TEST_CASE("problem: canonical string round-trips") {
  const Problem d;
  CHECK(to_string(d) == "sq128 skv128 hq16 dqk576 dv512 ih8 id128 k64 seed1");
  CHECK(parse_problem(to_string(d)) == d);
  Problem p = parse_problem("seed7 sq1024 skv4096 hq64 dqk576 dv512 ih64 id128 k256 indexer=bf16 "
                            "dist=ties sm=0.13523377478 sink=random");
  CHECK(p.s_q == 1024);
  CHECK(p.s_kv == 4096);
  CHECK(p.index_topk == 256);
  CHECK(p.seed == 7);
  CHECK(p.indexer == IndexerMode::bf16);
  CHECK(p.dist == Dist::ties);
  // scale= is an FP8 rule: with the bf16 indexer it would be read by nothing, so it is refused.
  const Problem q = parse_problem("seed7 sq8 skv16 k4 scale=flashmla_pow2");
  CHECK(q.scale == ScaleRule::flashmla_pow2);
  CHECK(parse_problem(to_string(q)) == q);
  CHECK_THROWS_WITH_AS(parse_problem("sq8 skv16 k4 indexer=bf16 scale=flashmla_pow2"),
                       doctest::Contains("scale applies to indexer=fp8 only"), Error);
  CHECK(p.sink == SinkMode::random);
  CHECK(*p.sm == 0.13523377478f);
  CHECK(parse_problem(to_string(p)) == p);
  // Options at their default are left out of the canonical string; order is fixed.
  CHECK(to_string(parse_problem("k32 dist=normal sq64 skv64")) ==
        "sq64 skv64 hq16 dqk576 dv512 ih8 id128 k32 seed1");
  // Awkward floats survive printing in their shortest round-trip form.
  for (float v : {0.1f, 1.0f / 3.0f, 0.0883883461f, 1e-30f, 3.4e38f}) {
    Problem q;
    q.sm = v;
    CHECK(*parse_problem(to_string(q)).sm == v);
  }
  CHECK(Problem().sm_scale() == float(1.0 / 24.0));  // 576^-0.5
  // Whitespace is free.
  CHECK(parse_problem("  sq8\tskv8  ").s_q == 8);
}

TEST_CASE("problem: parse errors name the bad token") {
  struct Case { const char* text; const char* needle; };
  const Case cases[] = {
      {"sq", "'sq'"},
      {"sq-1", "'sq-1'"},
      {"sq12x", "'sq12x'"},
      {"foo12", "unknown field 'foo'"},
      {"dist=gauss", "'dist=gauss'"},
      {"scale=ue8m0", "'scale=ue8m0'"},
      {"indexer=fp4", "'indexer=fp4'"},
      {"sink=maybe", "'sink=maybe'"},
      {"sm=abc", "'sm=abc'"},
      {"sm=nan", "'sm=nan'"},
      {"sm=1e999", "'sm=1e999'"},
      {"sm=abc", "expected a number"},
      {"sm=nan", "expected a finite number"},
      {"sim=1e300", "outside the float range"},  // finite, but not a float: not "expected a finite number"
      {"recency=1e-60", "too small for a float"},
      {"colour=red", "'colour=red'"},
      {"sq10 sq20", "given twice"},
      {"sq0", "sq must be >= 1"},
      {"sq64 skv32", "skv (32) must be >= sq (64)"},
      {"dv600", "dv (600) must be <= dqk (576)"},
      {"k0", "k must be >= 1"},
      {"sq99999999999999999999", "'sq99999999999999999999'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    CHECK_THROWS_WITH_AS(parse_problem(c.text), doctest::Contains(c.needle), Error);
  }
}

// Floats print as std::to_chars' shortest decimal that reads back as the same float. The checked-in
// manifests were once written with 9 significant digits: both spellings parse to the same bits.
TEST_CASE("problem: floats print in their shortest round-trip form, and the 9-digit spelling parses to the same bits") {
  // Worked by hand: the f32 nearest each decimal, and the shortest decimal nearest back to it.
  const std::pair<float, const char*> known[] = {
      {0.98f, "0.98"}, {0.85f, "0.85"}, {0.8f, "0.8"}, {0.15f, "0.15"}, {0.25f, "0.25"}, {0.0f, "0"},
      {1.0f / 3.0f, "0.33333334"}, {1.0f / 24.0f, "0.041666668"}, {100.0f, "100"}, {1e-5f, "1e-05"}, {3.4e38f, "3.4e+38"}};
  for (const auto& [v, text] : known) CHECK(float_text(v) == text);
  // A sweep of finite bit patterns from the project's RNG: each reads back bit for bit, in no more
  // characters than the 9-digit spelling.
  Xoshiro256 rng(7);
  int checked = 0, bad = 0;
  for (int i = 0; i < 100000; ++i) {
    const uint32_t bits = uint32_t(rng.next() >> 33);  // sign clear: the descriptors' floats are >= 0
    const float v = std::bit_cast<float>(bits);
    if (!std::isfinite(v)) continue;
    const std::string t = float_text(v);
    char nine[32];
    std::snprintf(nine, sizeof nine, "%.9g", double(v));
    ++checked;
    if (std::bit_cast<uint32_t>(std::strtof(t.c_str(), nullptr)) != bits || t.size() > std::strlen(nine)) ++bad;
  }
  CHECK(checked > 99000);
  CHECK(bad == 0);
  // The checked-in sets' problems, as older manifests spell them and as they print now.
  const std::pair<const char*, const char*> spellings[] = {
      {"sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed8 nl8 sched=glm-5.2 sim=0 drift=0.980000019 jumps=0.150000006 recency=0.25 sinks=2",
       "sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed8 nl8 sched=glm-5.2 sim=0 drift=0.98 jumps=0.15 recency=0.25 sinks=2"},
      {"sq16 skv256 hq4 dqk576 dv512 ih64 id128 k32 seed1 nl3 sim=0.850000024 recency=0.25 sinks=2 nseq2",
       "sq16 skv256 hq4 dqk576 dv512 ih64 id128 k32 seed1 nl3 sim=0.85 recency=0.25 sinks=2 nseq2"},
      {"sq8 skv16 sm=0.0416666679 jumprho=0.400000006 jumps=0.5 drift=0.333333343",
       "sq8 skv16 hq16 dqk576 dv512 ih8 id128 k64 seed1 sm=0.041666668 drift=0.33333334 jumps=0.5 jumprho=0.4"}};
  for (const auto& [old_text, new_text] : spellings) {
    CAPTURE(old_text);
    const Problem a = parse_problem(old_text), b = parse_problem(new_text);
    CHECK(to_string(a) == new_text);
    CHECK(a == b);
    for (auto f : {&Problem::sim, &Problem::drift, &Problem::jumps, &Problem::jump_rho, &Problem::recency})
      CHECK(std::bit_cast<uint32_t>(a.*f) == std::bit_cast<uint32_t>(b.*f));
    CHECK(std::bit_cast<uint32_t>(a.sm_scale()) == std::bit_cast<uint32_t>(b.sm_scale()));
  }
}
