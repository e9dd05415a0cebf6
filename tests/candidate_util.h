// A candidate under construction for diff's tests: tensors by name, written to a temporary
// safetensors file and read back as the judge reads a candidate file; and what the judge tests
// read of a result (verdict, diagnosed), the Error a call throws (error_of), temporary paths and a
// file's bytes.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ref/error.h"
#include "tools/judge/diff.h"
#include "tools/lib/golden.h"
#include "tools/lib/run_report.h"
#include "tools/lib/safetensors.h"

namespace indexshare::testing {

struct Candidate {
  std::map<std::string, io::TensorView> t;
  template <class T>
  void set(const std::string& name, const Tensor<T>& v) { t[name] = io::make_view(name, v); }
  // The candidate file the CLI's diff reads.
  void write(const std::string& path) const {
    std::vector<io::TensorView> list;
    for (const auto& [name, v] : t) list.push_back(v);
    io::write_safetensors(path, list);
  }
  io::SafetensorsFile file() const {
    static std::atomic<int> n{0};
    const std::string path = std::filesystem::temp_directory_path() /
                             ("indexshare-cand-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".safetensors");
    write(path);
    io::SafetensorsFile f = io::read_safetensors(path);
    std::filesystem::remove(path);
    return f;
  }
};

// A fresh path in the temporary folder: indexshare-<prefix>-<pid>-<tag><n>.
inline std::string temp_path(const std::string& prefix, const std::string& tag) {
  static std::atomic<int> n{0};
  return (std::filesystem::temp_directory_path() /
          ("indexshare-" + prefix + "-" + std::to_string(::getpid()) + "-" + tag + std::to_string(n++)))
      .string();
}

// A golden set written to `dir` (replacing it) and read back as the tools read it.
struct WrittenSet {
  std::string dir;
  golden::Loaded g;
};
inline WrittenSet written(const std::string& dir, golden::GoldenSet set) {
  golden::write(dir, std::move(set), true);
  return WrittenSet{dir, golden::read(dir)};
}

// The bytes of a file ("" when it cannot be read).
inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Calls f and returns the Error message ("" when nothing was thrown).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The verdict r holds for tensor `name` of `layer`; a test failure when it holds none.
inline cmp::Verdict verdict(const diff::Result& r, int layer, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.layer == layer && t.name == name) return t.report.verdict;
  FAIL("no result for layer " << layer << " " << name);
  return cmp::Verdict::fail;
}

// Whether one of r's diagnoses contains `needle`.
inline bool diagnosed(const diff::Result& r, const std::string& needle) {
  for (const std::string& d : r.diagnoses)
    if (d.find(needle) != std::string::npos) return true;
  return false;
}

// r's diagnoses, one a line (for a failing check's message).
inline std::string diagnoses_text(const diff::Result& r) {
  std::string s;
  for (const std::string& d : r.diagnoses) s += d + "\n";
  return s;
}

// run's "fingerprint %016llx" text of f32 tensor `name` of a built set (tools/lib/run_report.h
// LayerFold, as run folds a layer's output); "" when the set has no such tensor.
inline std::string fingerprint_text(const golden::GoldenSet& g, const std::string& name) {
  for (const io::TensorView& t : g.tensors)
    if (t.name == name) {
      run_report::LayerFold f;
      f.add_out(std::span<const float>(reinterpret_cast<const float*>(t.bytes.data()), t.bytes.size() / 4));
      char fp[32];
      std::snprintf(fp, sizeof fp, "fingerprint %016llx", (unsigned long long)f.fp());
      return fp;
    }
  return "";
}

}  // namespace indexshare::testing
