// Tests of ref/problem: canonical string round trip and parse errors that name the bad token.
#include <doctest/doctest.h>

#include "ref/problem.h"

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
  // Awkward floats survive printing with 9 significant digits.
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
