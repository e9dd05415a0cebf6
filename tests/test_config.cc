// Tests of ref/config: the model presets carry the published numbers.
#include <doctest/doctest.h>

#include <cmath>

#include "ref/config.h"

using namespace indexshare;

TEST_CASE("config: presets carry the published shapes") {
  const ModelConfig ds = model_preset("deepseek-v3.2");
  CHECK(ds.n_layers == 61);
  CHECK(ds.dim == 7168);
  CHECK(ds.n_heads == 128);
  CHECK(ds.d_qk() == 576);
  CHECK(ds.d_v() == 512);
  CHECK(ds.qk_head_dim() == 192);
  CHECK(ds.index_n_heads == 64);
  CHECK(ds.index_head_dim == 128);
  CHECK(ds.index_topk == 2048);
  CHECK(ds.indexer_rope == ref::RopeLayout::half_split);
  // 192^-0.5 * (0.1 ln 40 + 1)^2, computed here from the definition.
  const double m = 0.1 * std::log(40.0) + 1.0;
  CHECK(std::fabs(ds.softmax_scale() - m * m / std::sqrt(192.0)) < 1e-15);
  CHECK(std::fabs(ds.softmax_scale() - 0.1352337789) < 1e-9);
  CHECK(ds.resolve_schedule().n_full() == 61);

  const ModelConfig g5 = model_preset("glm-5"), g52 = model_preset("glm-5.2");
  for (const ModelConfig* g : {&g5, &g52}) {
    CHECK(g->n_layers == 78);
    CHECK(g->dim == 6144);
    CHECK(g->index_n_heads == 32);
    CHECK(g->qk_head_dim() == 256);
    CHECK(g->softmax_scale() == 0.0625);
    CHECK(g->indexer_rope == ref::RopeLayout::interleaved);
  }
  CHECK(g5.resolve_schedule().n_full() == 78);
  const Schedule s = g52.resolve_schedule();
  CHECK(s.n_full() == 21);
  CHECK(s.pattern().substr(0, 11) == "FFFSSSFSSSF");
  CHECK(g52.rope_theta == 8e6);
  CHECK_THROWS_WITH_AS(model_preset("glm-6"), doctest::Contains("'glm-6'"), Error);
}

TEST_CASE("config: tiny presets keep the structure with sequences longer than top-k") {
  for (const char* name : {"tiny-deepseek", "tiny-glm"}) {
    CAPTURE(name);
    const ModelConfig c = model_preset(name);
    CHECK(c.seq > 2 * c.index_topk);
    CHECK(c.index_head_dim >= c.qk_rope_head_dim);
    CHECK(c.rope_inv_freq().size() == size_t(c.qk_rope_head_dim / 2));
  }
  CHECK(model_preset("tiny-glm").resolve_schedule().pattern() == "FFFSSSFS");
  CHECK(model_preset("tiny-deepseek").indexer_rope == ref::RopeLayout::half_split);
}
