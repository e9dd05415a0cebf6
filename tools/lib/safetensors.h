// indexshare: a strict safetensors reader and a deterministic writer.
//
// Format (https://github.com/huggingface/safetensors):
//   8 bytes   little-endian u64 N, the header length
//   N bytes   UTF-8 JSON object: tensor name -> {"dtype": str, "shape": [int], "data_offsets":
//             [begin, end]} with offsets relative to the data buffer, plus an optional
//             "__metadata__" object of string -> string
//   rest      the data buffer; tensors are little-endian, row-major, contiguous
//
// The reader refuses anything the reference library would refuse and a little more (extra
// fields, duplicate keys, a null "__metadata__", which the reference accepts): every violation
// throws indexshare::Error whose message starts with the file name and names the field, e.g.
// "x.safetensors: header: tensor 'a': data_offsets [0, 12] do not match dtype F32 and shape [2,2]
// (16 bytes)". Refused: a file shorter than 8 bytes; a header length of 0, beyond the file, or
// over 100 MB; a header that is not a UTF-8 JSON object (a byte-order mark and NUL bytes, which
// nlohmann would skip or stop at, included); duplicate keys at any depth; a tensor entry that is
// not an object with exactly dtype, shape and data_offsets; an unknown dtype; a shape that is not
// an array of non-negative int64 dims or whose element count overflows; data_offsets that are not
// two non-negative integers with begin <= end, or whose length is not numel * dtype size; a range
// beyond the data buffer; overlapping ranges; holes between ranges or bytes after the last one
// (the tensors sorted by offsets must tile the data buffer exactly, as the reference library
// checks); a "__metadata__" that is not an object of strings.
//
// The writer stores the tensors in the given order, contiguously, with a compact header JSON whose
// keys are sorted, padded with spaces to a multiple of 8 bytes: the same input gives the same bytes
// on any machine. It writes "<path>.tmp.<pid>" and renames it, so the final name never holds a
// partial file.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ref/error.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX
typedef struct evp_md_ctx_st EVP_MD_CTX;
#include "ref/tensor.h"

namespace indexshare::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies bytes as they are");

enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

// The safetensors spelling: "F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32",
// "I16", "I8", "U8", "BOOL".
std::string dtype_name(DType dtype);
// Inverse of dtype_name; throws Error("unknown dtype '<value>'") for anything else.
DType parse_dtype(const std::string& name);
// Bytes per element.
size_t dtype_size(DType dtype);

// A tensor's bytes: a std::vector<uint8_t> (the operations the code base uses), or memory SHARED
// with an owner that keeps it alive (make_view of a moved tensor: a golden set adopts its tensors'
// elements instead of copying them). Shared bytes are read-only: the first mutating access
// (mutable_data, resize, assign, pop_back) copies them into an owned vector, so an owner's memory is
// never written through a view; data(), [], begin and end are const. Copying TensorBytes shares shared bytes and copies
// owned ones.
class TensorBytes {
 public:
  TensorBytes() = default;
  TensorBytes(std::vector<uint8_t> v) : own_(std::move(v)) {}  // NOLINT: implicit, as a vector
  // n bytes at p, kept alive by owner.
  static TensorBytes shared(std::shared_ptr<const void> owner, const uint8_t* p, size_t n) {
    TensorBytes b;
    b.owner_ = std::move(owner);
    b.p_ = p;
    b.n_ = n;
    return b;
  }

  size_t size() const { return owner_ ? n_ : own_.size(); }
  bool empty() const { return size() == 0; }
  const uint8_t* data() const { return owner_ ? p_ : own_.data(); }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size(); }
  const uint8_t& operator[](size_t i) const { return data()[i]; }
  // Write access, explicitly (a shared view becomes an owned copy first): every plain accessor
  // is const, so reading a view never copies it by accident.
  uint8_t* mutable_data() { return own().data(); }

  template <class It>
  void assign(It first, It last) {
    release();
    own_.assign(first, last);
  }
  void resize(size_t n) { own().resize(n); }
  void pop_back() { own().pop_back(); }
  friend bool operator==(const TensorBytes& a, const TensorBytes& b) {
    return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
  }

 private:
  std::vector<uint8_t>& own() {
    if (owner_) {
      own_.assign(p_, p_ + n_);
      release();
    }
    return own_;
  }
  void release() {
    owner_.reset();
    p_ = nullptr;
    n_ = 0;
  }
  std::vector<uint8_t> own_;
  std::shared_ptr<const void> owner_;
  const uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  TensorBytes bytes;  // numel * dtype_size bytes, little-endian, row-major
};

