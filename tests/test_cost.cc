// Tests of ref/cost: the documented formulas on a hand-sized config (expected numbers worked out
// by hand below, not with the code), the published GLM-5.2 shape, JSON configs, and the CLI.
#include <doctest/doctest.h>

#include "tests/cli_util.h"

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "ref/config.h"
#include "ref/cost.h"
#include "ref/error.h"
#include "ref/schedule.h"

using namespace indexshare;

namespace {

// d 16, V 100; MLA h 2, r_q 8, r_kv 8, d_n 4, d_r 2, d_vh 4 (d_qk 10, d_v 8); indexer H 2, D 4,
// k 3; MoE E 4, E_a 1, E_s 1, I 3, one dense layer with I_dense 5; 4 layers.
ModelConfig hand_config() {
  ModelConfig c;
  c.name = "hand";
  c.n_layers = 4; c.dim = 16; c.vocab = 100;
  c.n_heads = 2; c.q_lora_rank = 8; c.kv_lora_rank = 8;
  c.qk_nope_head_dim = 4; c.qk_rope_head_dim = 2; c.v_head_dim = 4;
  c.index_n_heads = 2; c.index_head_dim = 4; c.index_topk = 3;
  c.n_routed_experts = 4; c.n_activated_experts = 1; c.n_shared_experts = 1;
  c.moe_inter_dim = 3; c.first_k_dense = 1; c.dense_inter_dim = 5;
  c.seq = 8;
  return c;
}

void check_item(const CostBreakdown& b, const char* name, double flops, double bytes) {
  INFO("item " << name);
  CHECK(b.item(name).flops == flops);
  CHECK(b.item(name).bytes == bytes);
}

std::string temp_path(const std::string& tag) {
  return "/tmp/indexshare_test_cost_" + std::to_string(getpid()) + "_" + tag;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// The error message of parse_config_json(text), or "" if it does not throw.
std::string config_error(const std::string& text) {
  try {
    (void)parse_config_json(text, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const char* kHandJson = R"({
  "name": "hand", "n_layers": 4, "dim": 16, "vocab": 100, "n_heads": 2, "q_lora_rank": 8,
  "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4,
  "index_n_heads": 2, "index_head_dim": 4, "index_topk": 3, "n_routed_experts": 4,
  "n_shared_experts": 1, "n_activated_experts": 1, "moe_inter_dim": 3, "first_k_dense": 1,
  "dense_inter_dim": 5, "index_topk_pattern": "FSFS", "_comment": "hand config of test_cost.cc"
})";

// kHandJson with the first `from` replaced by `to`.
std::string hand_json_with(const std::string& from, const std::string& to) {
  std::string t = kHandJson;
  const size_t p = t.find(from);
  REQUIRE(p != std::string::npos);
  return t.replace(p, from.size(), to);
}

using Result = indexshare::testing::CliResult;
Result cli(const std::string& args) { return indexshare::testing::run_cli(args); }

}  // namespace

TEST_CASE("cost: cache entry sizes and causal sums") {
  for (const char* m : {"deepseek-v3.2", "glm-5", "glm-5.2"}) {
    const ModelConfig c = model_preset(m);
    CHECK(indexer_cache_entry_bytes(c) == 132);  // 128 FP8 + one fp32 scale
    CHECK(mla_cache_entry_bytes(c) == 656);      // 512 FP8 + 4 fp32 scales + 64 bf16
  }
  CHECK(causal_sum(1) == 1);
  CHECK(causal_sum(5) == 15);
  CHECK(causal_topk_sum(5, 3) == 12);  // 1 + 2 + 3 + 3 + 3
  CHECK(causal_topk_sum(2, 3) == 3);
  CHECK(cost_item_names() ==
        std::vector<std::string>{"indexer_proj", "indexer_score", "topk", "mla_proj", "sparse_mla", "moe_ffn", "head"});
}

TEST_CASE("cost: decode formulas on a hand config") {
  const ModelConfig c = hand_config();
  const Schedule s = schedule_from_pattern("FSFS");  // 2 full layers
  // Per full layer: indexer_proj MACs r_q*H*D + d*D + d*H = 64 + 64 + 32 = 160; weights 128 B FP8
  // + 32*2 B bf16; k cache write 4 + 4 = 8 B.
  // Per layer: mla_proj MACs d*r_q 128 + r_q*h*(d_n+d_r) 96 + d*(r_kv+d_r) 160 + h*(d_n+d_vh)*r_kv
  // 128 + h*d_vh*d 128 = 640; MLA cache entry 8 + 4 + 2*2 = 16 B.
  // Sparse MLA MACs per selected key per layer: h*(d_qk + d_v) = 2*(10 + 8) = 36.
  // FFN: dense layer 3*16*5 = 240 MACs; 3 MoE layers of (1+1)*3*16*3 = 288 + router 16*4 = 64.
  // Head: 16*100 = 1600 MACs, 3200 B bf16, embedding row 32 B.
  const CostBreakdown b = decode_cost(c, s, 10);
  check_item(b, "indexer_proj", 2 * 2 * 160, 2 * (128 + 64 + 8));
  check_item(b, "indexer_score", 2 * 2 * 8 * 10, 2 * (8 * 10 + 4 * 10));
  check_item(b, "topk", 2 * 10, 2 * (4 * 10 + 4 * 3));
  check_item(b, "mla_proj", 2 * 4 * 640, 4 * (640 + 16));
  check_item(b, "sparse_mla", 2 * 4 * 36 * 3, 4 * (16 + 4) * 3);
  check_item(b, "moe_ffn", 2 * (240 + 3 * 352), 240 + 3 * (288 + 64 * 2));
  check_item(b, "head", 2 * 1600, 3200 + 32);
  CHECK(b.total_flops() == 640 + 320 + 20 + 5120 + 864 + 2592 + 3200);
  CHECK(b.total_bytes() == 400 + 240 + 104 + 2624 + 240 + 1488 + 3232);

  // All full: the three indexer items double, nothing else changes.
  const CostBreakdown f = decode_cost(c, all_full_schedule(c), 10);
  CHECK(f.total_flops() == 1280 + 640 + 40 + 5120 + 864 + 2592 + 3200);
  CHECK(flops_ratio(c, s, 10, CostMode::decode) == doctest::Approx(13736.0 / 12756.0).epsilon(1e-15));

  // Context shorter than top-k: every key selected.
  const CostBreakdown shortb = decode_cost(c, s, 2);
  check_item(shortb, "indexer_score", 2 * 2 * 8 * 2, 2 * (8 * 2 + 4 * 2));
  check_item(shortb, "topk", 2 * 2, 2 * (4 * 2 + 4 * 2));
  check_item(shortb, "sparse_mla", 2 * 4 * 36 * 2, 4 * 20 * 2);
}

TEST_CASE("cost: accounting options on a hand config") {
  const ModelConfig c = hand_config();
  const Schedule s = schedule_from_pattern("FSFS");
  CostOptions o;
  o.flops_per_mac = 1;
  o.fp8_score_weight = 0.5;
  o.topk_ops_per_key = 3;
  o.fp8_weight_bytes = 2;
  CostBreakdown b = decode_cost(c, s, 10, o);
  check_item(b, "indexer_proj", 2 * 160, 2 * (128 * 2 + 64 + 8));
  check_item(b, "indexer_score", 0.5 * 2 * 8 * 10, 2 * (8 * 10 + 4 * 10));
  check_item(b, "topk", 3 * 2 * 10, 2 * (4 * 10 + 4 * 3));
  check_item(b, "mla_proj", 4 * 640, 4 * (640 * 2 + 16));

  // One MTP layer: a fifth layer, Full and MoE, plus eh_proj 2*16*16 = 512 MACs and a second head pass.
  CostOptions m;
  m.mtp_layers = 1;
  b = decode_cost(c, s, 10, m);
  check_item(b, "indexer_proj", 2 * 3 * 160, 3 * (128 + 64 + 8));
  check_item(b, "indexer_score", 2 * 3 * 8 * 10, 3 * (8 * 10 + 4 * 10));
  check_item(b, "mla_proj", 2 * 5 * 640, 5 * (640 + 16));
  check_item(b, "sparse_mla", 2 * 5 * 36 * 3, 5 * 20 * 3);
  check_item(b, "moe_ffn", 2 * (240 + 4 * 352), 240 + 4 * (288 + 128));
  check_item(b, "head", 2 * (2 * 1600 + 512), 2 * 3200 + 512 + 32);

  CostOptions bad;
  bad.flops_per_mac = 0;
  CHECK_THROWS_WITH_AS(decode_cost(c, s, 10, bad), doctest::Contains("flops_per_mac"), Error);
  bad = {};
  bad.mtp_layers = -1;
  CHECK_THROWS_WITH_AS(decode_cost(c, s, 10, bad), doctest::Contains("mtp_layers"), Error);
}

TEST_CASE("cost: prefill formulas on a hand config") {
  const ModelConfig c = hand_config();
  const Schedule s = schedule_from_pattern("FSFS");
  CostOptions o;
  o.prefill_query_tile = 2;
  // L = 5: S1 = 15, Sk = 12, k cache reads with tiles of 2 queries: 2 + 4 + 5 = 11.
  const CostBreakdown b = prefill_cost(c, s, 5, o);
  check_item(b, "indexer_proj", 5 * 640, 2 * (128 + 64 + 8 * 5));
  check_item(b, "indexer_score", 2 * 2 * 8 * 15, 2 * (8 * 11 + 4 * 15));
  check_item(b, "topk", 2 * 15, 2 * (4 * 15 + 4 * 12));
  check_item(b, "mla_proj", 5 * 5120, 4 * (640 + 16 * 5));
  check_item(b, "sparse_mla", 2 * 4 * 36 * 12, 4 * 20 * 12);
  // All min(4, 5*1) = 4 routed experts and the shared one are read: 5 * 144 B per MoE layer.
  check_item(b, "moe_ffn", 5 * 2592, 240 + 3 * (5 * 144 + 128));
  check_item(b, "head", 5 * 3200, 3200 + 32 * 5);
  // One token: only 1 routed expert of 4 read, and the prefill equals a decode step at L = 1.
  const CostBreakdown one = prefill_cost(c, s, 1), d1 = decode_cost(c, s, 1);
  CHECK(one.total_flops() == d1.total_flops());
  CHECK(one.total_bytes() == d1.total_bytes());
}

TEST_CASE("cost: bad inputs name the problem") {
  const ModelConfig c = hand_config();
  CHECK_THROWS_WITH_AS(decode_cost(c, schedule_from_pattern("FSF"), 10), doctest::Contains("3 layers"), Error);
  CHECK_THROWS_WITH_AS(decode_cost(c, all_full_schedule(c), 0), doctest::Contains("must be >= 1"), Error);
  CHECK_THROWS_WITH_AS(prefill_cost(c, all_full_schedule(c), -5), doctest::Contains("prefill length"), Error);
  ModelConfig bad = c;
  bad.n_activated_experts = 5;
  CHECK_THROWS_WITH_AS(decode_cost(bad, all_full_schedule(c), 10), doctest::Contains("n_activated_experts"), Error);
  CHECK_THROWS_WITH_AS(decode_cost(c, all_full_schedule(c), 10).item("nope"), doctest::Contains("'nope'"), Error);
}

TEST_CASE("cost: all-full ratio is 1") {
  for (const std::string& m : model_preset_names()) {
    const ModelConfig c = model_preset(m);
    for (CostMode mode : {CostMode::decode, CostMode::prefill})
      for (int64_t L : {int64_t(1), int64_t(4096), int64_t(1) << 20})
        CHECK(flops_ratio(c, all_full_schedule(c), L, mode) == 1.0);
  }
  // glm-5 has no shared layers: its own schedule is all full.
  const ModelConfig g5 = model_preset("glm-5");
  CHECK(flops_ratio(g5, g5.resolve_schedule(), 1 << 20, CostMode::decode) == 1.0);
}

TEST_CASE("cost: GLM-5.2 IndexShare FLOPs ratio at 1M context reproduces the published 2.9x") {
  const ModelConfig c = model_preset("glm-5.2");
  const Schedule s = c.resolve_schedule();
  REQUIRE(s.n_full() == 21);
  const int64_t L = int64_t(1) << 20;
  const double r = flops_ratio(c, s, L, CostMode::decode);
  CHECK(r >= 2.6);
  CHECK(r <= 3.2);
  CHECK(r == doctest::Approx(2.73).epsilon(0.01));
  CHECK(flops_ratio(c, s, L, accounting_alternatives().front()) == r);  // the default accounting
  // The indexer scoring term of the formula, by hand: 2 * 32 * 128 * L per Full layer.
  const CostBreakdown b = decode_cost(c, s, L);
  CHECK(b.item("indexer_score").flops == 2.0 * 32 * 128 * double(L) * 21);
  CHECK(b.item("sparse_mla").flops == 2.0 * 64 * (576 + 512) * 2048 * 78);
  // Active parameters: about 40B (GLM-5 is 744B total, ~40B active); the head counts dim*vocab.
  const double params = (b.total_flops() - b.item("indexer_score").flops - b.item("topk").flops -
                         b.item("sparse_mla").flops) / 2;
  CHECK(params > 38e9);
  CHECK(params < 42e9);
  // The ratio grows with context and is bounded by the indexer-only ratio 78/21.
  double prev = 1;
  for (int64_t ctx : {4096, 16384, 65536, 131072, 262144, 1048576}) {
    const double x = flops_ratio(c, s, ctx, CostMode::decode);
    CHECK(x > prev);
    prev = x;
  }
  CHECK(prev < 78.0 / 21.0);
}

TEST_CASE("cost: the indexer share grows with context") {
  for (const char* m : {"deepseek-v3.2", "glm-5.2"}) {
    const ModelConfig c = model_preset(m);
    for (const Schedule& s : {c.resolve_schedule(), all_full_schedule(c), parse_schedule("freq:4,offset:3", c.n_layers)})
      for (CostMode mode : {CostMode::decode, CostMode::prefill}) {
        INFO(std::string(m) << " " << s.pattern() << " " << cost_mode_name(mode));
        double prev = 0;
        for (int64_t ctx : {4096, 16384, 65536, 131072, 262144, 1048576}) {
          const CostBreakdown b = cost(c, s, ctx, mode);
          CHECK(b.indexer_flops_share() > prev);
          prev = b.indexer_flops_share();
        }
        CHECK(prev > 0.4);  // at 1M the indexer is the largest item, even with 1 Full layer in 4
      }
  }
}

TEST_CASE("cost: JSON config round trip") {
  for (const std::string& m : model_preset_names()) {
    const ModelConfig c = model_preset(m);
    const std::string path = temp_path(m + ".json");
    write_file(path, config_json_text(c));
    const ModelConfig r = load_config_json(path);
    std::remove(path.c_str());
    CHECK(r.name == c.name);
    CHECK(config_json_text(r) == config_json_text(c));
    CHECK(r.rms_eps == c.rms_eps);
    CHECK(r.index_norm_eps == c.index_norm_eps);
    CHECK(r.rope_theta == c.rope_theta);
    CHECK(r.indexer_rope == c.indexer_rope);
    CHECK(r.resolve_schedule() == c.resolve_schedule());
    CHECK(decode_cost(r, r.resolve_schedule(), 65536).total_flops() ==
          decode_cost(c, c.resolve_schedule(), 65536).total_flops());
  }
  // The hand config, with an HF-style pattern and a comment key.
  const ModelConfig h = parse_config_json(kHandJson, "hand.json");
  CHECK(h.resolve_schedule().pattern() == "FSFS");
  CHECK(decode_cost(h, h.resolve_schedule(), 10).total_flops() == 12756);
  // indexer_types like the GLM-5.2 HF config; null pattern = not set; name from the file name.
  const ModelConfig t = parse_config_json(R"({"n_layers": 4, "dim": 16, "vocab": 100, "n_heads": 2,
    "q_lora_rank": 8, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4,
    "index_n_heads": 2, "index_head_dim": 4, "index_topk": 3, "n_routed_experts": 4, "n_shared_experts": 1,
    "n_activated_experts": 1, "moe_inter_dim": 3, "first_k_dense": 1, "dense_inter_dim": 5,
    "index_topk_pattern": null, "indexer_types": ["full", "full", "shared", "full"]})",
                                          "/some/dir/mine.json");
  CHECK(t.name == "mine");
  CHECK(t.resolve_schedule().pattern() == "FFSF");
  const ModelConfig fr = parse_config_json(
      hand_json_with("\"index_topk_pattern\": \"FSFS\"", "\"index_topk_freq\": 4, \"index_skip_topk_offset\": 1"),
      "f.json");
  CHECK(fr.resolve_schedule().pattern() == "FSSS");
}

