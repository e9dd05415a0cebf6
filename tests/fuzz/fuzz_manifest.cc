// libFuzzer target: the golden-set manifest reader (tools/lib/golden.h, golden::read). The input is
// written as manifest.json into a scratch folder next to a fixed, valid tensors.safetensors (a
// link to that of the small golden set tests/fuzz/golden/edge, kind attention-edge), then the folder
// is read and verified. The seed corpus holds that set's manifest and variants of it, so the fuzzer
// starts past the SHA-256 checks.
//
// A set that golden::read accepts must satisfy what read promises (every manifest tensor is in the
// file with the same dtype, and the counts agree), and the consumers of the manifest must treat the
// rest of it as untrusted input too: golden::summary (verify) and diff::judge with a fixed faithful
// candidate (tests/fuzz/corpus/fuzz_diff/edge-faithful) may refuse it with Error, nothing else.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/fuzz/fuzz_common.h"
#include "tools/judge/diff.h"
#include "tools/lib/golden.h"

using namespace indexshare;
namespace fs = std::filesystem;

namespace {

const std::string& set_dir() {
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir("fuzz_manifest");
    const fs::path src = fs::path(INDEXSHARE_SOURCE_DIR) / "tests" / "fuzz" / "golden" / "edge" / golden::kTensorFile;
    if (!fs::exists(src)) fuzz::finding("fuzz_manifest: " + src.string() + " is missing");
    fs::create_symlink(src, fs::path(d) / golden::kTensorFile);
    return d;
  }();
  return dir;
}

const io::SafetensorsFile& candidate() {
  static const io::SafetensorsFile c = [] {
    try {
      return io::read_safetensors(std::string(INDEXSHARE_SOURCE_DIR) + "/tests/fuzz/corpus/fuzz_diff/edge-faithful");
    } catch (const Error& e) {
      fuzz::finding(std::string("fuzz_manifest: ") + e.what());
    }
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::string& dir = set_dir();
  const io::SafetensorsFile& cand = candidate();
  {
    const std::string path = dir + "/manifest.json";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0)
      fuzz::finding("fuzz_manifest: cannot write " + path);
  }
  fuzz::guarded("fuzz_manifest", [&] {
    const golden::Loaded g = golden::read(dir);
    const nlohmann::json& list = g.manifest.at("tensors");
    if (list.size() != g.data.tensors.size()) fuzz::finding("accepted a manifest with a different tensor count");
    for (const nlohmann::json& t : list) {
      const io::TensorView& v = g.get(t.at("name").get<std::string>());
      if (io::dtype_name(v.dtype) != t.at("dtype").get<std::string>())
        fuzz::finding("accepted a dtype mismatch for '" + v.name + "'");
    }
    (void)golden::summary(g);
    const diff::Result r = diff::judge(g, cand, {});
    (void)r.text("replay");
  });
  return 0;
}
