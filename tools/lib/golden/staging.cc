// golden sets: the atomic write. A temporary folder `<dir>.tmp.<tag>` with an owner record, then
// one rename (stage, publish, discard); write() and the MPI writer (tools/lib/distributed.cc) use it.

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
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

// ---- SetWriter -------------------------------------------------------------------------------------
// Tensor i is handed over by add() (added), written by the writer thread (in order: the file is
// sequential) and hashed by the hasher thread, or by the caller in finish(); its bytes are freed
// once it is both written and hashed. Every field below is guarded by `m`, except that a view's
// bytes are read (never written) outside it by the threads working on it.
struct SetWriter::State {
  Staging staging;
  std::vector<Planned> plan;
  uint64_t max_pending = 0;
  std::unique_ptr<io::SafetensorsWriter> file;
  std::mutex m;
  std::condition_variable cv;
  std::vector<io::TensorView> views;
  std::vector<FillRows> fills;  // released once the tensor is done
  std::vector<char> made;       // tensors with a fill: made and hashed by the writer
  std::vector<std::string> hashes;
  std::vector<char> written, hashed;
  size_t added = 0, next_write = 0, next_hash = 0;
  uint64_t pending = 0;  // bytes added and not yet both written and hashed
  bool closing = false, stop = false, finished = false;
  std::exception_ptr error;
  std::thread writer, hasher;

  void done_with(size_t i) {  // under m
    if (!written[i] || !hashed[i]) return;
    pending -= views[i].bytes.size();
    views[i].bytes = io::TensorBytes{};
    fills[i] = nullptr;  // and what a fill holds (its source's bytes)
  }
  void failed() {
    std::lock_guard<std::mutex> lk(m);
    if (!error) error = std::current_exception();
    stop = true;
    cv.notify_all();
  }
  void write_loop() {
    try {
      for (;;) {
        size_t i;
        {
          std::unique_lock<std::mutex> lk(m);
          cv.wait(lk, [&] { return stop || next_write < added || next_write == plan.size(); });
          if (stop || next_write == plan.size()) return;
          i = next_write;
        }
        std::string made_hash;
        if (made[i])
          made_hash = make(i);
        else
          file->append(views[i]);
        std::lock_guard<std::mutex> lk(m);
        if (made[i]) {
          hashes[i] = std::move(made_hash);
          hashed[i] = 1;
        }
        written[i] = 1;
        ++next_write;
        done_with(i);
        cv.notify_all();
      }
    } catch (...) {
      failed();
    }
  }
  // Tensor i made by its fill a piece at a time, each piece hashed and written; returns its SHA-256.
  std::string make(size_t i) {
    const io::TensorView& v = views[i];
    io::Sha256 sha;
    file->append({v.name, v.dtype, v.shape}, [&](const io::SafetensorsWriter::Piece& put) {
      for_each_piece(v, fills[i], [&](const uint8_t* p, size_t n) {
        sha.update(p, n);
        put(p, n);
      });
    });
    return sha.hex();
  }
  // Hashes the added tensors no one has taken; returns when stopped, or when every tensor is
  // taken and `closing` (the hasher thread: until then it waits for more).
  void hash_loop() {
    try {
      for (;;) {
        size_t i;
        {
          std::unique_lock<std::mutex> lk(m);
          cv.wait(lk, [&] { return stop || next_hash < added || closing; });
          if (stop || next_hash >= added) return;
          i = next_hash++;
          if (made[i]) continue;  // made and hashed by the writer
        }
        std::string h = io::sha256_hex(views[i].bytes.data(), views[i].bytes.size());
        std::lock_guard<std::mutex> lk(m);
        hashes[i] = std::move(h);
        hashed[i] = 1;
        done_with(i);
        cv.notify_all();
      }
    } catch (...) {
      failed();
    }
  }
  void halt() noexcept {
    {
      std::lock_guard<std::mutex> lk(m);
      stop = true;
      cv.notify_all();
    }
    if (writer.joinable()) writer.join();
    if (hasher.joinable()) hasher.join();
  }
};

