// Tests of tools/golden: writing, reading and verifying golden sets, and refusing bad ones.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "ref/stack.h"
#include "tools/golden.h"

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
  CHECK_THROWS_WITH_AS(golden::write(other.string(), small_set(), true), doctest::Contains("no manifest.json"), Error);
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
  std::map<std::string, std::vector<uint8_t>> bb;
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
