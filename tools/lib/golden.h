// indexshare: golden sets. A golden set is a folder holding
//   manifest.json        what the set is: format version, generator, the canonical problem and a
//                        replay command, config numbers, conventions, the layer schedule, every
//                        tensor with file, dtype, shape, SHA-256 and role, and tolerance budgets
//   tensors.safetensors  the tensors (standard safetensors; see the README for the names)
// Sets are written atomically (a temporary folder, then rename) and verified on reading: a tensor
// whose bytes no longer match the manifest's SHA-256 is refused (tampered or corrupted).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ref/layer.h"
#include "ref/problem.h"
#include "tools/lib/impl.h"
#include "tools/lib/kernel_registry.h"
#include "tools/lib/safetensors.h"

namespace indexshare::golden {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kTensorFile = "tensors.safetensors";

enum class Role { input, output, reference };
std::string role_name(Role r);

// A part of a set's query rows, for a set computed by several processes (MPI ranks, see
// tools/lib/distributed.h): rows [begin, end) of the set's row list (every query row of the
// problem in order, or the --rows list).
struct RowPart {
  int64_t begin = 0, end = 0;
  // Every part's per-row values in row order, from this part's (a collective under MPI, every rank
  // calling it the same number of times: tools/lib/distributed.cc). The budget's row subset
  // (ref/bounds.h budget_rows) is chosen from the whole set's rows. Unset: this part is the set.
  std::function<std::vector<double>(const std::vector<double>&)> gather_rows;
};

// What a partial set (built with a RowPart) holds besides its tensors. Per-row tensors hold only
// the part's rows (their bytes are the whole set's rows [begin, end), contiguous); key-side
// tensors (indexer k, attn kv, the paged caches, cu_seqlens) are whole, the same on every part.
// The one value computed over every row, each layer's attention budget, is kept as this part's
// maxima, which combine exactly (max) into the whole set's (ref/bounds.h BudgetParts).
struct ShardInfo {
  bool active = false;
  int64_t begin = 0, end = 0, total = 0;  // this part's rows of the set's `total`
  std::map<std::string, Shape> per_row;   // per-row tensor -> its shape in the whole set
  struct Budget {
    double emul = 0, ref_round = 0, emu_err = 0;
  };
  std::map<std::string, Budget> budgets;  // "layers.{l}.attn.out" -> this part's maxima
};

struct GoldenSet {
  nlohmann::json manifest;                 // without the "tensors" list (filled on writing)
  std::vector<io::TensorView> tensors;
  std::map<std::string, Role> roles;
  ShardInfo shard;                         // active only for a part (build with a RowPart)
  // Adds tensor `name` with its role; the view adopts t's elements (no copy when t is moved in).
  template <class T>
  void add(const std::string& name, Tensor<T> t, Role role) {
    tensors.push_back(io::make_view(name, std::move(t)));
    roles[name] = role;
  }
};

// Golden presets: name -> (problem descriptor, kind). Kinds: "stack" (kernel-level stack),
// "attention-edge" (one layer whose attention indices exercise the edge rules), "decode", "module".
// `kernel`: the GPU kernel (tools/lib/kernel_registry.h) the preset's set is written for, as with
// `golden --for KERNEL` (kernel presets: the kernel's real shapes, few query rows); empty for the
// others. Kernel presets are named after their kernel.
struct Preset {
  std::string name, problem, kind, description, kernel;
};
const std::vector<Preset>& presets();
const Preset& preset(const std::string& name);  // Error naming the unknown preset

// Builds a golden set. `replay` is the command line recorded in the manifest.
// with_logits = false leaves out indexer.logits (large sets).
// impl: the kernels that generate the inputs and compute the stack and the budget (simd's give
// ref's bits; tools/lib/impl.h); the manifest's generator records it.
// rows (kind "stack" only): a sampled set of those query rows (ref/layer.h; the CLI's --rows):
// every per-row tensor has rows->size() rows, in that order, equal to the full set's rows; the
// key-side tensors are whole; tensor `rows` (I32) holds the problem row numbers; config.s_q is the
// number of rows in the set and the manifest's `rows` object records the list; cu_seqlens_q is
// left out (the rows are no longer whole sequences: ks/ke give each row's window).
// part: only those rows of the set's row list (kinds stack and decode; see RowPart, ShardInfo):
// each per-row tensor's rows equal the whole set's rows [part.begin, part.end) bit for bit; the
// manifest describes the whole set (its budgets are this part's until combined).
// edit: applied to the generated per-layer inputs before anything is computed (a training set's
// rows without keys; tools/lib/golden_train.h).
using InputEdit = std::function<void(std::vector<ref::LayerInputs>&)>;
GoldenSet build(const Problem& p, const std::string& kind, bool with_logits, const std::string& replay,
                Impl impl = Impl::ref, const std::vector<int64_t>* rows = nullptr, const RowPart* part = nullptr,
                const InputEdit& edit = {});

// A module-level golden set from the toy model (ref/model.h): per layer the hidden states, the
// bf16 weights, the indexer and MLA intermediates, and the kernel-level tensors of `build`.
struct ModelSpec {
  std::string preset = "tiny-glm";
  int layers = 0;          // 0: the preset's
  int64_t seq = 0;         // 0: the preset's
  std::string schedule;    // empty: the preset's
  uint64_t seed = 1;
  float sim = 0.8f;
  std::string variant = "deepseek_fp8";
  Impl impl = Impl::ref;   // ref::forward on kernels_for(impl) (the same bytes either way)
};
GoldenSet build_model(const ModelSpec& spec, const std::string& replay);

// A kernel-level stack from per-layer inputs dumped from a real model: `file` holds
// layers.{l}.indexer.{q,k,k_scale,weights,ks,ke} (Full layers; optional on Shared ones) and
// layers.{l}.attn.{q,kv[,sink]} under the golden tensor names; shapes come from the file and
// replace p's, the rest (top-k, d_v, sm, schedule) from p.
GoldenSet build_from(const std::string& file, Problem p, bool with_logits, const std::string& replay);

// Per-layer kernel inputs read from a safetensors file under the golden tensor names (a dump for
// --from, or a golden set's own tensors): shapes from the file replace p's (s_q, s_kv, h_q, d_qk,
// H, D, n_layers, indexer mode, n_seqs); the rest of p (top-k, d_v, sm, schedule) is kept.
// A model dump written by `python -m indexshare.dump` (tools/python/indexshare/dump.py): besides the
// inputs above it carries the model's own choices under the names diff judges (kDumpReferences),
// which --from does not read, and in its metadata the problem it was taken with.
inline constexpr const char* kDumpFormat = "indexshare-dump";
// The metadata `kind` of a model dump ("v4", "hyv4", ...; reads the header only); "" for any other file
// or one it cannot read (the reader that follows reports it).
std::string dump_kind(const std::string& file);
// (and the model's own attention with what diff needs to judge it: attn.model_out, attn.q_nope,
// attn.w_uk, attn.w_uv)
inline const std::set<std::string> kDumpReferences = {"indexer.topk", "indexer.logits", "attn.indices", "attn.model_out",
                                                      "attn.q_nope",  "attn.w_uk",      "attn.w_uv"};
// The metadata's problem descriptor (top-k, dv, sm, indexer=bf16, sched=) of a model dump; "" for
// any other file. A dump without one is refused naming the file.
std::string dump_problem(const io::SafetensorsFile& f, const std::string& file);

struct StackInputs {
  Problem problem;
  std::vector<ref::LayerInputs> inputs;
  bool part_rows = false;  // the per-row inputs hold a RowPart's rows only (load_dump with a part)
};
StackInputs load_stack_inputs(const io::SafetensorsFile& f, const std::string& file, Problem p);
// part: f's per-row tensors (views of their whole shape) hold only the part's rows (as read by
// load_dump with a part); the inputs' per-row tensors get those rows.
StackInputs load_stack_inputs(const io::SafetensorsFile& f, const std::string& file, Problem p, const RowPart* part);
// The inputs of a dump for --from: `file` read, under the problem the dump fixes (its tensors'
// shapes, layer count (layers.{l}.attn.q for l = 0, 1, ...), sequences and indexer mode; a model
// dump's recorded top-k, dv, sm and schedule: python -m indexshare.dump) completed by the fields of
// `problem_text` it leaves open. A field of problem_text that contradicts the dump is refused (Error
// naming both values); a plain file records no top-k, dv, sm or schedule (the text's, or defaults).
// part (MPI ranks): only the part's query rows of each per-row tensor are read (from their
// offsets in the file), the key side whole: a rank never holds the other ranks' rows.
StackInputs load_dump(const std::string& file, const std::string& problem_text, const RowPart* part = nullptr);
// What an MPI rank needs of a dump before it knows its rows: the problem (as load_dump's), the
// layers with an indexer, and each query row's window (ke - ks of layer 0), read from the header,
// cu_seqlens and layer 0's indexer.ks / ke only.
struct DumpRows {
  Problem problem;
  int indexer_layers = 0;
  std::vector<int64_t> windows;
};
DumpRows dump_rows(const std::string& file, const std::string& problem_text);
// The replay command of build_from, without its " --out DIR" (as stack_replay).
std::string from_replay(const std::string& file, const Problem& p, bool with_logits);
// build_from on inputs already loaded from `file` (the CLI loads them first, to print and replay
// the problem with the file's shapes).
// part: only those query rows (the inputs are whole; the part's rows are cut from them).
GoldenSet build_from(const std::string& file, StackInputs inputs, bool with_logits, const std::string& replay,
                     const RowPart* part = nullptr, Impl impl = Impl::ref);

// The query rows a stack's tensors are cut into: rows [begin, end) of every per-row input tensor
// (indexer q, q_scale, weights, ks, ke; attn q), the key side untouched.
void slice_rows(ref::LayerInputs& in, int64_t begin, int64_t end);


// Makes `set` (built by `build` from problem p) a set for GPU kernel k (`golden --for`): adds the
// tensors the kernel takes in a form the set does not otherwise hold (context_lens [b, next_n] for
// the paged indexer: cache_seqlens[b] - next_n + j + 1) and the manifest's `kernel` block
// (kreg::manifest_block: the call, arguments mapped to tensor names with dtype and shape, kwargs).
// The caller has checked kreg::violations and that the set's kind is k.kind.
void for_kernel(GoldenSet& set, const kreg::Kernel& k, const Problem& p);

// A kernel-level set as a front end asks for it: the CLI's `golden --problem | --preset` and
// Python's golden(problem= | preset=) share these rules (plan_stack).
struct StackRequest {
  std::string preset;          // a kernel-level golden preset, or
  std::string problem;         // a descriptor (exactly one of the two)
  std::string kind = "stack";  // with problem; kind_given: set by the caller (--kind / kind=)
  bool kind_given = false;
  std::string for_kernel;      // --for KERNEL; "" = none (a kernel preset's own kernel)
  int64_t layers = 0, seq = 0, seed = -1;  // overrides: 0 / 0 / -1 = not given
  bool rows_given = false;     // --rows TEXT
  std::string rows;
};
struct StackPlan {
  Problem problem;                      // the descriptor with the overrides, validated
  std::string kind;                     // the set's kind (the kernel's with a kernel)
  const kreg::Kernel* kernel = nullptr;  // --for, or a kernel preset's kernel
  bool rows_given = false;
  std::vector<int64_t> rows;            // the sampled rows (rows_given)
  bool kernel_preset = false;           // a kernel preset: computed with simd unless --impl is given
};
// Resolves `r`: the preset's problem and kind, the overrides (--layers sets nl; --seq sets s_kv and
// caps s_q at it; --seed the seed), the kernel (--for; a kernel preset is written for its kernel,
// another --for is refused) and its constraints (kreg::violations, checked before anything is
// computed), the rows (--rows: kind stack only, not with a kernel). Error naming the option.
StackPlan plan_stack(const StackRequest& r);

// The manifest's `replay` command of a set, without its trailing " --out DIR" (the front end adds
// the folder it writes to: the CLI's --out, GoldenSet.save's dir in Python), so that both write the
// same bytes. stack_replay: a kernel-level set of `kind` (build); for_kernel "" = no --for; rows:
// a sampled set (--rows); max_memory: the --max-memory text, left out at its default "8G".
// model_replay: a module-level set (build_model).
std::string stack_replay(const Problem& p, const std::string& kind, const std::string& for_kernel,
                         const std::vector<int64_t>* rows, Impl impl, bool with_logits, const std::string& max_memory = "8G");
std::string model_replay(const ModelSpec& spec);

// Writes `set` to `dir` atomically. The folder must not exist, or be empty, unless `force`
// (then an existing golden set there is replaced in one rename).
// Returns the manifest as written (with its "tensors" list).
nlohmann::json write(const std::string& dir, GoldenSet set, bool force);

// A tensor as a builder hands it over: its view and role, or, with `fill`, a tensor made where it
// is consumed instead of held (the view's bytes empty): fill(first, n, dst) writes rows
// [first, first + n) of it (a row: its slice along the first dimension) to dst. A derived output
// (V4's attn.out_rotated from attn.out) is made chunk by chunk on a SetWriter's writer thread.
using FillRows = std::function<void(int64_t first, int64_t n, uint8_t* dst)>;
struct Handed {
  io::TensorView view;
  Role role = Role::output;
  FillRows fill;
};
// The bytes of a handed tensor in order, to `piece`: the view's, or fill's about 8 MiB of whole
// rows at a time (never the whole tensor at once).
void for_each_piece(const io::TensorView& view, const FillRows& fill, const std::function<void(const uint8_t* p, size_t n)>& piece);

// A golden set written while it is computed (write() is one): the plan (every tensor's name, dtype,
// shape and role, in file order) first, so the tensor file's header goes first; then each tensor
// handed over with add(), in plan order, while the caller computes the next; then finish(manifest).
// Each tensor is written on a background thread and hashed on another (finish()'s caller hashes
// too), and its bytes are freed once both are done: memory holds what is in flight, not the set.
// add() waits while more than max_pending bytes are in flight (0: never). finish() adds the
// manifest's "tensors" list and publishes (the rules of write; the same bytes as write() of the
// same tensors). Errors: write's, the tensor file's (io::SafetensorsWriter), a tensor that is not
// the plan's next (a builder out of step with its plan: both named), one never handed over; a
// writer destroyed unfinished (an exception) removes its staging: nothing is published.
class SetWriter {
 public:
  struct Planned {
    io::TensorSpec spec;
    Role role = Role::output;
  };
  SetWriter(const std::string& dir, bool force, std::vector<Planned> plan, uint64_t max_pending = 0);
  ~SetWriter();
  SetWriter(const SetWriter&) = delete;
  SetWriter& operator=(const SetWriter&) = delete;
  void add(io::TensorView v, Role role);
  // A tensor with `fill`: made, hashed and written on the writer thread (it counts no bytes in flight).
  void add(Handed h);
  template <class T>
  void add(const std::string& name, Tensor<T> t, Role role) {
    add(io::make_view(name, std::move(t)), role);
  }
  nlohmann::json finish(nlohmann::json manifest);

