// Tests of tools/golden: writing, reading and verifying golden sets, and refusing bad ones.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include "ref/stack.h"
#include "tests/cli_util.h"
#include "tools/lib/golden.h"

using namespace indexshare;
namespace fs = std::filesystem;

namespace {
struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() / ("indexshare-golden-test-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { std::error_code ec; fs::remove_all(path, ec); }
  static int& counter() { static int c = 0; return c; }
};
const char* kSmall = "sq4 skv12 hq2 dqk16 dv8 ih2 id16 k4 seed3 nl3 sched=FSF";
golden::GoldenSet small_set(const std::string& replay = "replay") {
  return golden::build(parse_problem(kSmall), "stack", true, replay);
}
void edit_manifest(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "manifest.json");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  const auto pos = s.find(from);
  REQUIRE(pos != std::string::npos);
  s.replace(pos, from.size(), to);
  std::ofstream(dir / "manifest.json") << s;
}
}  // namespace

TEST_CASE("golden: a written set reads back with every tensor verified") {
  TmpDir tmp;
  const fs::path dir = tmp.path / "set";
  golden::write(dir.string(), small_set(), false);
  const golden::Loaded g = golden::read(dir.string());
  CHECK(g.manifest["kind"] == "stack");
  CHECK(g.manifest["layers"].size() == 3);
  CHECK(g.manifest["layers"][1]["kind"] == "shared");
  CHECK(g.manifest["layers"][1]["source"] == 0);
  CHECK(g.manifest["conventions"]["lse_base"] == "e");
  // The tensors equal a direct run of the stack.
  const Problem p = parse_problem(kSmall);
  const auto in = ref::make_stack_inputs(p, p.schedule());
  const auto out = ref::run_stack(p, p.schedule(), in);
  CHECK(g.tensor<float>("layers.1.attn.out").data == out[1].attn.out.data);
  CHECK(g.tensor<int32_t>("layers.1.attn.indices").data == out[0].indices.data);
  CHECK(g.tensor<int32_t>("layers.2.indexer.topk").data == out[2].own_topk.data);
  CHECK(g.tensor<e4m3_t>("layers.0.indexer.q").data == in[0].index_q8.data);
  // Writing the same set again gives the same bytes.
  golden::write((tmp.path / "again").string(), small_set(), false);
  CHECK(io::sha256_file((dir / golden::kTensorFile).string()) ==
        io::sha256_file((tmp.path / "again" / golden::kTensorFile).string()));
  // No temporary folder is left behind.
  for (const auto& e : fs::directory_iterator(tmp.path)) CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("golden: tampered, inconsistent or foreign sets are refused with the file and field named") {
  TmpDir tmp;
  const fs::path dir = tmp.path / "set";
  golden::write(dir.string(), small_set(), false);
  SUBCASE("a flipped byte in the tensor data: SHA-256 mismatch") {
    const fs::path f = dir / golden::kTensorFile;
    const auto size = fs::file_size(f);
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(std::streamoff(size - 3));
    char c;
    s.read(&c, 1);
    c ^= 0x10;
    s.seekp(std::streamoff(size - 3));
    s.write(&c, 1);
    s.close();
    CHECK_THROWS_WITH_AS(golden::read(dir.string()), doctest::Contains("tampered or corrupted"), Error);
  }
  SUBCASE("a manifest dtype that disagrees with the file") {
    edit_manifest(dir, "\"dtype\": \"F8_E4M3\"", "\"dtype\": \"F32\"");
    CHECK_THROWS_WITH_AS(golden::read(dir.string()), doctest::Contains("dtype F32 in the manifest"), Error);
  }
  SUBCASE("a manifest shape that disagrees with the file") {
    edit_manifest(dir, "\"shape\": [\n        4,\n        2,\n        16\n      ]", "\"shape\": [4, 2, 15]");
    CHECK_THROWS_WITH_AS(golden::read(dir.string()), doctest::Contains("shape [4,2,15] in the manifest"), Error);
  }
  SUBCASE("a tensor the manifest names but the file lacks") {
    edit_manifest(dir, "\"name\": \"layers.0.attn.lse\"", "\"name\": \"layers.0.attn.lse2\"");
    CHECK_THROWS_WITH_AS(golden::read(dir.string()), doctest::Contains("'layers.0.attn.lse2' named in the manifest is missing"), Error);
  }
  SUBCASE("another format version") {
    edit_manifest(dir, "\"format_version\": 1", "\"format_version\": 99");
    CHECK_THROWS_WITH_AS(golden::read(dir.string()), doctest::Contains("format_version"), Error);
  }
  SUBCASE("invalid JSON") {
    std::ofstream(dir / "manifest.json") << "{\"format\": ";
    CHECK_THROWS_WITH_AS(golden::read(dir.string()), doctest::Contains("manifest.json: invalid JSON"), Error);
  }
  SUBCASE("a missing tensor file") {
    fs::remove(dir / golden::kTensorFile);
    CHECK_THROWS_WITH_AS(golden::read(dir.string()), doctest::Contains(golden::kTensorFile), Error);
  }
  SUBCASE("not a folder") {
    CHECK_THROWS_WITH_AS(golden::read((tmp.path / "nothing").string()), doctest::Contains("not a golden set folder"), Error);
  }
}

TEST_CASE("golden: writing refuses to clobber, replaces with --force, and fails cleanly") {
  TmpDir tmp;
  const fs::path dir = tmp.path / "set";
  golden::write(dir.string(), small_set("first"), false);
  CHECK_THROWS_WITH_AS(golden::write(dir.string(), small_set("second"), false), doctest::Contains("--force"), Error);
  golden::write(dir.string(), small_set("second"), true);
  CHECK(golden::read(dir.string()).manifest["replay"] == "second");
  // --force never deletes a folder that is not a golden set.
  const fs::path other = tmp.path / "other";
  fs::create_directories(other);
  std::ofstream(other / "keep.txt") << "x";
  CHECK_THROWS_WITH_AS(golden::write(other.string(), small_set(), true), doctest::Contains("'keep.txt' is not one of its files"),
                       Error);
  CHECK(fs::exists(other / "keep.txt"));
  // An output under a regular file cannot be created: a clear error, nothing left behind.
  std::ofstream(tmp.path / "file") << "x";
  CHECK_THROWS_WITH_AS(golden::write((tmp.path / "file" / "set").string(), small_set(), false),
                       doctest::Contains("file"), Error);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) { (void)e; ++entries; }
  CHECK(entries == 3);  // set, other, file
}

