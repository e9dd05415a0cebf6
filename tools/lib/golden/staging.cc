// golden sets: the atomic write. A temporary folder `<dir>.tmp.<tag>` with an owner record, then
// one rename (stage, publish, discard); write() and the MPI writer (tools/lib/distributed.cc) use it.

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>
#include <utility>

#include "tools/lib/json_io.h"
#include "tools/lib/phases.h"

namespace indexshare::golden {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void os_error(const std::string& what, const std::string& path) {
  throw Error(path + ": " + what + ": " + std::strerror(errno));
}

void write_text(const std::string& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) os_error("cannot write", path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) os_error("cannot write", path);
}

}  // namespace

namespace {
// The owner record of a temporary folder (kOwnerFile inside it, removed before the folder is
// published): the host, its boot, the process id and the process's start time, so that a later
// run can tell a folder whose writer is gone (killed outright: SIGKILL, a node lost, an MPI job
// ended by its launcher) from one still being written.
constexpr const char* kOwnerFile = ".indexshare-owner";

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}
std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0) return "";
  return h;
}
// Field 22 of /proc/PID/stat (the start time in clock ticks since boot), "" when PID is not running.
std::string process_start(const std::string& pid) {
  const std::string stat = read_first_line("/proc/" + pid + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream in(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (in >> field); ++i)
    if (i == 22) return field;
  return "";
}
std::string owner_record() {
  const std::string pid = std::to_string(::getpid());
  return "host " + host_name() + "\nboot " + read_first_line("/proc/sys/kernel/random/boot_id") + "\npid " + pid +
         "\nstart " + process_start(pid) + "\n";
}

// Temporary folders `<name>.tmp.*` next to the target that earlier runs left: removed when their
// owner record names a process of this host (this boot) that is no longer running; otherwise left
// alone with a note (a writer still running, another host's, or no record: delete by hand).
void remove_stale_temporaries(const fs::path& parent, const std::string& name, const fs::path& mine) {
  std::error_code ec;
  const std::string prefix = name + ".tmp.";
  const std::string host = host_name(), boot = read_first_line("/proc/sys/kernel/random/boot_id");
  for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
    const std::string entry = e.path().filename().string();
    if (entry.rfind(prefix, 0) != 0 || e.path() == mine || !e.is_directory(ec)) continue;
    std::map<std::string, std::string> owner;
    {
      std::ifstream f((e.path() / kOwnerFile).string());
      std::string key, value;
      while (f >> key && std::getline(f >> std::ws, value)) owner[key] = value;
    }
    const std::string where = e.path().string();
    if (!owner.count("pid")) {
      std::fprintf(stderr, "golden: note: %s is a temporary folder without an owner record (an earlier run, or an older "
                           "version of the tool): delete it by hand if no run is writing it\n", where.c_str());
      continue;
    }
    if (owner["host"] != host || owner["boot"] != boot) {
      std::fprintf(stderr, "golden: note: %s is being written, or was left, by process %s on %s, which this process cannot "
                           "check: delete it by hand if that run is over\n", where.c_str(), owner["pid"].c_str(),
                   owner["host"].c_str());
      continue;
    }
    const std::string start = process_start(owner["pid"]);
    if (!start.empty() && start == owner["start"]) continue;  // its writer is running
    fs::remove_all(e.path(), ec);
    std::fprintf(stderr, "golden: removed %s, left by process %s of an earlier run that ended before publishing it\n",
                 where.c_str(), owner["pid"].c_str());
  }
}
}  // namespace

Staging stage(const std::string& dir, bool force, const std::string& tag) {
  require(!dir.empty(), "golden: --out must name a folder");
  Staging s;
  s.dir = dir;
  const fs::path target = fs::path(dir).lexically_normal();
  std::error_code ec;
  s.exists = fs::exists(target, ec);
  if (s.exists) {
    require(fs::is_directory(target, ec), dir + ": exists and is not a folder");
    const bool empty = fs::is_empty(target, ec);
    if (!empty) {
      require(force, dir + ": folder exists and is not empty (use --force to replace a golden set)");
      // --force deletes the folder: only what a golden set holds (its two files, the manifest a
      // JSON object of format "indexshare-golden"), never a folder that merely has a manifest.json.
      for (const fs::directory_entry& e : fs::directory_iterator(target, ec)) {
        const std::string name = e.path().filename().string();
        require((name == "manifest.json" || name == kTensorFile) && e.is_regular_file(ec),
                dir + ": --force replaces only a golden set, and '" + name +
                    "' is not one of its files (manifest.json, " + kTensorFile + ")");
      }
      if (ec) throw Error(dir + ": cannot list the folder: " + ec.message());
      require(fs::is_regular_file(target / "manifest.json", ec),
              dir + ": --force replaces only a golden set (no manifest.json there)");
      json m;
      try {
        m = json::parse(io::read_text_file((target / "manifest.json").string()));
      } catch (const json::exception&) {
      }
      require(m.is_object() && m.contains("format") && m["format"] == "indexshare-golden",
              dir + ": --force replaces only a golden set, and its manifest.json is not one (no \"format\": "
                    "\"indexshare-golden\")");
      s.replace = true;
    }
  }
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path tmp = parent / (target.filename().string() + ".tmp." + tag);
  fs::create_directories(parent, ec);  // like mkdir -p; a failure shows up just below
  remove_stale_temporaries(parent, target.filename().string(), tmp);
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) throw Error(tmp.string() + ": cannot create folder: " + ec.message());
  // The owner record, for remove_stale_temporaries of a later run should this process die.
  write_text((tmp / kOwnerFile).string(), owner_record());
  s.target = target.string();
  s.parent = parent.string();
  s.tmp = tmp.string();
  return s;
}