 private:
  struct State;
  std::unique_ptr<State> s_;
};
// The plan of a set's tensors, in its order.
std::vector<SetWriter::Planned> plan_of(const GoldenSet& set);
// The bytes of the plan's largest layer (its tensors named layers.{l}.*): the max_pending of a
// writer fed layer by layer, so that the next layer computes while one is written and hashed,
// and memory holds at most two layers' tensors.
uint64_t layer_bytes(const std::vector<SetWriter::Planned>& plan);
// Where a builder hands each tensor as soon as it is final: a GoldenSet collecting them (collect:
// a tensor with `fill` made there), or a SetWriter writing them (build_v4 / write_v4, build_kpool /
// write_kpool).
using PutTensor = std::function<void(Handed)>;
PutTensor collect(GoldenSet& g);
// A builder's shorthand over a PutTensor: add(name, t, role) hands t over whole (adopted, no copy).
struct TensorSink {
  const PutTensor& put;
  template <class E>
  void add(const std::string& name, Tensor<E> t, Role role) const {
    put(Handed{io::make_view(name, std::move(t)), role, nullptr});
  }
};
// A builder's set written as it is computed: a SetWriter over `plan` (in flight: layer_bytes), emit
// handing it each tensor and returning the manifest; inputs_note, when given, becomes the manifest's
// conventions.inputs (where given inputs came from). Returns the manifest as written.
nlohmann::json write_streamed(const std::string& dir, bool force, const std::vector<SetWriter::Planned>& plan,
                              const std::function<nlohmann::json(const PutTensor&)>& emit, const std::string& inputs_note = "");

// write() in its steps, for writers that fill the tensor file themselves (tools/lib/distributed.cc):
// stage checks `dir` (the rules of write) and creates the temporary folder `<dir>.tmp.<tag>`
// holding an owner record (host, boot, pid and start time of this process; removed on publishing),
// after removing the `<dir>.tmp.*` folders whose recorded owner, a process of this host, has ended
// (a run killed outright; a note on stderr names each) and noting on stderr those it cannot prove
// stale (another host's, or without a record);
// publish writes manifest.json there (through shortest_floats) and renames the folder into place;
// discard removes it.
struct Staging {
  std::string dir, target, parent, tmp;
  bool exists = false, replace = false;
};
Staging stage(const std::string& dir, bool force, const std::string& tag);
nlohmann::json publish(const Staging& s, nlohmann::json manifest);
void discard(const Staging& s) noexcept;
// The manifest with its f32 fields (sm_scale, softmax_scale, eps, *_eps, at any depth) in their
// shortest round-trip text (f32_json, ref/problem.h): what publish writes, and what an in-memory
// set shows.
nlohmann::json shortest_floats(nlohmann::json manifest);
// The manifest's "tensors" list: one entry per tensor, in order, with its SHA-256 and role.
nlohmann::json tensor_list(const std::vector<io::TensorSpec>& specs, const std::vector<std::string>& hashes,
                           const std::map<std::string, Role>& roles);

struct Loaded {
  std::string dir;
  nlohmann::json manifest;
  io::SafetensorsFile data;
  // Lazily read sets (read with keep_bytes): the tensors larger than keep_bytes hold no bytes in
  // `data`; tensor() reads them from the file when asked, and checks their SHA-256 again.
  struct LazyTensor {
    uint64_t offset = 0;
    std::string sha256;
  };
  std::map<std::string, LazyTensor> lazy;
  // read(..., defer_hashes): the lazy tensors whose bytes have not been checked yet (each is
  // checked when read: tensor_into, Stream; verify_rest checks the others).
  mutable std::set<std::string> unverified;
  // Checks every tensor still unverified against the manifest's SHA-256 (Error naming the first
  // that differs); diff calls it before it reports, so every tensor of the set is checked once.
  void verify_rest() const;
  // Checks one lazy tensor now, if still unverified (read from the file and hashed on this
  // thread): diff checks a layer's attn.out_bf16, which it never reads, while attn.out is read
  // on a second thread. A no-op for a tensor checked already or held in memory.
  void verify(const std::string& name) const;
  const io::TensorView& get(const std::string& name) const;
  const io::TensorView* find(const std::string& name) const { return data.find(name); }
  template <class T>
  Tensor<T> tensor(const std::string& name) const {
    Tensor<T> t;
    tensor_into(name, t);
    return t;
  }
  // tensor(name) into `dst`, reusing its memory where it has room (no fresh pages).
  template <class T>
  void tensor_into(const std::string& name, Tensor<T>& dst) const {
    const io::TensorView& v = get(name);
    if (!reads_lazily<T>(name)) {
      dst = io::as_tensor<T>(v, dir + "/" + kTensorFile);
      return;
    }
    check_hash(name, read_hashed(name, dst));
  }
  // Whether tensor(name) as T reads lazy tensor `name` from the file rather than from memory.
  template <class T>
  bool reads_lazily(const std::string& name) const {
    return lazy.count(name) && get(name).dtype == io::dtype_of<T>::value;
  }
  // tensor_into's first half for a lazy tensor (reads_lazily<T>): its bytes into `dst` (reusing its
  // memory where it has room) and their SHA-256 (hex), changing nothing of the set, so a second
  // thread may run it beside loads of other tensors; check_hash(name, hex) completes it.
  template <class T>
  std::string read_hashed(const std::string& name, Tensor<T>& dst) const {
    dst.shape = get(name).shape;
    const size_t n = size_t(shape_numel(dst.shape));
    if (dst.data.borrowed()) dst.data = Storage<T>();  // a view (of a mapping) is dropped, never copied
    reserve_advised(dst.data, n);  // fresh memory advised as Tensor's constructor advises it
    dst.data.resize(n);
    return read_hashed(name, dst.data.data(), dst.data.size() * sizeof(T));
  }
  std::string read_hashed(const std::string& name, void* dst, size_t n) const;
  // A lazy tensor's bytes mapped from the file instead of read (io::map_file_range: p is null where
  // the system refuses), not yet checked: hash them (from another thread if wanted) and call
  // check_hash, as after read_hashed.
  io::MappedRange map(const std::string& name) const;
  // Lazy tensor `name`'s hash against the manifest's (Error naming it); then it is verified.
  void check_hash(const std::string& name, const std::string& sha256) const;

