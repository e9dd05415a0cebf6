// Tests of ref/stack: index sharing across layers at kernel level.
#include <doctest/doctest.h>

#include <set>

#include "ref/stack.h"
#include "ref/topk.h"

using namespace indexshare;

namespace {
// Mean over rows of |A ∩ B| / |A| for the valid (>= 0) positions of two [s_q, k] top-k tensors,
// over rows whose valid count is k (non-trivial rows).
double overlap(const Tensor<int32_t>& a, const Tensor<int32_t>& b) {
  const int64_t s_q = a.dim(0), k = a.dim(1);
  double sum = 0;
  int64_t rows = 0;
  for (int64_t t = 0; t < s_q; ++t) {
    std::set<int32_t> sa, sb;
    for (int64_t j = 0; j < k; ++j) {
      if (a.at(t, j) >= 0) sa.insert(a.at(t, j));
      if (b.at(t, j) >= 0) sb.insert(b.at(t, j));
    }
    if (int64_t(sa.size()) < k) continue;
    int64_t common = 0;
    for (int32_t v : sa) common += sb.count(v);
    sum += double(common) / double(sa.size());
    ++rows;
  }
  return rows ? sum / double(rows) : 1.0;
}
}  // namespace

TEST_CASE("stack: a Shared layer attends over exactly its source Full layer's positions") {
  const Problem p = parse_problem("sq12 skv40 hq2 dqk16 dv8 ih4 id32 k6 seed3 nl8 sched=glm-5.2 sim=0.5");
  const Schedule s = p.schedule();
  CHECK(s.pattern() == "FFFSSSFS");
  const auto in = ref::make_stack_inputs(p, s);
  const auto out = ref::run_stack(p, s, in);
  const int expect_source[8] = {0, 1, 2, 2, 2, 2, 6, 6};
  for (int l = 0; l < 8; ++l) {
    CAPTURE(l);
    CHECK(out[size_t(l)].source == expect_source[l]);
    const auto& src = out[size_t(expect_source[l])];
    CHECK(out[size_t(l)].used_topk.data == src.own_topk.data);
    // Recompute the layer's attention over the source's positions, independently of run_stack.
    const ref::AttentionOut a = ref::layer_attention(p, in[size_t(l)], ref::local_to_kv_rows(src.own_topk, in[size_t(l)].ks));
    CHECK(out[size_t(l)].attn.out.data == a.out.data);
    CHECK(out[size_t(l)].attn.lse.data == a.lse.data);
    // Shared layers still computed their own (unused) top-k: it is the top-k of their own logits.
    CHECK(out[size_t(l)].own_topk.data == ref::topk(ref::layer_logits(p, in[size_t(l)]), in[size_t(l)].ks, in[size_t(l)].ke, p.index_topk).data);
  }
}

TEST_CASE("stack: all-full and shared stacks differ exactly in the Shared layers' indices") {
  const Problem shared = parse_problem("sq10 skv48 hq2 dqk16 dv8 ih4 id32 k8 seed5 nl6 sched=one-full-three-shared sim=0.3");
  Problem full = shared;
  full.sched = "all-full";
  const auto in = ref::make_stack_inputs(shared, shared.schedule());
  const auto a = ref::run_stack(shared, shared.schedule(), in), b = ref::run_stack(full, full.schedule(), in);
  for (int l = 0; l < 6; ++l) {
    CAPTURE(l);
    const bool is_full = l == 0 || l == 4;
    CHECK(a[size_t(l)].own_topk.data == b[size_t(l)].own_topk.data);  // the indexers agree everywhere
    if (is_full) {
      CHECK(a[size_t(l)].indices.data == b[size_t(l)].indices.data);
      CHECK(a[size_t(l)].attn.out.data == b[size_t(l)].attn.out.data);
    } else {
      CHECK(a[size_t(l)].indices.data != b[size_t(l)].indices.data);
      CHECK(a[size_t(l)].attn.out.data != b[size_t(l)].attn.out.data);
    }
  }
}

