// golden sets: reading and verifying a set (read, Loaded's lazy tensors and their SHA-256, summary).

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <cstring>
#include <exception>
#include <filesystem>
#include <sstream>

#include "tools/lib/json_io.h"

namespace indexshare::golden {

namespace fs = std::filesystem;

using nlohmann::json;
using namespace detail;

namespace {
// The SHA-256 of each tensor, tensors in parallel (OpenMP); an error is rethrown on this thread.
// With a file: a tensor whose bytes are not in memory (fewer than sizes[i]) is hashed from the file
// range [offsets[i], offsets[i] + sizes[i]).
// skip_file: tensors left in the file are not hashed (their hash stays "").
std::vector<std::string> sha256_all(const std::vector<io::TensorView>& tensors, const std::string& file = "",
                                    const std::vector<uint64_t>& offsets = {}, const std::vector<uint64_t>& sizes = {},
                                    bool skip_file = false) {
  std::vector<std::string> hashes(tensors.size());
  std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < tensors.size(); ++i) {
    try {
      const io::TensorView& v = tensors[i];
      if (skip_file && !sizes.empty() && v.bytes.size() != sizes[i]) continue;
      hashes[i] = !sizes.empty() && v.bytes.size() != sizes[i] ? io::sha256_file_range(file, offsets[i], sizes[i])
                                                               : io::sha256_hex(v.bytes.data(), v.bytes.size());
    } catch (...) {
#pragma omp critical(indexshare_sha256_all)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
  return hashes;
}
}  // namespace

const io::TensorView& Loaded::get(const std::string& name) const {
  const io::TensorView* v = data.find(name);
  if (!v) throw Error(dir + "/" + kTensorFile + ": tensor '" + name + "' is missing");
  return *v;
}

// A lazily read tensor's bytes against the manifest's SHA-256 (Error naming it), then checked.
void Loaded::check_hash(const std::string& name, const std::string& sha256) const {
  if (sha256 != lazy.at(name).sha256)
    throw Error(dir + "/manifest.json: tensor '" + name + "': the tensor's bytes do not match field 'sha256' "
                "(the golden set is tampered or corrupted)");
  unverified.erase(name);
}

std::string Loaded::read_hashed(const std::string& name, void* dst, size_t n) const {
  io::read_file_range(dir + "/" + kTensorFile, lazy.at(name).offset, dst, n);
  return io::sha256_hex(static_cast<const uint8_t*>(dst), n);
}

io::MappedRange Loaded::map(const std::string& name) const {
  const io::TensorView& v = get(name);
  return io::map_file_range(dir + "/" + kTensorFile, lazy.at(name).offset, size_t(shape_numel(v.shape)) * io::dtype_size(v.dtype));
}

void Loaded::verify_rest() const {
  const std::vector<std::string> rest(unverified.begin(), unverified.end());
  std::vector<io::TensorView> views;  // without bytes: sha256_all hashes them from the file
  std::vector<uint64_t> offsets, sizes;
  for (const std::string& name : rest) {
    const io::TensorView& v = get(name);
    views.push_back({v.name, v.dtype, v.shape, {}});
    offsets.push_back(lazy.at(name).offset);
    sizes.push_back(uint64_t(shape_numel(v.shape)) * io::dtype_size(v.dtype));
  }
  const std::vector<std::string> hashes = sha256_all(views, dir + "/" + kTensorFile, offsets, sizes);
  for (size_t i = 0; i < rest.size(); ++i) check_hash(rest[i], hashes[i]);
}

void Loaded::verify(const std::string& name) const {
  if (!unverified.count(name)) return;
  const io::TensorView& v = get(name);
  check_hash(name, io::sha256_file_range(dir + "/" + kTensorFile, lazy.at(name).offset,
                                         uint64_t(shape_numel(v.shape)) * io::dtype_size(v.dtype)));
}

Loaded::Stream::Stream(const Loaded& g, const std::string& name) : g_(g), name_(name), v_(g.get(name)) {
  size_ = uint64_t(shape_numel(v_.shape)) * io::dtype_size(v_.dtype);
}

void Loaded::Stream::read(void* dst, size_t n) {
  require(done_ + n <= size_, g_.dir + "/" + kTensorFile + ": tensor '" + name_ + "': read past its end");
  if (g_.lazy.count(name_)) {
    io::read_file_range(g_.dir + "/" + kTensorFile, g_.lazy.at(name_).offset + done_, dst, n);
    sha_.update(dst, n);
  } else {
    std::memcpy(dst, v_.bytes.data() + done_, n);
  }
  done_ += n;
}

void Loaded::Stream::finish() {
  require(done_ == size_, g_.dir + "/" + kTensorFile + ": tensor '" + name_ + "': read " + std::to_string(done_) + " of its " +
                              std::to_string(size_) + " bytes");
  if (g_.lazy.count(name_)) g_.check_hash(name_, sha_.hex());
}

Loaded read(const std::string& dir, uint64_t keep_bytes, bool defer_hashes) {
  Loaded g;
  g.dir = dir;
  const std::string mpath = dir + "/manifest.json";
  std::error_code ec;
  require(fs::is_directory(dir, ec), dir + ": not a golden set folder");
  g.manifest = io::parse_json_strict(io::read_text_file(mpath), mpath);
  auto field = [&](const char* name) -> const json& {
    if (!g.manifest.is_object() || !g.manifest.contains(name)) throw Error(mpath + ": field '" + name + "' is missing");
    return g.manifest[name];
  };
  if (field("format") != "indexshare-golden") throw Error(mpath + ": field 'format' is not \"indexshare-golden\"");
  const json& ver = field("format_version");
  if (!ver.is_number_integer() || ver != kFormatVersion)  // compared as JSON numbers: 2^32 + 1 is not 1
    throw Error(mpath + ": field 'format_version' is " + ver.dump() + ", this tool reads version " +
                std::to_string(kFormatVersion) + " (regenerate with the replay command)");
  const json& tensors = field("tensors");
  if (!tensors.is_array()) throw Error(mpath + ": field 'tensors' is not an array");
  io::SafetensorsIndex index = io::read_safetensors_index(dir + "/" + kTensorFile, keep_bytes);
  g.data = std::move(index.file);
  // Every tensor's SHA-256 (a tensor not kept streamed from the file), checked below in the
  // manifest's order.
  std::vector<uint64_t> sizes(g.data.tensors.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const io::TensorView& v = g.data.tensors[i];
    sizes[i] = uint64_t(shape_numel(v.shape)) * io::dtype_size(v.dtype);
  }
  const std::vector<std::string> hashes = sha256_all(g.data.tensors, dir + "/" + kTensorFile, index.offsets, sizes, defer_hashes);
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& t = tensors[i];
    const std::string where = mpath + ": tensors[" + std::to_string(i) + "]";
    for (const char* f : {"name", "file", "dtype", "shape", "sha256", "role"})
      if (!t.is_object() || !t.contains(f) || (std::string(f) != "shape" && !t[f].is_string()))
        throw Error(where + ": field '" + f + "' is missing or not a string");
    const std::string name = t["name"];
    if (!seen.emplace(name, i).second)
      throw Error(where + " ('" + name + "'): field 'name' repeats tensors[" + std::to_string(seen[name]) + "]");
    const std::string role = t["role"];
    if (role != role_name(Role::input) && role != role_name(Role::output) && role != role_name(Role::reference))
      throw Error(where + " ('" + name + "'): field 'role' is '" + role + "', not input, output or reference");
    if (t["file"] != kTensorFile) throw Error(where + " ('" + name + "'): field 'file' must be " + kTensorFile);
    const io::TensorView* v = g.data.find(name);
    if (!v) throw Error(dir + "/" + kTensorFile + ": tensor '" + name + "' named in the manifest is missing");
    if (io::dtype_name(v->dtype) != t["dtype"].get<std::string>())
      throw Error(where + " ('" + name + "'): dtype " + t["dtype"].get<std::string>() + " in the manifest, " +
                  io::dtype_name(v->dtype) + " in the file");
    Shape shape;  // element by element: a float such as 1e21 must not reach an integer conversion
    if (!t["shape"].is_array()) throw Error(where + " ('" + name + "'): field 'shape' is not a list of integers");
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer()) throw Error(where + " ('" + name + "'): field 'shape' is not a list of integers");
      shape.push_back(d.get<int64_t>());
    }
    if (shape != v->shape)
      throw Error(where + " ('" + name + "'): shape " + shape_str(shape) + " in the manifest, " +
                  shape_str(v->shape) + " in the file");
    const size_t vi = size_t(v - g.data.tensors.data());
    const bool lazy = v->bytes.size() != sizes[vi];
    if (lazy && defer_hashes) {  // checked when read (load, Stream) or by verify_rest
      const std::string& want = t["sha256"].get<std::string>();
      g.lazy[name] = {index.offsets[vi], want};
      g.unverified.insert(name);
      continue;
    }
    if (hashes[vi] != t["sha256"].get<std::string>())
      throw Error(where + " ('" + name + "'): the tensor's bytes do not match field 'sha256' "
                  "(the golden set is tampered or corrupted)");
    if (lazy) g.lazy[name] = {index.offsets[vi], hashes[vi]};
  }
  if (tensors.size() != g.data.tensors.size())
    throw Error(dir + "/" + kTensorFile + ": holds " + std::to_string(g.data.tensors.size()) +
                " tensors, the manifest lists " + std::to_string(tensors.size()));
  check_manifest(g, mpath);
  return g;
}

std::string summary(const Loaded& g) { return summary(g.dir, g.manifest, true); }

std::string summary(const std::string& dir, const json& m, bool with_replay) {
  uint64_t bytes = 0;  // from dtype and shape: a lazily read tensor holds no bytes
  for (const json& t : m.at("tensors")) {
    uint64_t n = io::dtype_size(io::parse_dtype(t.at("dtype").get<std::string>()));
    for (const json& d : t.at("shape")) n *= d.get<uint64_t>();
    bytes += n;
  }
  std::ostringstream os;
  os << "golden    " << dir << " (" << m.value("kind", "?") << ", " << m["tensors"].size() << " tensors)\n";
  os << "problem   " << m.value("problem", "") << "\n";
  if (m.contains("layers")) {
    std::string pattern;
    for (const json& l : m["layers"]) pattern += l["kind"] == "full" ? 'F' : l["kind"] == "none" ? '.' : 'S';
    os << "schedule  " << pattern << "\n";
  }
  os << "bytes     " << bytes << " in " << kTensorFile << "\n";
  if (with_replay) os << "replay    " << m.value("replay", "") << "\n";
  return os.str();
}

}  // namespace indexshare::golden