TEST_CASE("cost: JSON config errors name the file and the field") {
  auto with = hand_json_with;
  std::string e = config_error(with("\"dim\": 16, ", ""));
  CHECK(e.find("cfg.json") != std::string::npos);
  CHECK(e.find("'dim'") != std::string::npos);
  CHECK(e.find("missing") != std::string::npos);
  e = config_error(with("\"dim\": 16", "\"dim\": \"16\""));
  CHECK(e.find("'dim'") != std::string::npos);
  CHECK(e.find("integer") != std::string::npos);
  CHECK(config_error(with("\"dim\": 16", "\"dim\": 16.5")).find("'dim'") != std::string::npos);
  CHECK(config_error(with("\"dim\": 16", "\"dim\": 16.0")).empty());
  CHECK(config_error(with("\"dim\": 16", "\"dim\": 18446744073709551615")).find("'dim'") != std::string::npos);
  CHECK(config_error(with("\"dim\": 16", "\"dim\": 1e300")).find("'dim'") != std::string::npos);
  CHECK(config_error(with("\"n_layers\": 4", "\"n_layers\": 3000000000")).find("'n_layers'") != std::string::npos);
  e = config_error(with("\"dim\": 16", "\"dim\": 16, \"vocab_size\": 3"));
  CHECK(e.find("'vocab_size'") != std::string::npos);
  CHECK(e.find("unknown field") != std::string::npos);
  CHECK(config_error(with("\"dim\": 16", "\"dim\": 16, \"indexer_rope\": \"gptj\"")).find("'indexer_rope'") !=
        std::string::npos);
  CHECK(config_error(with("\"dim\": 16", "\"dim\": 16, \"yarn\": 1")).find("'yarn'") != std::string::npos);
  CHECK(config_error(with("\"dim\": 16", "\"dim\": 16, \"rope_theta\": \"big\"")).find("'rope_theta'") !=
        std::string::npos);
  CHECK(config_error(with("\"FSFS\"", "\"FSF\"")).find("pattern") != std::string::npos);
  CHECK(config_error(with("\"FSFS\"", "\"SFFF\"")).find("cfg.json") != std::string::npos);
  CHECK(config_error(with("\"index_topk_pattern\": \"FSFS\"", "\"indexer_types\": [\"full\", 3]"))
            .find("'indexer_types[1]'") != std::string::npos);
  CHECK(config_error(with("\"n_heads\": 2", "\"n_heads\": 0")).find("n_heads") != std::string::npos);
  CHECK(config_error(with("\"n_activated_experts\": 1", "\"n_activated_experts\": 9")).find("n_activated_experts") !=
        std::string::npos);
  CHECK(config_error("[1, 2]").find("JSON object") != std::string::npos);
  CHECK(config_error("{").find("not valid JSON") != std::string::npos);
  CHECK_THROWS_WITH_AS(load_config_json(temp_path("missing.json")), doctest::Contains("missing.json"), Error);
}