struct SafetensorsFile {
  std::string source;  // the file name used in error messages
  std::map<std::string, std::string> metadata;
  std::vector<TensorView> tensors;  // in offset order

  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  // Throws Error("<source>: tensor '<name>' is missing") when absent.
  const TensorView& get(const std::string& name) const;
};

// Largest header the reader accepts (the reference library's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Reads and validates a whole file; throws Error naming `path` when it cannot be read, when it is
// larger than max_bytes, or when it is malformed.
SafetensorsFile read_safetensors(const std::string& path, uint64_t max_bytes = 1ull << 34);
// read_safetensors's checks, keeping the bytes only of the tensors of at most keep_bytes bytes:
// the others have empty `bytes`, to be read on demand (read_file_range) from offsets[i], where
// tensors[i]'s bytes start in the file. max_bytes bounds the header and the kept tensors, not the
// file (a 27.6 GB set of 2 GB tensors reads lazily).
struct SafetensorsIndex {
  SafetensorsFile file;
  std::vector<uint64_t> offsets;
};
SafetensorsIndex read_safetensors_index(const std::string& path, uint64_t keep_bytes,
                                        uint64_t max_bytes = 1ull << 34);
// n bytes of `path` from `offset` into dst; Error naming the path when it cannot be read in full.
void read_file_range(const std::string& path, uint64_t offset, void* dst, size_t n);
// n bytes of `path` from `offset` mapped read-only in place of a read (mmap, private, pages
// populated now): the file's page-cache pages themselves, so no fresh memory is faulted in and
// zeroed and nothing is copied. `owner` keeps the mapping (BorrowedTensor's keep); `p` is null
// where the system refuses a mapping (the caller then reads the bytes), or where n is 0. Errors as
// read_file_range's, and when the file is shorter than offset + n. The file must keep its length
// while mapped: a file truncated under a reader ends it with SIGBUS (diff maps only the set and
// the candidate it was given, which nothing else writes while it runs).
struct MappedRange {
  std::shared_ptr<const void> owner;
  const uint8_t* p = nullptr;
};
MappedRange map_file_range(const std::string& path, uint64_t offset, size_t n);
// From this many bytes diff maps a tensor's bytes (map_file_range) instead of reading them: below
// it a mapping's setup costs more than the copy (and malloc recycles small buffers without
// faults). A variable so that tests can map the checked-in sets' small tensors too.
inline size_t map_read_min = size_t(4) << 20;
// Validates and parses an in-memory file; `name_for_errors` starts every error message.
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size,
                                  const std::string& name_for_errors);

// Error unless `path` is absent or a regular file (or a link to one): what a writer here (and
// io::write_text_files) may replace; a folder, a FIFO or a device is never replaced.
void check_output_path(const std::string& path);

// A tensor's name, dtype and shape: what the header says of it.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};
// The bytes before the data buffer of a file holding `specs` in this order (the 8-byte length and
// the padded header JSON, exactly as write_safetensors writes them); offsets (when given) receives
// each tensor's data_offsets begin relative to the data buffer. Error naming `path` on duplicate
// or reserved names and overflowing shapes.
std::string encode_header(const std::string& path, const std::vector<TensorSpec>& specs,
                          const std::map<std::string, std::string>& metadata, std::vector<uint64_t>* offsets = nullptr);

// Files of this many bytes and more are written past the page cache (O_DIRECT) where the
// filesystem allows it; the bytes are the same on either route (safetensors.cc says why).
constexpr uint64_t kDirectWriteMin = uint64_t(256) << 20;

// Writes `tensors` in the given order. Throws Error naming `path` on invalid input (duplicate or
// reserved names, a byte count that does not match dtype and shape, names or metadata that are not
// valid UTF-8) and on any OS error (with strerror); the temporary file is removed on failure.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A safetensors file written as its tensors come: the header (every tensor's name, dtype and shape,
// in file order) first, then each tensor appended in that order, then finish(). The bytes are
// write_safetensors's for the same tensors, on the same route (direct past kDirectWriteMin). The file
// is PATH.tmp.PID until finish() renames it; a writer destroyed unfinished (an exception) removes it.
// Errors name `path`: the header's (encode_header), a tensor that is not the next one of the header
// (name, dtype, shape) or whose bytes do not match them, one never appended, and any OS error.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, std::vector<TensorSpec> specs, const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  void append(const TensorView& t);
  // The next tensor, `spec`, from pieces: produce(put) calls put(p, n) in order with its bytes,
  // which must total the spec's byte count (a tensor made while it is written, never held whole).
  using Piece = std::function<void(const uint8_t* p, size_t n)>;
  void append(const TensorSpec& spec, const std::function<void(const Piece& put)>& produce);
  void finish();

 private:
  void expect_next(const std::string& name, DType dtype, const Shape& shape);
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  [[noreturn]] void fail(const std::string& what, int err);
  void put(const uint8_t* p, size_t n);
  void flush_stage(size_t n);
  std::string path_, tmp_;
  std::vector<TensorSpec> specs_;
  uint64_t total_ = 0;      // the file's bytes
  size_t next_ = 0;         // the next spec to append
  int fd_ = -1;
  bool direct_ = false, wrote_ = false, finished_ = false;
  std::unique_ptr<uint8_t, Free> stage_;  // direct route: the aligned staging chunk
  size_t fill_ = 0;
};

