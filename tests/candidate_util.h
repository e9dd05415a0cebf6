// A candidate under construction for diff's tests: tensors by name, written to a temporary
// safetensors file and read back as the judge reads a candidate file; and what the judge tests
// read of a result (verdict, diagnosed), the Error a call throws (error_of), temporary paths and a
// file's bytes.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
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
#include "tools/judge/emulate.h"
#include "tools/judge/precision.h"
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

// A streamed writer's plan (golden::v4_plan, kpool_plan) against the built set: every tensor's
// name, dtype, shape and role, in file order.
inline void check_plan(const std::vector<golden::SetWriter::Planned>& plan, const golden::GoldenSet& set) {
  REQUIRE(plan.size() == set.tensors.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    CAPTURE(set.tensors[i].name);
    CHECK(plan[i].spec.name == set.tensors[i].name);
    CHECK(plan[i].spec.dtype == set.tensors[i].dtype);
    CHECK(plan[i].spec.shape == set.tensors[i].shape);
    CHECK(plan[i].role == set.roles.at(set.tensors[i].name));
  }
}
// Two set folders hold the same bytes (tensor file and manifest), and the second reads back with
// every hash checked; both are removed.
inline void check_same_set(const std::string& a, const std::string& b) {
  CHECK(file_bytes(a + "/tensors.safetensors") == file_bytes(b + "/tensors.safetensors"));
  CHECK(file_bytes(a + "/manifest.json") == file_bytes(b + "/manifest.json"));
  CHECK(golden::read(b).manifest == golden::read(a).manifest);
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
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

// A top-k over f32 scores (V4's blocks, HY V4's top-k, KPool's pools) held to the f32 contract, on a
// set whose rows have near ties: for every correct f32 kernel of emul::scores_family (its scores by
// `scores_of`, its positions by `select` of them) the candidate {scores, positions} passes; the
// positions selected from the golden scores rounded to f16 or bf16 fail, named, alone and with
// those scores. Returns how many of the f32 kernels' and the rounded scores' selections moved as
// sets (the caller checks that the set exercises the near ties at all).
struct ValuesTopk {
  const golden::Loaded& g;
  int layer;
  std::string scores, positions;  // "indexer.scores", "indexer.blocks"
  std::function<Tensor<float>(const emul::LogitsVariant&)> scores_of;
  std::function<Tensor<int32_t>(const Tensor<float>&)> select;
};
// Whether some row of a and b [rows, k] holds other positions (as sets: slot order aside).
inline bool rows_differ(const Tensor<int32_t>& a, const Tensor<int32_t>& b) {
  const int64_t k = a.dim(1);
  for (int64_t t = 0; t < a.dim(0); ++t) {
    std::vector<int32_t> x(&a[t * k], &a[t * k] + k), y(&b[t * k], &b[t * k] + k);
    std::sort(x.begin(), x.end());
    std::sort(y.begin(), y.end());
    if (x != y) return true;
  }
  return false;
}
inline std::pair<int, int> check_values_topk(const ValuesTopk& c) {
  const std::string P = "layers." + std::to_string(c.layer) + ".";
  const Tensor<float> gold = c.g.tensor<float>(P + c.scores);
  const Tensor<int32_t> gold_pos = c.g.tensor<int32_t>(P + c.positions);
  REQUIRE(c.select(gold).data == gold_pos.data);
  std::pair<int, int> moved{0, 0};
  for (const emul::LogitsVariant& v : emul::scores_family()) {
    CAPTURE(v.name());
    const Tensor<float> s = c.scores_of(v);
    Candidate cand;
    cand.set(P + c.scores, s);
    cand.set(P + c.positions, c.select(s));
    moved.first += rows_differ(c.select(s), gold_pos);
    const diff::Result r = diff::judge(c.g, cand.file(), {});
    CHECK_MESSAGE(!r.failed(), r.text("replay"));
  }
  for (const int bits : {11, 8}) {
    const std::string cls = bits == 11 ? "f16" : "bf16";
    CAPTURE(cls);
    Tensor<float> low = gold;
    for (float& x : low.data) x = float(prec::round_bits(double(x), bits));
    const Tensor<int32_t> pos = c.select(low);
    if (!rows_differ(pos, gold_pos)) continue;  // the rounding reordered tied slots at most
    ++moved.second;
    for (const bool with_scores : {false, true}) {
      CAPTURE(with_scores);
      Candidate cand;
      cand.set(P + c.positions, pos);
      if (with_scores) cand.set(P + c.scores, low);
      const diff::Result r = diff::judge(c.g, cand.file(), {});
      CHECK_MESSAGE(verdict(r, c.layer, c.positions) == cmp::Verdict::fail, r.text("replay"));
      CHECK_MESSAGE(diagnosed(r, c.positions + " is the top-k of the scores rounded to"), r.text("replay"));
    }
  }
  return moved;
}

}  // namespace indexshare::testing
