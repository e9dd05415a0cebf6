// A candidate under construction for diff's tests: tensors by name, written to a temporary
// safetensors file and read back as the judge reads a candidate file.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

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

}  // namespace indexshare::testing