// SHA-256 fed piece by piece (OpenSSL EVP): update() in order, then hex() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::string hex();  // lower-case hex of everything fed

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

// Lower-case hex SHA-256 (OpenSSL EVP).
std::string sha256_hex(const uint8_t* data, size_t n);
// SHA-256 of a file's bytes; throws Error naming `path` when it cannot be read.
std::string sha256_file(const std::string& path);
// SHA-256 of bytes [offset, offset + n) of a file, streamed (Error when it cannot be read in full).
std::string sha256_file_range(const std::string& path, uint64_t offset, uint64_t n);

// Throws Error("<file>: tensor '<name>': expected shape [..], got [..]") when the shapes differ.
void expect_shape(const TensorView& view, const Shape& expected, const std::string& file);

// ---- typed access ---------------------------------------------------------------------------

// The dtype stored for an element type; defined for float, double, int32_t, int64_t, uint8_t,
// bf16_t and e4m3_t.
template <class T>
struct dtype_of;
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<bf16_t> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<e4m3_t> { static constexpr DType value = DType::F8_E4M3; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };

namespace detail {
// Checks that `view` holds `want` and that its byte count matches its shape; returns numel.
// Throws Error("<file>: tensor '<name>': dtype is X, expected Y") on a dtype mismatch.
int64_t check_view(const TensorView& view, DType want, const std::string& file);
}  // namespace detail

template <class T>
Tensor<T> as_tensor(const TensorView& view, const std::string& file) {
  constexpr DType want = dtype_of<T>::value;
  static_assert(std::is_trivially_copyable_v<T>);
  const int64_t numel = detail::check_view(view, want, file);
  Tensor<T> t;
  t.shape = view.shape;
  t.data.resize(size_t(numel));
  static_assert(sizeof(T) == sizeof(t.data[0]));
  if (numel > 0) std::memcpy(t.data.data(), view.bytes.data(), view.bytes.size());
  return t;
}

// A view's name, dtype and shape for t, its bytes still empty (make_view's common part).
template <class T>
TensorView view_header(const std::string& name, const Tensor<T>& t) {
  static_assert(std::is_trivially_copyable_v<T>);
  TensorView v;
  v.name = name;
  v.dtype = dtype_of<T>::value;
  v.shape = t.shape;
  const int64_t numel = shape_numel(t.shape);
  require(numel == t.numel(), "make_view: tensor '" + name + "': shape " + shape_str(t.shape) +
                                  " does not match " + std::to_string(t.numel()) + " elements");
  return v;
}

template <class T>
TensorView make_view(const std::string& name, const Tensor<T>& t) {
  TensorView v = view_header(name, t);
  // One pass over the bytes: assigned from the range, not zero-filled and then copied (the
  // zeroing was a sixth of golden's time beyond run at hq16).
  const auto* first = reinterpret_cast<const uint8_t*>(t.data.data());
  v.bytes.assign(first, first + t.data.size() * sizeof(T));
  return v;
}

// make_view of a tensor the caller gives up: the view adopts its elements (no copy) when it owns
// them; t is left empty. (A borrowed tensor's memory is not its own to hand on: copied.)
template <class T>
TensorView make_view(const std::string& name, Tensor<T>&& t) {
  if (t.data.borrowed()) {
    TensorView v = make_view(name, static_cast<const Tensor<T>&>(t));
    t = Tensor<T>();
    return v;
  }
  TensorView v = view_header(name, t);
  auto owner = std::make_shared<Storage<T>>(std::move(t.data));
  const auto* first = reinterpret_cast<const uint8_t*>(owner->data());
  const size_t n = owner->size() * sizeof(T);
  v.bytes = TensorBytes::shared(std::move(owner), first, n);
  t = Tensor<T>();
  return v;
}

}  // namespace indexshare::io