TEST_CASE("golden: attention-edge sets carry the edge indices and topk_length") {
  const golden::GoldenSet g = golden::build(parse_problem("sq8 skv64 hq2 dqk16 dv8 ih2 id16 k8 seed5 sink=random"),
                                            "attention-edge", false, "r");
  const io::TensorView* ind = nullptr;
  const io::TensorView* tl = nullptr;
  for (const auto& v : g.tensors) {
    if (v.name == "layers.0.attn.indices") ind = &v;
    if (v.name == "layers.0.attn.topk_length") tl = &v;
    CHECK(v.name != "layers.0.indexer.logits");  // with_logits = false
  }
  REQUIRE(ind);
  REQUIRE(tl);
  const Tensor<int32_t> I = io::as_tensor<int32_t>(*ind, "x"), L = io::as_tensor<int32_t>(*tl, "x");
  for (int64_t j = 0; j < 8; ++j) CHECK(I[j] == -1);       // row 0: all invalid
  CHECK(I[8] == -1);                                        // row 1: leading -1
  CHECK(I[9] == -1);
  CHECK(I[3 * 8] == 64);                                    // row 3: >= s_kv
  CHECK(I[4 * 8 + 1] == I[4 * 8]);                          // row 4: duplicate
  CHECK(L[5] == 3);
  CHECK(L[6] == 0);
  CHECK_THROWS_WITH_AS(golden::preset("nope"), doctest::Contains("'nope'"), Error);
}

TEST_CASE("golden: --impl simd writes ref's budgets and tensors (edge rows, sinks, topk_length, every layer kind)") {
  // The budget comes from the low-precision emulation, on simd's kernel table with --impl simd: the
  // manifest must hold ref's numbers (only the generator field names the implementation).
  for (const auto& [problem, kind] : std::vector<std::pair<std::string, std::string>>{
           {"sq8 skv64 hq5 dqk40 dv24 ih2 id16 k8 seed5 sink=random", "attention-edge"},
           {"sq12 skv48 hq3 dqk576 dv512 ih4 id32 k16 seed8 nl3 sched=FSF nseq2", "stack"}}) {
    for (const bool logits : {true, false}) {  // without logits simd streams the indexer into the top-k
      CAPTURE(problem);
      CAPTURE(logits);
      const golden::GoldenSet r = golden::build(parse_problem(problem), kind, logits, "r");
      const golden::GoldenSet s = golden::build(parse_problem(problem), kind, logits, "r", Impl::simd);
      CHECK(r.manifest["budgets"].dump() == s.manifest["budgets"].dump());
      REQUIRE(r.tensors.size() == s.tensors.size());
      for (size_t i = 0; i < r.tensors.size(); ++i) CHECK(r.tensors[i].bytes == s.tensors[i].bytes);
    }
  }
}

TEST_CASE("golden: --from takes per-layer inputs dumped from a model and reproduces the generated stack") {
  TmpDir tmp;
  const Problem p = parse_problem("sq6 skv20 hq2 dqk16 dv8 ih2 id16 k4 seed7 nl3 sched=FSF own=no");
  const auto in = ref::make_stack_inputs(p, p.schedule());
  std::vector<io::TensorView> dump;
  for (int l = 0; l < 3; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    if (in[size_t(l)].has_indexer) {
      dump.push_back(io::make_view(pre + "indexer.q", in[size_t(l)].index_q8));
      dump.push_back(io::make_view(pre + "indexer.k", in[size_t(l)].index_k8));
      dump.push_back(io::make_view(pre + "indexer.k_scale", in[size_t(l)].index_k_scale));
      dump.push_back(io::make_view(pre + "indexer.weights", in[size_t(l)].index_weights));
      dump.push_back(io::make_view(pre + "indexer.ks", in[size_t(l)].ks));
      dump.push_back(io::make_view(pre + "indexer.ke", in[size_t(l)].ke));
    }
    dump.push_back(io::make_view(pre + "attn.q", in[size_t(l)].q));
    dump.push_back(io::make_view(pre + "attn.kv", in[size_t(l)].kv));
  }
  const std::string file = (tmp.path / "dump.safetensors").string();
  io::write_safetensors(file, dump);
  Problem options = parse_problem("sq1 skv1 k4 dv8 nl3 sched=FSF own=no");  // shapes come from the file
  const golden::GoldenSet a = golden::build_from(file, options, true, "r");
  const golden::GoldenSet b = golden::build(p, "stack", true, "r");
  std::map<std::string, io::TensorBytes> bb;
  for (const auto& v : b.tensors) bb[v.name] = v.bytes;
  for (const auto& v : a.tensors) {
    if (v.name.find("q_scale") != std::string::npos) continue;  // not in a dump: folded into the weights
    CAPTURE(v.name);
    CHECK(v.bytes == bb.at(v.name));
  }
  // A Full layer without indexer inputs, and a mis-shaped tensor, are refused naming the file.
  dump.erase(dump.begin());  // layers.0.indexer.q
  io::write_safetensors(file, dump);
  CHECK_THROWS_WITH_AS(golden::build_from(file, options, true, "r"), doctest::Contains("layers.0.indexer.q"), Error);
}

// ---- hostile manifests and dumps (each case below was accepted, or crashed, before its check) ----