  // A tensor's bytes read front to back in pieces (diff's bounds' pass reads q a block of rows at a
  // time, never holding it whole): read(dst, n) gives the next n bytes; finish() checks that every
  // byte was read and, for a lazy tensor, that they match the manifest's SHA-256 (Error otherwise:
  // a caller publishes nothing it computed before finish()).
  class Stream {
   public:
    Stream(const Loaded& g, const std::string& name);
    void read(void* dst, size_t n);
    void finish();

   private:
    const Loaded& g_;
    std::string name_;
    const io::TensorView& v_;
    uint64_t done_ = 0, size_ = 0;
    io::Sha256 sha_;
  };
};
// Reads and verifies a golden set: manifest fields, every tensor's presence, dtype, shape and
// SHA-256. Errors name the file and the field. keep_bytes: tensors above it are verified (streamed
// through SHA-256) but not kept; Loaded::tensor reads them on demand (diff: a golden set is never
// held whole).
// defer_hashes: the tensors above keep_bytes are not hashed now but when they are read (load,
// Stream) or by verify_rest, so that diff hashes each tensor once instead of twice (read, then
// load); the caller must call verify_rest before it trusts a result.
Loaded read(const std::string& dir, uint64_t keep_bytes = UINT64_MAX, bool defer_hashes = false);

// A golden set's problem (from its manifest's config and layer schedule) and its layer inputs.
StackInputs stack_inputs_of(const Loaded& g);

// One line per layer and a total, for the tool's output.
std::string summary(const Loaded& g);
// The same lines from a manifest with its "tensors" list (what write has just published, without
// reading the set back; the byte count from each tensor's dtype and shape). with_replay = false
// leaves out the manifest's replay command (the command that wrote the set prints it once, as its
// __REPRO line).
std::string summary(const std::string& dir, const nlohmann::json& manifest, bool with_replay);

}  // namespace indexshare::golden