TEST_CASE("stack: the similarity knob's end points") {
  // sim = 1: every layer has the same indexer inputs, so adjacent top-k overlap is exactly 1.
  const Problem same = parse_problem("sq16 skv96 hq2 dqk16 dv8 ih4 id32 k8 seed7 nl3 sim=1");
  const auto a = ref::run_stack(same, same.schedule(), ref::make_stack_inputs(same, same.schedule()));
  CHECK(a[0].own_topk.data == a[1].own_topk.data);
  CHECK(a[1].own_topk.data == a[2].own_topk.data);
  // sim = 0: independent layers; the expected overlap of two random k-subsets of a window of
  // length n is k/n, averaged over the rows here (n from 81 to 96, k = 8): about 0.09.
  const Problem indep = parse_problem("sq16 skv96 hq2 dqk16 dv8 ih4 id32 k8 seed7 nl2 sim=0");
  const auto b = ref::run_stack(indep, indep.schedule(), ref::make_stack_inputs(indep, indep.schedule()));
  const double ov = overlap(b[0].own_topk, b[1].own_topk);
  MESSAGE("overlap at sim=0: " << ov);
  CHECK(ov < 0.25);
  // In between, overlap grows with similarity.
  const Problem mid = parse_problem("sq16 skv96 hq2 dqk16 dv8 ih4 id32 k8 seed7 nl2 sim=0.9");
  const auto c = ref::run_stack(mid, mid.schedule(), ref::make_stack_inputs(mid, mid.schedule()));
  CHECK(overlap(c[0].own_topk, c[1].own_topk) > ov);
}

TEST_CASE("stack: decode rows follow the next_n causal rule, Shared layers may lack indexer inputs") {
  const Problem p = parse_problem("sq2 skv10 hq2 dqk16 dv8 ih2 id16 k4 seed1 nl2 sched=FS own=no");
  const auto in = ref::make_stack_inputs(p, p.schedule());
  CHECK(in[0].ke.data == std::vector<int32_t>{9, 10});  // row t sees keys <= 10 - 2 + t
  CHECK(in[0].has_indexer);
  CHECK(!in[1].has_indexer);
  const auto out = ref::run_stack(p, p.schedule(), in);
  CHECK(out[1].own_topk.numel() == 0);
  CHECK(out[1].used_topk.data == out[0].own_topk.data);
  // Errors: a Full layer without indexer inputs; a schedule of the wrong size.
  std::vector<ref::LayerInputs> bad = in;
  bad[0].has_indexer = false;
  CHECK_THROWS_WITH_AS(ref::run_stack(p, p.schedule(), bad), doctest::Contains("Full layer 0"), Error);
  CHECK_THROWS_AS(ref::run_stack(p, parse_schedule("FSS", 3), in), Error);
  CHECK_THROWS_WITH_AS(parse_problem("nl3 sched=SFF"), doctest::Contains("SFF"), Error);
  CHECK_THROWS_WITH_AS(parse_problem("nl3 sched=FF"), doctest::Contains("FF"), Error);
  CHECK_THROWS_WITH_AS(parse_problem("sim=1.5"), doctest::Contains("sim"), Error);
}

TEST_CASE("stack: several flattened sequences keep their own windows and local positions") {
  const Problem p = parse_problem("sq8 skv24 hq2 dqk16 dv8 ih2 id16 k4 seed4 nseq2 nl2 sched=FS");
  CHECK(to_string(p).find("nseq2") != std::string::npos);
  const auto in = ref::make_stack_inputs(p, p.schedule());
  // Sequence 0: rows 0-3, kv rows 0-11, positions 8..11; sequence 1: rows 4-7, kv rows 12-23.
  CHECK(in[0].ks.data == std::vector<int32_t>{0, 0, 0, 0, 12, 12, 12, 12});
  CHECK(in[0].ke.data == std::vector<int32_t>{9, 10, 11, 12, 21, 22, 23, 24});
  const auto out = ref::run_stack(p, p.schedule(), in);
  for (int64_t t = 0; t < 8; ++t)
    for (int64_t j = 0; j < 4; ++j) {
      const int32_t local = out[0].own_topk.at(t, j), row = out[0].indices[t * 4 + j];
      CHECK((local >= 0 && local < in[0].ke[t] - in[0].ks[t]));
      CHECK(row == local + in[0].ks[t]);
    }
  CHECK(out[1].used_topk.data == out[0].own_topk.data);
  CHECK_THROWS_WITH_AS(parse_problem("sq8 skv24 nseq3"), doctest::Contains("nseq"), Error);
}