SetWriter::SetWriter(const std::string& dir, bool force, std::vector<Planned> plan, uint64_t max_pending)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.plan = std::move(plan);
  s.max_pending = max_pending;
  s.views.resize(s.plan.size());
  s.fills.resize(s.plan.size());
  s.made.assign(s.plan.size(), 0);
  s.hashes.resize(s.plan.size());
  s.written.assign(s.plan.size(), 0);
  s.hashed.assign(s.plan.size(), 0);
  s.staging = stage(dir, force, std::to_string(::getpid()));
  try {
    std::vector<io::TensorSpec> specs;
    for (const Planned& p : s.plan) specs.push_back(p.spec);
    s.file = std::make_unique<io::SafetensorsWriter>((fs::path(s.staging.tmp) / kTensorFile).string(), std::move(specs),
                                                     std::map<std::string, std::string>{{"format", "indexshare-golden"}});
    s.writer = std::thread([&s] { s.write_loop(); });
    s.hasher = std::thread([&s] { s.hash_loop(); });
  } catch (...) {
    s.halt();
    s.file.reset();
    discard(s.staging);
    throw;
  }
}

SetWriter::~SetWriter() {
  if (!s_ || s_->finished) return;
  s_->halt();
  s_->file.reset();  // removes its temporary file
  discard(s_->staging);
}

void SetWriter::add(io::TensorView v, Role role) { add(Handed{std::move(v), role, nullptr}); }

void SetWriter::add(Handed h) {
  io::TensorView& v = h.view;
  const Role role = h.role;
  State& s = *s_;
  std::unique_lock<std::mutex> lk(s.m);
  if (s.error) std::rethrow_exception(s.error);
  require(!s.closing, "golden: tensor '" + v.name + "' handed over after finish()");
  const size_t i = s.added;
  const std::string where = s.staging.dir + ": tensor '" + v.name + "': ";
  require(i < s.plan.size(), where + "beyond the " + std::to_string(s.plan.size()) + " planned tensors");
  const Planned& p = s.plan[i];
  require(v.name == p.spec.name && v.dtype == p.spec.dtype && v.shape == p.spec.shape && role == p.role,
          where + io::dtype_name(v.dtype) + " " + shape_str(v.shape) + " " + role_name(role) + " where the plan has '" +
              p.spec.name + "' " + io::dtype_name(p.spec.dtype) + " " + shape_str(p.spec.shape) + " " + role_name(p.role));
  s.cv.wait(lk, [&] { return s.stop || s.max_pending == 0 || s.pending == 0 || s.pending + v.bytes.size() <= s.max_pending; });
  if (s.error) std::rethrow_exception(s.error);
  s.pending += v.bytes.size();
  s.views[i] = std::move(v);
  s.made[i] = h.fill ? 1 : 0;
  s.fills[i] = std::move(h.fill);
  ++s.added;
  s.cv.notify_all();
}

json SetWriter::finish(json manifest) {
  State& s = *s_;
  try {
    phases::begin("write (file; SHA-256 on two more threads)");
    {
      std::lock_guard<std::mutex> lk(s.m);
      if (s.error) std::rethrow_exception(s.error);
      require(s.added == s.plan.size(), s.staging.dir + ": tensor '" + s.plan[std::min(s.added, s.plan.size() - 1)].spec.name +
                                            "' was never handed over");
      s.closing = true;
      s.cv.notify_all();
    }
    s.hash_loop();  // this thread hashes beside the hasher
    if (s.writer.joinable()) s.writer.join();
    if (s.hasher.joinable()) s.hasher.join();
    if (s.error) std::rethrow_exception(s.error);
    s.file->finish();
    std::vector<io::TensorSpec> specs;
    std::map<std::string, Role> roles;
    for (const Planned& p : s.plan) specs.push_back(p.spec), roles[p.spec.name] = p.role;
    manifest["tensors"] = tensor_list(specs, s.hashes, roles);
  } catch (const fs::filesystem_error& e) {
    throw Error(s.staging.dir + ": cannot publish the golden set: " + e.what());
  }
  s.finished = true;  // publish discards the staging itself on failure
  phases::begin("publish (manifest, rename)");
  return publish(s.staging, std::move(manifest));
}