namespace {
std::string source_golden(const std::string& name) { return std::string(INDEXSHARE_SOURCE_DIR) + "/golden/" + name; }
// A copy of a checked-in golden set, to mutate.
std::string copy_golden(const std::string& name, const fs::path& dir) {
  fs::create_directories(dir);
  for (const char* f : {"manifest.json", golden::kTensorFile}) fs::copy_file(source_golden(name) + "/" + f, dir / f);
  return dir.string();
}
nlohmann::json load_manifest(const fs::path& dir) {
  std::ifstream in(dir / "manifest.json");
  return nlohmann::json::parse(in);
}
void save_manifest(const fs::path& dir, const nlohmann::json& m) { std::ofstream(dir / "manifest.json") << m.dump(2); }
// The message golden::read refuses `dir` with ("" when it accepts it).
std::string read_error(const fs::path& dir) {
  try {
    golden::read(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
size_t tensor_index(const nlohmann::json& m, const std::string& name) {
  for (size_t i = 0; i < m["tensors"].size(); ++i)
    if (m["tensors"][i]["name"] == name) return i;
  FAIL("no tensor " << name);
  return 0;
}
}  // namespace

// Manifests written before floats printed in their shortest form spell them with 9 significant
// digits: those replay lines still regenerate the checked-in tensors bit for bit, and the manifest
// they write now holds the checked-in (shortest) problem string.
TEST_CASE("golden: the 9-digit replay lines of older manifests regenerate the checked-in sets") {
  const std::pair<const char*, std::string> old_replays[] = {
      {"glm-5.2-drift", "--problem \"sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed8 nl8 sched=glm-5.2 sim=0 drift=0.980000019 "
                        "jumps=0.150000006 recency=0.25 sinks=2\" --kind stack"},
      {"glm-5.2", "--problem \"sq16 skv96 hq2 dqk576 dv512 ih32 id128 k24 seed2 nl8 sched=glm-5.2 sim=0.850000024 recency=0.25 "
                  "sinks=2\" --kind stack"},
      {"deepseek-v3.2", "--problem \"sq16 skv256 hq4 dqk576 dv512 ih64 id128 k32 seed1 nl3 sim=0.850000024 recency=0.25 sinks=2 "
                        "nseq2\" --kind stack"},
      {"module-tiny-glm", "--model tiny-glm --seed 1 --sim 0.800000012 --variant deepseek_fp8"}};
  TmpDir t;
  for (const auto& [name, args] : old_replays) {
    const std::string set = name;
    CAPTURE(set);
    const fs::path out = t.path / name;
    const testing::CliResult r = testing::run_cli("golden " + args + " --out " + out.string());
    REQUIRE_MESSAGE(r.status == 0, r.out);
    const nlohmann::json got = load_manifest(out), want = load_manifest(source_golden(name));
    CHECK(got["tensors"] == want["tensors"]);  // names, dtypes, shapes and SHA-256
    CHECK(got["problem"] == want["problem"]);
    CHECK(got["problem"].get<std::string>().find("0000") == std::string::npos);
  }
}

TEST_CASE("golden: manifests write f32 fields in their shortest text, and older manifests' long texts still read and replay") {
  // f32_json: an f32 value's shortest text; a double that is not an f32 (a budget) is left alone.
  CHECK(f32_json(double(1.0f / 24.0f)) == 0.041666668);
  CHECK(float(f32_json(double(1.0f / 24.0f))) == 1.0f / 24.0f);
  CHECK(f32_json(0.1) == 0.1);
  for (uint32_t bits = 0x3a000000u; bits < 0x3a000000u + 200000u; bits += 7) {  // f32 values round trip
    float v;
    std::memcpy(&v, &bits, 4);
    REQUIRE(float(f32_json(double(v))) == v);
  }
  TmpDir t;
  const fs::path out = t.path / "ties";
  const testing::CliResult r = testing::run_cli("golden --preset ties --out " + out.string());
  REQUIRE_MESSAGE(r.status == 0, r.out);
  std::ifstream in(out / "manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  CHECK(text.find("\"sm_scale\": 0.041666668,") != std::string::npos);
  CHECK(text.find("0.0416666679084301") == std::string::npos);
  // The text an older version wrote (every digit of the widened f32) reads back as the same f32,
  // and the set still reads, every tensor verified.
  const size_t at = text.find("0.041666668,");
  text.replace(at, 12, "0.0416666679084301,");
  std::ofstream(out / "manifest.json") << text;
  const golden::Loaded g = golden::read(out.string());
  CHECK(g.manifest["config"]["sm_scale"].get<float>() == 1.0f / 24.0f);
  g.verify_rest();
}

TEST_CASE("golden: manifest config, layers, roles, kind and budgets are checked, naming the field") {
  TmpDir tmp;
  const std::string ties = copy_golden("ties", tmp.path / "ties");
  const std::string mpath = ties + "/manifest.json";
  const nlohmann::json original = load_manifest(ties);
  REQUIRE(read_error(ties).empty());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::string message;
  };
  const Case cases[] = {
      {"n_layers 0", [](nlohmann::json& m) { m["config"]["n_layers"] = 0; }, "field 'config.n_layers' must be >= 1, got 0"},
      {"n_layers 2 for 1 layer", [](nlohmann::json& m) { m["config"]["n_layers"] = 2; },
       "field 'config.n_layers' is 2, but field 'layers' lists 1 layers"},
      {"n_seqs 0", [](nlohmann::json& m) { m["config"]["n_seqs"] = 0; }, "field 'config.n_seqs' must be >= 1, got 0"},
      {"n_seqs 3 (does not divide)", [](nlohmann::json& m) { m["config"]["n_seqs"] = 3; }, "field 'config.n_seqs' is 3: it must divide"},
      {"n_seqs 2 while cu_seqlens hold one sequence", [](nlohmann::json& m) { m["config"]["n_seqs"] = 2; m["config"]["start_pos"] = 40; },
       "field 'config.n_seqs' disagrees with tensor 'cu_seqlens_q': expected I32 [3], the set holds I32 [2]"},
      {"indexer bogus", [](nlohmann::json& m) { m["config"]["indexer"] = "bogus"; },
       "field 'config.indexer' is \"bogus\", not \"fp8\" or \"bf16\""},
      {"indexer bf16 for FP8 tensors", [](nlohmann::json& m) { m["config"]["indexer"] = "bf16"; },
       "field 'config.s_q/index_n_heads/index_head_dim/indexer' disagrees with tensor 'layers.0.indexer.q': expected BF16 [16,4,16], "
       "the set holds F8_E4M3 [16,4,16]"},
      {"index_n_heads wrong", [](nlohmann::json& m) { m["config"]["index_n_heads"] = 5; },
       "disagrees with tensor 'layers.0.indexer.q': expected F8_E4M3 [16,5,16]"},
      {"seed -4", [](nlohmann::json& m) { m["config"]["seed"] = -4; }, "field 'config.seed' is not an integer >= 0"},
      {"seed 2^64 - 1", [](nlohmann::json& m) { m["config"]["seed"] = std::numeric_limits<uint64_t>::max(); },
       "field 'config.seed' is not an integer >= 0"},
      {"start_pos -1", [](nlohmann::json& m) { m["config"]["start_pos"] = -1; },
       "field 'config.start_pos' is -1, expected (config.s_kv - config.s_q) / config.n_seqs = 80"},
      {"start_pos 3", [](nlohmann::json& m) { m["config"]["start_pos"] = 3; }, "field 'config.start_pos' is 3, expected"},
      {"start_pos a string", [](nlohmann::json& m) { m["config"]["start_pos"] = "80"; },
       "field 'config.start_pos' is missing or not an integer"},
      {"index_head_dim beyond exact FP8 dots", [](nlohmann::json& m) { m["config"]["index_head_dim"] = 1 << 18; },
       "field 'config.index_head_dim' must be <= 131072"},
      {"layers[0].index 3", [](nlohmann::json& m) { m["layers"][0]["index"] = 3; }, "field 'layers[0].index' is 3, not its position 0"},
      {"layers[0].has_indexer false on a Full layer", [](nlohmann::json& m) { m["layers"][0]["has_indexer"] = false; },
       "field 'layers[0].has_indexer' is false on a Full layer"},
      {"layers[0].has_indexer not a boolean", [](nlohmann::json& m) { m["layers"][0]["has_indexer"] = 1; },
       "field 'layers[0].has_indexer' is missing or not true / false"},
      {"an unknown role", [](nlohmann::json& m) { m["tensors"][tensor_index(m, "layers.0.attn.q")]["role"] = "bogus"; },
       "('layers.0.attn.q'): field 'role' is 'bogus', not input, output or reference"},
      {"an input called an output", [](nlohmann::json& m) { m["tensors"][tensor_index(m, "layers.0.attn.q")]["role"] = "output"; },
       "].role' is 'output', but 'layers.0.attn.q' is input"},
      {"budget multiple -4", [](nlohmann::json& m) { m["budgets"]["layers.0.attn.out"]["multiple"] = -4; },
       "field 'budgets.layers.0.attn.out.multiple' must be a finite number > 0, got -4"},
      {"budget multiple missing", [](nlohmann::json& m) { m["budgets"]["layers.0.attn.out"].erase("multiple"); },
       "field 'budgets.layers.0.attn.out.multiple' is missing or not a number"},
      {"a budget of no layer", [](nlohmann::json& m) { m["budgets"]["layers.7.attn.out"] = m["budgets"]["layers.0.attn.out"]; },
       "field 'budgets.layers.7.attn.out' is not a budget of a layer's attn.out"},
      {"no budget for layer 0", [](nlohmann::json& m) { m["budgets"] = nlohmann::json::object(); },
       "field 'budgets' has no entry 'layers.0.attn.out'"},
      {"conventions missing", [](nlohmann::json& m) { m.erase("conventions"); }, "field 'conventions' is missing or not an object"},
      {"generator a number", [](nlohmann::json& m) { m["generator"] = 1; }, "field 'generator' is missing or not a string"},
      {"format_version 2^32 + 1 (was read as int 1)", [](nlohmann::json& m) { m["format_version"] = (int64_t(1) << 32) + 1; },
       "field 'format_version' is 4294967297"},
      {"kind stack -> decode", [](nlohmann::json& m) { m["kind"] = "decode"; },
       "field 'kind' is 'decode', but tensor 'layers.0.attn.kv_cache_fp8' is missing (a decode set holds it)"},
      {"kind stack -> attention-edge", [](nlohmann::json& m) { m["kind"] = "attention-edge"; },
       "field 'kind' is 'attention-edge', but tensor 'layers.0.attn.topk_length' is missing"},
      {"kind stack -> module", [](nlohmann::json& m) { m["kind"] = "module"; }, "field 'kind' is 'module', but tensor 'layers.0.hidden_in' is missing"},
      {"kind stack -> stack-from-file", [](nlohmann::json& m) { m["kind"] = "stack-from-file"; },
       "field 'source_file' is missing or not a string"},
      {"a model_config on a kernel-level set", [](nlohmann::json& m) { m["model_config"] = nlohmann::json::object(); },
       "field 'model_config' is present, but kind is 'stack'"},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    nlohmann::json m = original;
    c.edit(m);
    save_manifest(ties, m);
    const std::string err = read_error(ties);
    CHECK(err.find(mpath) == 0);
    CHECK(err.find(c.message) != std::string::npos);
    if (err.find(c.message) == std::string::npos) MESSAGE(err);
  }
  // A kind whose tensors are not there, the other way round: another kind's tensors in the set.
  const std::pair<const char*, const char*> kinds[] = {{"attention-edge", "'layers.0.attn.topk_length', which only sets of kind attention-edge hold"},
                                                       {"decode", "'block_table', which only sets of kind decode hold"},
                                                       {"module-tiny-glm", "which only sets of kind module hold"}};
  for (const auto& [name, message] : kinds) {
    const std::string set = name;
    CAPTURE(set);
    const std::string dir = copy_golden(name, tmp.path / name);
    REQUIRE(read_error(dir).empty());
    nlohmann::json m = load_manifest(dir);
    m["kind"] = "stack";
    m.erase("model_config");
    save_manifest(dir, m);
    const std::string err = read_error(dir);
    CHECK(err.find(std::string("field 'kind' is 'stack', but the set holds tensor ")) != std::string::npos);
    CHECK(err.find(message) != std::string::npos);
  }
  // The seed rule is one: what overlap --golden (stack_inputs_of) refused, read now refuses first,
  // with the same words.
  nlohmann::json m = original;
  m["config"]["seed"] = -4;
  save_manifest(ties, m);
  CHECK_THROWS_WITH_AS(golden::stack_inputs_of(golden::read(ties)), doctest::Contains("field 'config.seed' is not an integer >= 0"), Error);
  // The module set's model_config must agree with its config.
  const std::string mod = copy_golden("module-tiny-glm", tmp.path / "module");
  m = load_manifest(mod);
  m["model_config"]["index_topk"] = 8;
  save_manifest(mod, m);
  CHECK(read_error(mod).find("field 'config.topk' is 16, but field 'model_config' gives 8") != std::string::npos);
}

TEST_CASE("golden: duplicate manifest keys, repeated tensor entries and a manifest that is not a file are refused") {
  TmpDir tmp;
  const std::string ties = copy_golden("ties", tmp.path / "ties");
  const std::string mpath = ties + "/manifest.json";
  std::string text;
  {
    std::ifstream in(mpath);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = text;
    const auto pos = s.find(from);
    REQUIRE(pos != std::string::npos);
    s.replace(pos, from.size(), to);
    std::ofstream(mpath) << s;
  };
  // nlohmann keeps the last duplicate silently: a second "seed", "kind" or "role" would win unseen.
  with("\"seed\": 3,", "\"seed\": 3, \"seed\": 4,");
  CHECK(read_error(ties) == mpath + ": duplicate key 'config.seed' (each key may appear once)");
  with("\"kind\": \"stack\",", "\"kind\": \"stack\", \"kind\": \"decode\",");
  CHECK(read_error(ties) == mpath + ": duplicate key 'kind' (each key may appear once)");
  with("\"role\": \"input\",", "\"role\": \"input\", \"role\": \"output\",");
  CHECK(read_error(ties) == mpath + ": duplicate key 'tensors[0].role' (each key may appear once)");
  with("\"budget_max_abs\"", "\"budget_max_abs\": 1, \"budget_max_abs\"");
  CHECK(read_error(ties) == mpath + ": duplicate key 'budgets.layers.0.attn.out.budget_max_abs' (each key may appear once)");
  std::ofstream(mpath) << text;
  REQUIRE(read_error(ties).empty());
  // One tensor listed twice and another not at all: the counts agree, the file's tensor was unlisted.
  nlohmann::json m = load_manifest(ties);
  m["tensors"][1] = m["tensors"][0];
  save_manifest(ties, m);
  CHECK(read_error(ties).find("tensors[1] ('" + m["tensors"][0]["name"].get<std::string>() + "'): field 'name' repeats tensors[0]") !=
        std::string::npos);
  // A folder named manifest.json was "invalid JSON ... unexpected end of input".
  fs::remove(ties + "/manifest.json");
  fs::create_directories(ties + "/manifest.json");
  CHECK(read_error(ties) == mpath + ": not a regular file (a folder)");
}

namespace {
// The per-layer inputs of a small generated stack under the dump names of `golden --from`.
struct Dump {
  Problem p = parse_problem("sq6 skv20 hq2 dqk16 dv8 ih2 id16 k4 seed7 nl3 sched=FSF own=no sink=random");
  Problem options = parse_problem("sq1 skv1 k4 dv8 nl3 sched=FSF own=no");
  std::vector<io::TensorView> views;
  Dump() {
    const auto in = ref::make_stack_inputs(p, p.schedule());
    for (int l = 0; l < 3; ++l) {
      const std::string pre = "layers." + std::to_string(l) + ".";
      const ref::LayerInputs& x = in[size_t(l)];
      if (x.has_indexer) {
        views.push_back(io::make_view(pre + "indexer.q", x.index_q8));
        views.push_back(io::make_view(pre + "indexer.k", x.index_k8));
        views.push_back(io::make_view(pre + "indexer.k_scale", x.index_k_scale));
        views.push_back(io::make_view(pre + "indexer.weights", x.index_weights));
        views.push_back(io::make_view(pre + "indexer.ks", x.ks));
        views.push_back(io::make_view(pre + "indexer.ke", x.ke));
      }
      views.push_back(io::make_view(pre + "attn.q", x.q));
      views.push_back(io::make_view(pre + "attn.kv", x.kv));
      views.push_back(io::make_view(pre + "attn.sink", *x.sink));
    }
  }
  io::TensorView& get(const std::string& name) {
    for (io::TensorView& v : views)
      if (v.name == name) return v;
    FAIL("no tensor " << name);
    return views[0];
  }
};
template <class T>
void poke(io::TensorView& v, int64_t i, T value) { std::memcpy(v.bytes.mutable_data() + i * sizeof(T), &value, sizeof(T)); }
// The message build_from refuses the dump with ("" when it builds a set).
std::string from_error(const std::string& file, const std::vector<io::TensorView>& views, const Problem& options) {
  io::write_safetensors(file, views);
  try {
    golden::build_from(file, options, false, "r");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("golden: --from refuses NaN and inf in the attention and indexer inputs, naming file, tensor and element") {
  TmpDir tmp;
  const std::string file = (tmp.path / "dump.safetensors").string();
  Dump clean;
  REQUIRE(from_error(file, clean.views, clean.options).empty());
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* tensor;
    std::function<void(io::TensorView&)> poke;
    std::string message;
  };
  // attn.q [6,2,16]: flat 37 = [1,0,5]; attn.kv [20,1,16]: flat 100 = [6,0,4].
  const Case cases[] = {
      {"layers.1.attn.q", [](io::TensorView& v) { poke<uint16_t>(v, 37, 0x7FC0); }, "tensor 'layers.1.attn.q': element [1,0,5] is NaN (inputs must be finite)"},
      {"layers.0.attn.q", [](io::TensorView& v) { poke<uint16_t>(v, 0, 0xFF80); }, "tensor 'layers.0.attn.q': element [0,0,0] is -inf"},
      {"layers.2.attn.kv", [](io::TensorView& v) { poke<uint16_t>(v, 100, 0x7F80); }, "tensor 'layers.2.attn.kv': element [6,0,4] is +inf"},
      {"layers.0.attn.sink", [&](io::TensorView& v) { poke<float>(v, 1, nan); }, "tensor 'layers.0.attn.sink': element [1] is NaN"},
      {"layers.0.indexer.k_scale", [&](io::TensorView& v) { poke<float>(v, 3, nan); }, "tensor 'layers.0.indexer.k_scale': element [3] is NaN"},
      {"layers.2.indexer.weights", [&](io::TensorView& v) { poke<float>(v, 5, inf); }, "tensor 'layers.2.indexer.weights': element [2,1] is +inf"},
      {"layers.0.indexer.q", [](io::TensorView& v) { poke<uint8_t>(v, 2, 0x7F); }, "tensor 'layers.0.indexer.q': element [0,0,2] is NaN"},
      {"layers.0.indexer.k", [](io::TensorView& v) { poke<uint8_t>(v, 17, 0xFF); }, "tensor 'layers.0.indexer.k': element [1,1] is NaN"},
  };
  for (const Case& c : cases) {
    const std::string tensor = c.tensor;
    CAPTURE(tensor);
    Dump d;
    c.poke(d.get(c.tensor));
    const std::string err = from_error(file, d.views, d.options);
    CHECK(err.find(file + ": " + c.message) == 0);
    if (err.find(file + ": " + c.message) != 0) MESSAGE(err);
  }
  // A sink of +-inf is a defined input (the sink rule: +inf gives out 0, -inf leaves out unchanged).
  Dump d;
  poke<float>(d.get("layers.0.attn.sink"), 0, inf);
  poke<float>(d.get("layers.1.attn.sink"), 1, -inf);
  CHECK(from_error(file, d.views, d.options).empty());
}

TEST_CASE("golden: --from refuses tensor names it does not read, and still takes a golden set's own tensors") {
  TmpDir tmp;
  const std::string file = (tmp.path / "dump.safetensors").string();
  auto renamed = [](const std::string& from, const std::string& to) {
    Dump d;
    d.get(from).name = to;
    return d.views;
  };
  const Dump clean;
  const std::string known = "it reads layers.{l}.indexer.{q,k,k_scale,weights,ks,ke} and layers.{l}.attn.{q,kv,sink} for l in [0, 3), "
                            "cu_seqlens_q, cu_seqlens_k)";
  // A misspelt sink was silently left out: the set had no sink.
  CHECK(from_error(file, renamed("layers.1.attn.sink", "layers.1.attn.sinks"), clean.options) ==
        file + ": tensor 'layers.1.attn.sinks' is not an input this reader takes (" + known);
  // topk_length, q_scale, or anything else: the stack would not apply them.
  for (const char* extra : {"layers.0.attn.topk_length", "layers.0.indexer.q_scale", "layers.0.attn.indices", "foo"}) {
    const std::string tensor = extra;
    CAPTURE(tensor);
    std::vector<io::TensorView> v = clean.views;
    v.push_back(io::make_view(extra, Tensor<int32_t>({6}, 1)));
    CHECK(from_error(file, v, clean.options) == file + ": tensor '" + extra + "' is not an input this reader takes (" + known);
  }
  // Layers 0 and 2 only: layer 2 was silently dropped (the set had one layer).
  {
    std::vector<io::TensorView> v;
    for (const io::TensorView& t : clean.views)
      if (t.name.rfind("layers.1.", 0) != 0) v.push_back(t);
    const std::string err = from_error(file, v, parse_problem("sq1 skv1 k4 dv8 nl1"));
    CHECK(err.find(file + ": tensor 'layers.2.") == 0);
    CHECK(err.find("layer 2 is not read: layers must be numbered 0, 1, ... without gaps, and 'layers.1.attn.q' is missing") !=
          std::string::npos);
  }
  // Sequence boundaries: a rank-0 cu_seqlens_q was std::out_of_range (exit 3), unequal ones ignored.
  {
    std::vector<io::TensorView> v = clean.views;
    v.push_back(io::make_view("cu_seqlens_q", Tensor<int32_t>(Shape{}, 0)));
    CHECK(from_error(file, v, clean.options) == file + ": tensor 'cu_seqlens_q': expected I32 [n_seqs + 1] with n_seqs >= 1, got I32 []");
    Tensor<int32_t> cu({3});
    cu.data = {0, 2, 6};
    v.back() = io::make_view("cu_seqlens_q", cu);
    CHECK(from_error(file, v, clean.options).find(file + ": tensor 'cu_seqlens_q': element [1] is 2, expected 3 (the stack takes 2 sequences of equal length") == 0);
    cu.data = {0, 3, 6};
    v.back() = io::make_view("cu_seqlens_q", cu);
    CHECK(from_error(file, v, clean.options).empty());
    v.push_back(io::make_view("cu_seqlens_k", Tensor<int32_t>({2}, 0)));
    CHECK(from_error(file, v, clean.options).find("tensor 'cu_seqlens_k' [2] and tensor 'cu_seqlens_q' [3] disagree on the number of sequences") !=
          std::string::npos);
  }
  // A golden set's own tensors file (metadata format "indexshare-golden") is a valid dump of every
  // kind: its outputs, references and kind extras are known and ignored; overlap --golden reads
  // sets through the same loader.
  for (const char* name : {"ties", "glm-5.2", "attention-edge", "decode", "module-tiny-glm"}) {
    const std::string set = name;
    CAPTURE(set);
    const golden::Loaded g = golden::read(source_golden(name));
    CHECK_NOTHROW(golden::stack_inputs_of(g));
    const nlohmann::json& c = g.manifest["config"];
    std::string pattern;
    for (const auto& l : g.manifest["layers"]) pattern += l["kind"] == "full" ? 'F' : 'S';
    const Problem options = parse_problem("sq1 skv1 k" + std::to_string(c["topk"].get<int64_t>()) + " dv" +
                                          std::to_string(c["d_v"].get<int64_t>()) + " nl" + std::to_string(pattern.size()) +
                                          " sched=" + pattern);
    CHECK_NOTHROW(golden::build_from(source_golden(name) + "/" + golden::kTensorFile, options, false, "r"));
  }
  // ... but only the names a golden set holds: a misspelt one in a golden file is refused too.
  {
    const golden::Loaded g = golden::read(source_golden("ties"));
    std::vector<io::TensorView> v = g.data.tensors;
    v.push_back(io::make_view("layers.0.attn.sinks", Tensor<float>({2}, 0.0f)));
    const std::string golden_file = (tmp.path / "golden-copy.safetensors").string();
    io::write_safetensors(golden_file, v, {{"format", "indexshare-golden"}});
    CHECK_THROWS_WITH_AS(golden::build_from(golden_file, parse_problem("sq1 skv1 k16 dv512 nl1"), false, "r"),
                         doctest::Contains("tensor 'layers.0.attn.sinks' is not an input this reader takes"), Error);
    // Without the golden metadata the same file is a dump, and its outputs are not inputs.
    v.pop_back();
    io::write_safetensors(golden_file, v);
    CHECK_THROWS_WITH_AS(golden::build_from(golden_file, parse_problem("sq1 skv1 k16 dv512 nl1"), false, "r"),
                         doctest::Contains("is not an input this reader takes"), Error);
  }
}

// `golden --from` printed (and recorded as its replay line) the descriptor's default shapes
// (sq128 skv128 hq16 ...) instead of the file's; the manifest's problem was right.
TEST_CASE("golden: --from prints and replays the problem with the file's shapes") {
  TmpDir tmp;
  Dump d;
  const std::string file = (tmp.path / "dump.safetensors").string(), out = (tmp.path / "set").string();
  io::write_safetensors(file, d.views);
  const indexshare::testing::CliResult r =
      indexshare::testing::run_cli("golden --from " + file + " --problem 'k4 dv8 sched=FSF own=no' --out " + out);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  const std::string want = "sq6 skv20 hq2 dqk16 dv8 ih2 id16 k4";
  CHECK_MESSAGE(r.out.find("__REPRO: indexshare golden --from " + file + " --problem \"" + want) != std::string::npos, r.out);
  CHECK(r.out.find("sq128") == std::string::npos);
  const golden::Loaded g = golden::read(out);
  CHECK(g.manifest["replay"].get<std::string>().find(want) != std::string::npos);
}

// A partial --problem on a model dump completes the dump's recorded problem: the fields it does not
// give (here the schedule with its Shared layer) stay the dump's, and a field that contradicts the
// dump is refused with both values (before, --problem replaced the recorded problem whole).
TEST_CASE("golden: a partial --problem on a dump keeps the dump's fields and refuses contradictions") {
  TmpDir tmp;
  Dump d;
  const std::string file = (tmp.path / "dump.safetensors").string(), set = (tmp.path / "set").string();
  const std::map<std::string, std::string> meta = {{"format", golden::kDumpFormat}, {"problem", "k4 dv8 sched=FSF own=no"}};
  io::write_safetensors(file, d.views, meta);
  indexshare::testing::CliResult r = indexshare::testing::run_cli("golden --from " + file + " --problem 'k4 sm=0.25' --out " + set);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  const golden::Loaded g = golden::read(set);
  CHECK(g.manifest["layers"][1]["kind"] == "shared");
  CHECK(g.manifest["config"]["sm_scale"].get<double>() == 0.25);
  CHECK_MESSAGE(r.out.find("sched=FSF") != std::string::npos, r.out);
  r = indexshare::testing::run_cli("golden --from " + file + " --problem 'k2' --out " + set + "2");
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("--problem gives 'k2' but the dump") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("records 'k4'") != std::string::npos, r.out);
  CHECK(!std::filesystem::exists(set + "2"));
}

// The fields --problem leaves out are the dump's: the set is the one written without --problem, byte
// for byte (the recorded schedule, softmax scale and indexer mode kept), whichever agreeing fields it
// gives; a field the tensors fix (shapes, layers, indexer mode) is compared as the recorded ones are,
// on a model dump and on a plain file of inputs alike.
TEST_CASE("golden: a partial --problem on a dump writes the bytes of the dump's own problem, and names contradictions") {
  TmpDir tmp;
  Dump d;
  const std::string file = (tmp.path / "dump.safetensors").string(), plain = (tmp.path / "plain.safetensors").string();
  io::write_safetensors(file, d.views, {{"format", golden::kDumpFormat}, {"problem", "k4 dv8 sm=0.25 sched=FSF own=no"}});
  io::write_safetensors(plain, d.views);
  auto bytes = [](const std::string& dir) {
    std::ifstream in(dir + "/" + golden::kTensorFile, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto run = [&](const std::string& from, const std::string& problem, const std::string& out) {
    return indexshare::testing::run_cli("golden --from " + from + (problem.empty() ? "" : " --problem '" + problem + "'") + " --out " +
                                        (tmp.path / out).string());
  };
  indexshare::testing::CliResult r = run(file, "", "own");
  REQUIRE_MESSAGE(r.status == 0, r.out);
  const std::string own = bytes((tmp.path / "own").string());
  const golden::Loaded g = golden::read((tmp.path / "own").string());
  CHECK(g.manifest["config"]["sm_scale"].get<double>() == 0.25);
  CHECK(g.manifest["config"]["indexer"] == "fp8");
  int n = 0;
  for (const char* agree : {"k4", "dv8", "sm=0.250000000 sched=FSF", "sq6 skv20 nl3 indexer=fp8"}) {
    const std::string out = "agree" + std::to_string(n++);
    r = run(file, agree, out);
    REQUIRE_MESSAGE(r.status == 0, agree << ": " << r.out);
    CHECK_MESSAGE(bytes((tmp.path / out).string()) == own, agree);
  }
  const std::pair<std::string, std::string> refused[] = {
      {"k4 sm=0.3", "--problem gives 'sm=0.3' but the dump " + file + " records 'sm=0.25' (the model's own value)"},
      {"sched=FFF", "--problem gives 'sched=FFF' but the dump " + file + " records 'sched=FSF'"},
      {"dv16", "--problem gives 'dv16' but the dump " + file + " records 'dv8'"},
      {"sq8", "--problem gives 'sq8' but the dump " + file + " has 'sq6' (from its tensors)"},
      {"nl2", "--problem gives 'nl2' but the dump " + file + " has 'nl3' (from its tensors)"},
      {"indexer=bf16", "--problem gives 'indexer=bf16' but the dump " + file + " has 'indexer=fp8' (from its tensors)"}};
  for (const auto& [problem, want] : refused) {
    r = run(file, problem, "refused");
    CHECK_MESSAGE(r.status == 2, problem);
    CHECK_MESSAGE(r.out.find(want) != std::string::npos, r.out);
    CHECK(!std::filesystem::exists(tmp.path / "refused"));
  }
  // A plain file records no top-k, dv, sm or schedule (they are --problem's), but its tensors fix the rest.
  // (nl3 agrees with the file: compared within the whole problem, where dv8 fits the file's dqk16)
  r = run(plain, "k4 dv8 sm=0.25 nl3 sched=FSF own=no", "plain");
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK(bytes((tmp.path / "plain").string()) == own);
  r = run(plain, "k4 dv8 sched=FSF own=no hq4", "refused");
  CHECK(r.status == 2);
  CHECK_MESSAGE(r.out.find("--problem gives 'hq4' but the dump " + plain + " has 'hq2' (from its tensors)") != std::string::npos, r.out);
  CHECK(!std::filesystem::exists(tmp.path / "refused"));
}

// A model dump (python -m indexshare.dump, format indexshare-dump) records the problem it was taken
// with and carries the model's own choices under the names diff judges: --from reads the problem
// and passes over those names, and diff takes the dump itself as the candidate.
TEST_CASE("golden: a model dump carries its problem and the model's own choices, and diff judges it") {
  TmpDir tmp;
  Dump d;
  const std::string file = (tmp.path / "dump.safetensors").string(), set = (tmp.path / "set").string();
  const std::map<std::string, std::string> meta = {{"format", golden::kDumpFormat}, {"problem", "k4 dv8 sched=FSF own=no"}};
  io::write_safetensors(file, d.views, meta);
  // No --problem: the recorded one (k4, sched=FSF) is used and replayed.
  indexshare::testing::CliResult r = indexshare::testing::run_cli("golden --from " + file + " --out " + set);
  REQUIRE_MESSAGE(r.status == 0, r.out);
  CHECK_MESSAGE(r.out.find("k4") != std::string::npos, r.out);
  CHECK_MESSAGE(r.out.find("sched=FSF") != std::string::npos, r.out);
  const golden::Loaded g = golden::read(set);
  CHECK(g.manifest["layers"][1]["kind"] == "shared");

  // The model's choices (here: the golden's own, so the verdict is known) beside the inputs.
  std::vector<io::TensorView> with = d.views;
  for (int l = 0; l < 3; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    if (l != 1) with.push_back(io::make_view(pre + "indexer.topk", g.tensor<int32_t>(pre + "indexer.topk")));
    with.push_back(io::make_view(pre + "attn.indices", g.tensor<int32_t>(pre + "attn.indices")));
  }
  io::write_safetensors(file, with, meta);
  CHECK_NOTHROW(golden::build_from(file, d.options, false, "r"));
  r = indexshare::testing::run_cli("diff --golden " + set + " --candidate " + file);
  CHECK_MESSAGE(r.status == 0, r.out);
  CHECK_MESSAGE(r.out.find("layer  1 attn.indices     PASS") != std::string::npos, r.out);
  // A Shared layer handed another layer's positions fails.
  for (io::TensorView& v : with)
    if (v.name == "layers.1.attn.indices") {
      Tensor<int32_t> t = g.tensor<int32_t>("layers.1.attn.indices");
      std::swap(t[0], t[t.numel() - 1]);
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = t[i] >= 0 ? (t[i] + 1) % int32_t(d.p.s_kv) : t[i];
      v = io::make_view(v.name, t);
    }
  io::write_safetensors(file, with, meta);
  r = indexshare::testing::run_cli("diff --golden " + set + " --candidate " + file);
  CHECK_MESSAGE(r.status == 1, r.out);

  // Without the dump metadata the same names are refused, by --from and by diff.
  io::write_safetensors(file, with);
  CHECK_THROWS_WITH_AS(golden::build_from(file, d.options, false, "r"),
                       doctest::Contains("tensor 'layers.0.indexer.topk' is not an input this reader takes"), Error);
  r = indexshare::testing::run_cli("diff --golden " + set + " --candidate " + file);
  CHECK_MESSAGE(r.status == 2, r.out);
  CHECK_MESSAGE(r.out.find("is not a golden output name") != std::string::npos, r.out);
  // Other names stay refused in a dump, and a dump must record its problem.
  std::vector<io::TensorView> odd = d.views;
  odd.push_back(io::make_view("layers.0.attn.out", Tensor<float>({2}, 0.0f)));
  io::write_safetensors(file, odd, meta);
  CHECK_THROWS_WITH_AS(golden::build_from(file, d.options, false, "r"),
                       doctest::Contains("in a model dump also layers.{l}.indexer.{topk,logits}"), Error);
  io::write_safetensors(file, d.views, {{"format", golden::kDumpFormat}});
  r = indexshare::testing::run_cli("golden --from " + file + " --out " + (tmp.path / "set2").string());
  CHECK_MESSAGE(r.status == 2, r.out);
  CHECK_MESSAGE(r.out.find("metadata 'problem' is missing") != std::string::npos, r.out);
  io::write_safetensors(file, d.views, {{"format", golden::kDumpFormat}, {"problem", "k4 sched=FXF"}});
  r = indexshare::testing::run_cli("overlap --from " + file);
  CHECK_MESSAGE(r.status == 2, r.out);
  CHECK_MESSAGE(r.out.find(file + ": metadata 'problem': ") != std::string::npos, r.out);
}
