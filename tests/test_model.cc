// Tests of ref/model: the toy module-level stack with index sharing, chunked prefill and decode.
#include <doctest/doctest.h>

#include <set>

#include "ref/model.h"

using namespace indexshare;

namespace {
ref::ToyForward prefill(const ref::ToyModel& m, std::vector<int64_t> chunks, uint64_t seed, ref::ToyCache& cache) {
  ref::ToyForward last;
  std::vector<ref::ToyForward> parts;
  for (int64_t c : chunks) parts.push_back(ref::forward(m, cache, ref::toy_hidden(m.cfg, seed, cache.len, c)));
  // Concatenate the per-layer traces' attention outputs and top-k rows for comparison.
  last = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    last.h_out = ref::concat_rows(last.h_out, parts[i].h_out);
    for (size_t l = 0; l < last.layers.size(); ++l) {
      auto& a = last.layers[l];
      const auto& b = parts[i].layers[l];
      a.used_topk = ref::concat_rows(a.used_topk, b.used_topk);
      a.attn.out = ref::concat_rows(a.attn.out, b.attn.out);
      a.attn.lse = ref::concat_rows(a.attn.lse, b.attn.lse);
      a.out = ref::concat_rows(a.out, b.out);
    }
  }
  return last;
}
}  // namespace

TEST_CASE("model: chunked prefill and decode equal one whole prefill bit for bit") {
  const ModelConfig cfg = model_preset("tiny-glm");
  const ref::ToyModel m = ref::make_toy_model(cfg, cfg.resolve_schedule(), 7, 0.7f, ref::IndexerVariant::deepseek_fp8, true);
  ref::ToyCache whole_cache, chunk_cache;
  const ref::ToyForward whole = prefill(m, {64}, 7, whole_cache);
  const ref::ToyForward chunks = prefill(m, {24, 24, 14, 2}, 7, chunk_cache);  // the last chunk: decode, next_n = 2
  CHECK(whole_cache.len == 64);
  CHECK(chunk_cache.len == 64);
  for (size_t l = 0; l < whole.layers.size(); ++l) {
    CAPTURE(l);
    CHECK(whole.layers[l].used_topk.data == chunks.layers[l].used_topk.data);
    CHECK(whole.layers[l].attn.out.data == chunks.layers[l].attn.out.data);
    CHECK(whole.layers[l].attn.lse.data == chunks.layers[l].attn.lse.data);
    CHECK(whole.layers[l].out.data == chunks.layers[l].out.data);
    CHECK(whole_cache.kv[l].data == chunk_cache.kv[l].data);
  }
  CHECK(whole.h_out.data == chunks.h_out.data);
}

TEST_CASE("model: Shared layers attend over their source Full layer's positions") {
  const ModelConfig cfg = model_preset("tiny-glm");  // 8 layers, FFFSSSFS
  const Schedule s = cfg.resolve_schedule();
  const ref::ToyModel m = ref::make_toy_model(cfg, s, 3, 0.7f, ref::IndexerVariant::deepseek_fp8, true);
  ref::ToyCache cache;
  const ref::ToyForward f = ref::forward(m, cache, ref::toy_hidden(cfg, 3, 0, 48));
  const int source[8] = {0, 1, 2, 2, 2, 2, 6, 6};
  for (int l = 0; l < 8; ++l) {
    CAPTURE(l);
    CHECK(f.layers[size_t(l)].used_topk.data == f.layers[size_t(source[l])].own_topk.data);
    CHECK(f.layers[size_t(l)].own_topk.numel() == 48 * 16);  // every layer carries its own indexer here
  }
  // Shared layers' own would-be positions overlap their used ones, but not completely.
  int64_t common = 0, total = 0;
  for (int64_t t = 32; t < 48; ++t) {
    std::set<int32_t> used, own;
    for (int64_t j = 0; j < 16; ++j) { used.insert(f.layers[4].used_topk.at(t, j)); own.insert(f.layers[4].own_topk.at(t, j)); }
    for (int32_t v : own) common += used.count(v);
    total += 16;
  }
  MESSAGE("layer 4 recall of shared vs own positions: " << double(common) / double(total));
  CHECK(common > 0);
  // Without own indexers on Shared layers, they compute no top-k of their own.
  const ref::ToyModel bare = ref::make_toy_model(cfg, s, 3, 0.7f, ref::IndexerVariant::deepseek_fp8, false);
  ref::ToyCache c2;
  const ref::ToyForward g = ref::forward(bare, c2, ref::toy_hidden(cfg, 3, 0, 48));
  CHECK(g.layers[3].own_topk.numel() == 0);
  CHECK(g.layers[3].used_topk.data == g.layers[2].own_topk.data);
  // The same layers run identically up to the first Shared layer.
  for (int l = 0; l < 3; ++l) CHECK(g.layers[size_t(l)].out.data == f.layers[size_t(l)].out.data);
}

TEST_CASE("model: all-full and shared schedules agree up to the first Shared layer") {
  ModelConfig cfg = model_preset("tiny-deepseek");  // 4 layers
  const Schedule shared = parse_schedule("FSFS", 4), full = parse_schedule("all-full", 4);
  const ref::ToyModel a = ref::make_toy_model(cfg, shared, 5, 0.5f, ref::IndexerVariant::hf_bf16, true);
  const ref::ToyModel b = ref::make_toy_model(cfg, full, 5, 0.5f, ref::IndexerVariant::hf_bf16, true);
  ref::ToyCache ca, cb;
  const ref::ToyForward fa = ref::forward(a, ca, ref::toy_hidden(cfg, 5, 0, 40));
  const ref::ToyForward fb = ref::forward(b, cb, ref::toy_hidden(cfg, 5, 0, 40));
  CHECK(fa.layers[0].out.data == fb.layers[0].out.data);
  CHECK(fa.layers[1].own_topk.data == fb.layers[1].own_topk.data);  // same inputs, same indexer
  CHECK(fa.layers[1].used_topk.data != fb.layers[1].used_topk.data);
  CHECK(fa.layers[1].out.data != fb.layers[1].out.data);
  CHECK_THROWS_AS(ref::make_toy_model(cfg, parse_schedule("FS", 2), 5, 0.5f, ref::IndexerVariant::hf_bf16, true), Error);
}