std::vector<SetWriter::Planned> plan_of(const GoldenSet& set) {
  std::vector<SetWriter::Planned> plan;
  plan.reserve(set.tensors.size());
  for (const io::TensorView& v : set.tensors) plan.push_back({{v.name, v.dtype, v.shape}, set.roles.at(v.name)});
  return plan;
}

void for_each_piece(const io::TensorView& v, const FillRows& fill, const std::function<void(const uint8_t* p, size_t n)>& piece) {
  if (!fill) {
    piece(v.bytes.data(), v.bytes.size());
    return;
  }
  const int64_t rows = v.shape.empty() ? 1 : v.shape[0];
  if (rows <= 0) return;
  const uint64_t row_bytes = uint64_t(shape_numel(v.shape)) * io::dtype_size(v.dtype) / uint64_t(rows);
  const int64_t step = std::min(rows, std::max<int64_t>(1, int64_t((uint64_t(8) << 20) / std::max<uint64_t>(row_bytes, 1))));
  std::vector<uint8_t> chunk(size_t(step) * size_t(row_bytes));
  for (int64_t first = 0; first < rows; first += step) {
    const int64_t n = std::min(step, rows - first);
    fill(first, n, chunk.data());
    piece(chunk.data(), size_t(n) * size_t(row_bytes));
  }
}

PutTensor collect(GoldenSet& g) {
  return [&g](Handed h) {
    if (h.fill) {
      std::vector<uint8_t> bytes;
      for_each_piece(h.view, h.fill, [&](const uint8_t* p, size_t n) { bytes.insert(bytes.end(), p, p + n); });
      h.view.bytes = io::TensorBytes(std::move(bytes));
    }
    g.roles[h.view.name] = h.role;
    g.tensors.push_back(std::move(h.view));
  };
}

json write_streamed(const std::string& dir, bool force, const std::vector<SetWriter::Planned>& plan,
                    const std::function<json(const PutTensor&)>& emit, const std::string& inputs_note) {
  SetWriter w(dir, force, plan, layer_bytes(plan));
  json manifest = emit([&w](Handed h) { w.add(std::move(h)); });
  if (!inputs_note.empty()) manifest["conventions"]["inputs"] = inputs_note;
  return w.finish(std::move(manifest));
}

uint64_t layer_bytes(const std::vector<SetWriter::Planned>& plan) {
  std::map<std::string, uint64_t> layers;
  for (const SetWriter::Planned& p : plan) {
    const std::string& n = p.spec.name;
    const size_t dot = n.rfind("layers.", 0) == 0 ? n.find('.', 7) : std::string::npos;
    if (dot != std::string::npos)
      layers[n.substr(0, dot)] += uint64_t(shape_numel(p.spec.shape)) * io::dtype_size(p.spec.dtype);
  }
  uint64_t most = 0;
  for (const auto& [name, bytes] : layers) most = std::max(most, bytes);
  return most;
}

json write(const std::string& dir, GoldenSet set, bool force) {
  // The tensors are all in memory: handed over at once, written on one thread and hashed on two
  // (the writer's hasher and this one), so the hashes do not wait for the kernel's copy into the
  // page cache (at hq16 the write took 45 ms and the hashes 62 ms on the Zen 3 VM).
  SetWriter w(dir, force, plan_of(set));
  for (io::TensorView& v : set.tensors) {
    const Role r = set.roles.at(v.name);
    w.add(std::move(v), r);
  }
  set.tensors.clear();
  return w.finish(std::move(set.manifest));
}

}  // namespace indexshare::golden