void discard(const Staging& s) noexcept {
  std::error_code ec;
  if (!s.tmp.empty()) fs::remove_all(s.tmp, ec);
}

json tensor_list(const std::vector<io::TensorSpec>& specs, const std::vector<std::string>& hashes,
                 const std::map<std::string, Role>& roles) {
  json list = json::array();
  for (size_t i = 0; i < specs.size(); ++i) {
    const io::TensorSpec& v = specs[i];
    list.push_back({{"name", v.name}, {"file", kTensorFile}, {"dtype", io::dtype_name(v.dtype)},
                    {"shape", v.shape}, {"sha256", hashes[i]}, {"role", role_name(roles.at(v.name))}});
  }
  return list;
}

namespace {
bool f32_field(const std::string& key) {
  return key == "sm_scale" || key == "softmax_scale" || key == "eps" || key.ends_with("_eps");
}
void shorten(json& j) {
  if (!j.is_structured()) return;
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it->is_number_float() && f32_field(it.key())) *it = f32_json(it->get<double>());
  for (json& x : j) shorten(x);
}
}  // namespace

// Double fields (the budgets) keep the shortest text of their double.
json shortest_floats(json manifest) {
  shorten(manifest);
  return manifest;
}

json publish(const Staging& s, json manifest) {
  const fs::path target(s.target), parent(s.parent), tmp(s.tmp);
  std::error_code ec;
  manifest = shortest_floats(std::move(manifest));
  try {
    write_text((tmp / "manifest.json").string(), manifest.dump(2) + "\n");
    fs::remove(tmp / kOwnerFile, ec);  // the set holds its two files only
    // One rename publishes the set; an existing set is moved aside first, then removed.
    if (s.exists && !s.replace) fs::remove(target, ec);  // an empty folder
    fs::path old;
    if (s.replace) {
      old = parent / (target.filename().string() + ".old." + std::to_string(::getpid()));
      fs::rename(target, old);
    }
    fs::rename(tmp, target);
    if (s.replace) fs::remove_all(old, ec);
    return manifest;
  } catch (const fs::filesystem_error& e) {
    discard(s);
    throw Error(s.dir + ": cannot publish the golden set: " + e.what());
  } catch (...) {
    discard(s);
    throw;
  }
}

json write(const std::string& dir, GoldenSet set, bool force) {
  const Staging s = stage(dir, force, std::to_string(::getpid()));
  try {
    // 1. Tensors, then the manifest naming each with its SHA-256. The hashes (of the bytes in
    // memory) are computed on a second thread while this one writes: the write is the kernel
    // copying into the page cache, and the hashes would otherwise wait for it. The tensors are
    // taken largest first from a shared counter, and this thread takes what is left once its write
    // is done (at hq16 the write took 45 ms and the hashes 62 ms on the Zen 3 VM: the hasher
    // alone finished last). Each tensor is hashed once, by either thread: the same hashes.
    phases::begin("write (file; SHA-256 on a second thread)");
    std::vector<std::string> hashes(set.tensors.size());
    std::exception_ptr hash_error;
    const std::vector<io::TensorView>& tensors = set.tensors;  // read only, by both threads
    std::vector<size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].bytes.size() > tensors[b].bytes.size(); });
    std::atomic<size_t> next{0};
    auto hash_rest = [&] {
      for (size_t k; (k = next.fetch_add(1)) < order.size();)
        hashes[order[k]] = io::sha256_hex(tensors[order[k]].bytes.data(), tensors[order[k]].bytes.size());
    };
    std::thread hasher([&] {
      try {
        hash_rest();
      } catch (...) {
        hash_error = std::current_exception();
      }
    });
    try {
      io::write_safetensors((fs::path(s.tmp) / kTensorFile).string(), tensors, {{"format", "indexshare-golden"}});
      hash_rest();
    } catch (...) {
      hasher.join();
      throw;
    }
    hasher.join();
    if (hash_error) std::rethrow_exception(hash_error);
    std::vector<io::TensorSpec> specs;
    for (const io::TensorView& v : set.tensors) specs.push_back({v.name, v.dtype, v.shape});
    set.manifest["tensors"] = tensor_list(specs, hashes, set.roles);
  } catch (const fs::filesystem_error& e) {
    discard(s);
    throw Error(dir + ": cannot publish the golden set: " + e.what());
  } catch (...) {
    discard(s);
    throw;
  }
  // 2. The manifest and one rename.
  phases::begin("publish (manifest, rename)");
  return publish(s, std::move(set.manifest));
}

}  // namespace indexshare::golden