TEST_CASE("cost: CLI prints the tables, writes JSON and rejects bad input") {
  Result r = cli("cost --model glm-5.2 --context 4K,1M --alternatives");
  CHECK(r.status == 0);
  CHECK(r.out.find("schedule  FFFSSSFSSS") != std::string::npos);
  CHECK(r.out.find("decode:") != std::string::npos);
  CHECK(r.out.find("prefill:") != std::string::npos);
  CHECK(r.out.find("indexer_score") != std::string::npos);
  CHECK(r.out.find("attention-only") != std::string::npos);

  const std::string js = temp_path("out.json"), cfg = temp_path("hand.json");
  write_file(cfg, kHandJson);
  r = cli("cost --config " + cfg + " --context 10 --mode decode --json " + js);
  CHECK(r.status == 0);
  std::ifstream f(js);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(text);
  CHECK(j["model"] == "hand");
  CHECK(j["schedule"] == "FSFS");
  CHECK(j["decode"][0]["context"] == 10);
  CHECK(j["decode"][0]["schedule"]["total_flops"] == 12756.0);
  CHECK(j["decode"][0]["all_full"]["total_flops"] == 13736.0);
  CHECK(j["decode"][0]["flops_ratio"].get<double>() == doctest::Approx(13736.0 / 12756.0));
  CHECK(j["decode"][0]["schedule"]["items"].size() == 7);
  CHECK(!j.contains("prefill"));
  CHECK(j["alternatives"][0]["name"] == "default");
  std::remove(js.c_str());

  r = cli("cost --config " + cfg + " --print-config");
  CHECK(r.status == 0);
  CHECK(r.out.find("\"index_topk_pattern\": \"FSFS\"") != std::string::npos);
  std::remove(cfg.c_str());

  CHECK(cli("cost").status == 2);
  CHECK(cli("cost --model glm-5.2 --config x.json").status == 2);
  r = cli("cost --model nope");
  CHECK(r.status == 2);
  CHECK(r.out.find("'nope'") != std::string::npos);
  r = cli("cost --model glm-5.2 --context 4K,12Q");
  CHECK(r.status == 2);
  CHECK(r.out.find("'12Q'") != std::string::npos);
  r = cli("cost --model glm-5.2 --schedule FFS");
  CHECK(r.status == 2);
  r = cli("cost --model glm-5.2 --mode sideways");
  CHECK(r.status == 2);
  CHECK(r.out.find("'sideways'") != std::string::npos);
  r = cli("cost --config /nonexistent/cfg.json");
  CHECK(r.status == 2);
  CHECK(r.out.find("/nonexistent/cfg.json") != std::string::npos);
}
