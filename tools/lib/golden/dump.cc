// golden sets: dump import. The per-layer inputs read from a safetensors file under the golden
// tensor names (load_dump, load_stack_inputs, dump_rows), and build_from.

#include "tools/lib/golden.h"
#include "tools/lib/golden/internal.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "ref/numerics.h"
#include "tools/lib/golden_model1.h"

namespace indexshare::golden {

using nlohmann::json;
using namespace detail;

namespace {
Problem dump_shapes(const io::SafetensorsFile& f, const std::string& file, Problem p);
io::SafetensorsFile read_dump(const std::string& file, const RowPart* part, bool header_only = false);
// A problem token's field name: "k32" -> "k", "sched=FS" -> "sched".
std::string token_field(const std::string& tok) {
  const size_t eq = tok.find('=');
  if (eq != std::string::npos) return tok.substr(0, eq);
  size_t n = 0;
  while (n < tok.size() && std::isalpha(static_cast<unsigned char>(tok[n]))) ++n;
  return tok.substr(0, n);
}

// A descriptor's tokens as (field, token), in order.
using Tokens = std::vector<std::pair<std::string, std::string>>;
Tokens tokens_of(const std::string& text) {
  Tokens t;
  std::istringstream is(text);
  for (std::string tok; is >> tok;) t.emplace_back(token_field(tok), tok);
  return t;
}
std::string text_of(const Tokens& t) {
  std::string s;
  for (const auto& ft : t) s += (s.empty() ? "" : " ") + ft.second;
  return s;
}
// Whether two descriptors compute the same set: parsed, the schedules compared as their resolved
// F/S patterns ("sched=glm-5.2" equals the pattern it names); false when either does not parse.
bool same_problem(const std::string& a, const std::string& b) {
  try {
    Problem pa = parse_problem(a), pb = parse_problem(b);
    pa.sched = pa.schedule().pattern();
    pb.sched = pb.schedule().pattern();
    return pa == pb;
  } catch (const Error&) {
    return false;
  }
}

// The problem a dump is read under. The dump fixes some fields: its tensors give the shapes, the
// layer count, the sequences and the indexer mode (dump_shapes), and a model dump
// (python -m indexshare.dump) records the top-k, dv, sm and schedule it was taken with.
// problem_text completes them with the fields they leave open; a field it gives that the dump
// fixes must mean the same (compared parsed: "sm=0.5" equals "sm=0.500000000", "sched=glm-5.2"
// the pattern it names), else the dump is refused naming both values, since either silently
// winning computes a set the model did not run. A plain file of inputs records nothing: its
// top-k, dv, sm and schedule are problem_text's (the defaults where it leaves them out).
Problem dump_text_problem(const io::SafetensorsFile& f, const std::string& file, const std::string& problem_text) {
  const std::string recorded = dump_problem(f, file);
  int L = 0;
  while (f.find("layers." + std::to_string(L) + ".attn.q")) ++L;
  // The file's shapes under the smallest options (any top-k, dv fit them): only the shapes are read.
  const Problem s = dump_shapes(f, file, parse_problem("dv1 k1 nl" + std::to_string(std::max(L, 1))));
  const Tokens from_file =
      tokens_of("sq" + std::to_string(s.s_q) + " skv" + std::to_string(s.s_kv) + " hq" + std::to_string(s.h_q) + " dqk" +
                std::to_string(s.d_qk) + " ih" + std::to_string(s.index_n_heads) + " id" + std::to_string(s.index_head_dim) +
                " nl" + std::to_string(s.n_layers) + " nseq" + std::to_string(s.n_seqs) + " indexer=" + indexer_mode_name(s.indexer));
  std::set<std::string> by_file;
  for (const auto& ft : from_file) by_file.insert(ft.first);
  Tokens fixed = from_file;  // the file's fields, then the recorded ones the file does not give
  for (const auto& ft : tokens_of(recorded))
    if (!by_file.count(ft.first)) fixed.push_back(ft);
  // The fields the dump leaves open first, then each given field the dump fixes compared in that
  // whole problem (alone, "dv32" need not parse under the default dqk).
  Tokens text = fixed, given_fixed;
  for (const auto& ft : tokens_of(problem_text)) {
    const bool is_fixed = std::any_of(fixed.begin(), fixed.end(), [&](const auto& f) { return f.first == ft.first; });
    (is_fixed ? given_fixed : text).push_back(ft);
  }
  (void)parse_problem(text_of(text));  // a bad open field is refused as such
  for (const auto& given : given_fixed) {
    const std::string& field = given.first;  // a plain name: clang 14 cannot capture a structured binding
    const std::string& tok = given.second;
    const auto it = std::find_if(text.begin(), text.end(), [&](const auto& ft) { return ft.first == field; });
    Tokens with = text;
    with[size_t(it - text.begin())].second = tok;
    if (same_problem(text_of(text), text_of(with))) continue;
    const bool file_field = by_file.count(field) > 0;
    throw Error("golden: --problem gives '" + tok + "' but the dump " + file +
                (file_field ? " has '" + it->second + "' (from its tensors)" : " records '" + it->second + "' (the model's own value)") +
                ": leave the field out of --problem" + (file_field ? "" : ", or dump again with the value wanted"));
  }
  return parse_problem(text_of(text));
}
}  // namespace

StackInputs load_dump(const std::string& file, const std::string& problem_text, const RowPart* part) {
  const io::SafetensorsFile f = read_dump(file, part);
  StackInputs si = load_stack_inputs(f, file, dump_text_problem(f, file, problem_text), part);
  si.part_rows = part != nullptr;
  return si;
}

DumpRows dump_rows(const std::string& file, const std::string& problem_text) {
  const io::SafetensorsFile f = read_dump(file, nullptr, true);
  DumpRows d;
  d.problem = dump_shapes(f, file, dump_text_problem(f, file, problem_text));
  for (int l = 0; l < d.problem.n_layers; ++l) d.indexer_layers += f.find("layers." + std::to_string(l) + ".indexer.q") != nullptr;
  const Tensor<int32_t> ks = io::as_tensor<int32_t>(f.get("layers.0.indexer.ks"), file);
  const Tensor<int32_t> ke = io::as_tensor<int32_t>(f.get("layers.0.indexer.ke"), file);
  require(ks.numel() == d.problem.s_q && ke.numel() == d.problem.s_q,
          file + ": layers.0.indexer.ks / ke must hold s_q = " + std::to_string(d.problem.s_q) + " rows");
  d.windows.resize(size_t(d.problem.s_q));
  for (int64_t t = 0; t < d.problem.s_q; ++t) d.windows[size_t(t)] = int64_t(ke[t]) - int64_t(ks[t]);
  return d;
}

std::string from_replay(const std::string& file, const Problem& p, bool with_logits) {
  return "indexshare golden --from " + file + " --problem \"" + to_string(p) + "\"" + (with_logits ? "" : " --no-logits");
}

namespace {
// Refuses NaN (and +-inf unless allowed) in a float input, naming the file, the tensor and the
// first bad element. Classified from the bits: bf16 exponent all ones; e4m3fn has no inf, its NaN
// is S.1111.111.
bool nonfinite(float x, bool allow_inf) { return std::isnan(x) || (!allow_inf && std::isinf(x)); }
bool nonfinite(bf16_t x, bool allow_inf) {
  return (x.bits & 0x7F80u) == 0x7F80u && ((x.bits & 0x007Fu) != 0 || !allow_inf);
}
bool nonfinite(e4m3_t x, bool) { return (x.bits & 0x7Fu) == 0x7Fu; }
float value_of(float x) { return x; }
float value_of(bf16_t x) { return bf16_to_f32(x); }
float value_of(e4m3_t x) { return e4m3_to_f32(x); }
template <class T>
void require_finite(const Tensor<T>& t, const std::string& file, const std::string& name, bool allow_inf = false) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!nonfinite(t[i], allow_inf)) continue;
    const float v = value_of(t[i]);
    throw Error(file + ": tensor '" + name + "': element " + shape_str(unflatten(i, t.shape)) + " is " +
                (std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf") +
                (allow_inf ? " (NaN is not a valid value here)" : " (inputs must be finite)"));
  }
}

// The names load_stack_inputs reads, for layers [0, L): layers.{l}.indexer.{q,k,k_scale,weights,
// ks,ke}, layers.{l}.attn.{q,kv,sink}, and cu_seqlens_q / cu_seqlens_k. Anything else in a dump is
// refused, not ignored: a misspelt `attn.sinks`, a layer after a gap, an `attn.topk_length` or
// `indexer.q_scale` the stack would not apply.
//
// One exception, and only that one: a golden set's own tensors file may be read as a dump
// (overlap --golden reads a set through here, and `golden --from DIR/tensors.safetensors` /
// `overlap --from` take it). Such a file is recognised by the metadata golden::write gives it
// (format = "indexshare-golden"); in it the other names a golden set holds (outputs, references,
// the decode, attention-edge and module extras), exactly as tensor_rules() spells them and for
// layers [0, L), are known and ignored. A sampled set (tensor `rows`) is refused: its query rows
// are not whole sequences.
void check_dump_names(const io::SafetensorsFile& f, const std::string& file, int L) {
  static const std::set<std::string> kRead = {"indexer.q",  "indexer.k",  "indexer.k_scale", "indexer.weights",
                                              "indexer.ks", "indexer.ke", "attn.q",          "attn.kv",
                                              "attn.sink"};
  auto it = f.metadata.find("format");
  const bool golden_file = it != f.metadata.end() && it->second == "indexshare-golden";
  const bool model_dump = it != f.metadata.end() && it->second == kDumpFormat;
  const std::string expected = "layers.{l}.indexer.{q,k,k_scale,weights,ks,ke} and layers.{l}.attn.{q,kv,sink} for l in [0, " +
                               std::to_string(L) + "), cu_seqlens_q, cu_seqlens_k";
  for (const io::TensorView& v : f.tensors) {
    int64_t l = -1;
    std::string rest;
    const bool per_layer = split_layer_name(v.name, l, rest);
    if (per_layer && l >= L)
      throw Error(file + ": tensor '" + v.name + "': layer " + std::to_string(l) + " is not read: layers must be numbered 0, 1, ... "
                  "without gaps, and 'layers." + std::to_string(L) + ".attn.q' is missing (the file's layers are 0 to " +
                  std::to_string(L - 1) + ")");
    if (per_layer ? kRead.count(rest) : (v.name == "cu_seqlens_q" || v.name == "cu_seqlens_k")) continue;
    // A model dump (python -m indexshare.dump) carries the model's own choices under the names diff
    // judges; --from does not read them.
    if (model_dump && per_layer && kDumpReferences.count(rest)) continue;
    if (v.name == "rows")
      throw Error(file + ": tensor 'rows': the file holds sampled query rows (a golden set made with --rows), not whole "
                  "sequences; give the inputs of every query row");
    int64_t rl = -1;
    if (golden_file && rule_of(v.name, kAllKinds, rl)) continue;  // a golden set's own output, reference or extra
    throw Error(file + ": tensor '" + v.name + "' is not an input this reader takes (it reads " + expected +
                (golden_file ? "; in a golden set's own file also the set's other tensors" : "") +
                (model_dump ? "; in a model dump also layers.{l}.indexer.{topk,logits} and layers.{l}.attn.indices" : "") + ")");
  }
}

// Sequences of a dump: cu_seqlens_q / cu_seqlens_k (I32 [n_seqs + 1]) when given, else one. The
// number only: the boundaries are checked against it once the problem is validated.
int64_t dump_n_seqs(const io::SafetensorsFile& f, const std::string& file) {
  int64_t n_seqs = 0;
  std::string from;
  for (const char* name : {"cu_seqlens_q", "cu_seqlens_k"}) {
    const io::TensorView* cu = f.find(name);
    if (!cu) continue;
    if (cu->dtype != io::DType::I32 || cu->shape.size() != 1 || cu->shape[0] < 2)
      throw Error(file + ": tensor '" + name + "': expected I32 [n_seqs + 1] with n_seqs >= 1, got " +
                  layout_str(cu->dtype, cu->shape));
    if (n_seqs && cu->shape[0] - 1 != n_seqs)
      throw Error(file + ": tensor '" + name + "' " + shape_str(cu->shape) + " and tensor '" + from + "' [" +
                  std::to_string(n_seqs + 1) + "] disagree on the number of sequences");
    n_seqs = cu->shape[0] - 1;
    from = name;
  }
  return n_seqs ? n_seqs : 1;
}

// The boundaries must be those of the stack's flattened sequences of equal length: i * total / n.
void check_boundaries(const io::SafetensorsFile& f, const std::string& file, const char* name, int64_t total, int64_t n_seqs) {
  const io::TensorView* cu = f.find(name);
  if (!cu) return;
  const Tensor<int32_t> t = io::as_tensor<int32_t>(*cu, file);
  for (int64_t i = 0; i <= n_seqs; ++i)
    if (int64_t(t[i]) != i * (total / n_seqs))
      throw Error(file + ": tensor '" + name + "': element [" + std::to_string(i) + "] is " + std::to_string(t[i]) +
                  ", expected " + std::to_string(i * (total / n_seqs)) + " (the stack takes " + std::to_string(n_seqs) +
                  " sequences of equal length: " + std::to_string(total / n_seqs) + " rows each)");
}
}  // namespace

std::string dump_problem(const io::SafetensorsFile& f, const std::string& file) {
  auto it = f.metadata.find("format");
  if (it == f.metadata.end() || it->second != kDumpFormat) return "";
  const auto kind = f.metadata.find("kind");
  require(kind == f.metadata.end() || kind->second != "kpool",
          file + ": metadata 'kind' is 'kpool': a glm5_next dump (GLM-5.3's pooled indexer) has no token top-k (golden --from, "
                 "diff, overlap and search take it)");
  auto p = f.metadata.find("problem");
  require(p != f.metadata.end() && !p->second.empty(),
          file + ": metadata 'problem' is missing: a model dump (format " + kDumpFormat +
              ") records the top-k, dv, sm and schedule it was taken with");
  try {  // checked here to name the file; the layer count comes from the file, as the CLI does
    int L = 0;
    while (f.find("layers." + std::to_string(L) + ".attn.q")) ++L;
    (void)parse_problem(p->second.find("nl") == std::string::npos ? p->second + " nl" + std::to_string(std::max(L, 1)) : p->second);
  } catch (const Error& e) {
    throw Error(file + ": metadata 'problem': " + e.what());
  }
  return p->second;
}

namespace {
// The problem of a dump's inputs: its shapes (from the headers of layers.0.attn.q, attn.kv and
// indexer.q, and cu_seqlens) replace p's; the layer count is the file's.
Problem dump_shapes(const io::SafetensorsFile& f, const std::string& file, Problem p) {
  int L = 0;
  while (f.find("layers." + std::to_string(L) + ".attn.q")) ++L;
  require(L > 0, file + ": no tensor 'layers.0.attn.q': expected per-layer inputs under the golden tensor names");
  check_dump_names(f, file, L);
  const io::TensorView& q0 = f.get("layers.0.attn.q");
  const io::TensorView& kv0 = f.get("layers.0.attn.kv");
  require(q0.shape.size() == 3 && kv0.shape.size() == 3, file + ": layers.0.attn.q / attn.kv must be rank 3");
  p.n_layers = L;
  p.s_q = q0.shape[0];
  p.h_q = q0.shape[1];
  p.d_qk = q0.shape[2];
  p.s_kv = kv0.shape[0];
  const io::TensorView& iq0 = f.get("layers.0.indexer.q");
  require(iq0.shape.size() == 3, file + ": layers.0.indexer.q must be [s_q, H, D]");
  p.index_n_heads = iq0.shape[1];
  p.index_head_dim = iq0.shape[2];
  p.indexer = iq0.dtype == io::DType::F8_E4M3 ? IndexerMode::fp8 : IndexerMode::bf16;
  p.n_seqs = dump_n_seqs(f, file);
  try {
    p.validate();
  } catch (const Error& e) {
    throw Error(file + ": " + e.what() + " (shapes from the file's layers.0.attn.q, attn.kv, indexer.q and cu_seqlens)");
  }
  check_boundaries(f, file, "cu_seqlens_q", p.s_q, p.n_seqs);
  check_boundaries(f, file, "cu_seqlens_k", p.s_kv, p.n_seqs);
  return p;
}

// A dump's tensors as load_stack_inputs reads them: with `part`, each per-row tensor's view keeps
// its whole shape but holds only rows [part->begin, part->end) (read from their offsets, pread),
// the other tensors whole; header_only: no bytes but those of cu_seqlens and indexer.ks / ke.
io::SafetensorsFile read_dump(const std::string& file, const RowPart* part, bool header_only) {
  if (!part && !header_only) return io::read_safetensors(file);
  io::SafetensorsIndex idx = io::read_safetensors_index(file, 0);
  for (size_t i = 0; i < idx.file.tensors.size(); ++i) {
    io::TensorView& v = idx.file.tensors[i];
    const uint64_t size = uint64_t(shape_numel(v.shape)) * io::dtype_size(v.dtype);
    const bool rows = per_row_tensor(v.name) && !v.shape.empty() && v.shape[0] > 0;
    const bool window = v.name.size() > 11 && (v.name.ends_with(".indexer.ks") || v.name.ends_with(".indexer.ke"));
    if (header_only) {
      if (!window && v.name.rfind("cu_seqlens_", 0) != 0) continue;
      v.bytes.resize(size);
      io::read_file_range(file, idx.offsets[i], v.bytes.mutable_data(), size);
    } else if (rows) {
      require(part->end <= v.shape[0], file + ": tensor '" + v.name + "' " + shape_str(v.shape) + " has fewer than the " +
                                           std::to_string(part->end) + " query rows of this part");
      const uint64_t row = size / uint64_t(v.shape[0]);
      v.bytes.resize(row * uint64_t(part->end - part->begin));
      io::read_file_range(file, idx.offsets[i] + row * uint64_t(part->begin), v.bytes.mutable_data(), v.bytes.size());
    } else {
      v.bytes.resize(size);
      io::read_file_range(file, idx.offsets[i], v.bytes.mutable_data(), size);
    }
  }
  return std::move(idx.file);
}
}  // namespace

StackInputs load_stack_inputs(const io::SafetensorsFile& f, const std::string& file, Problem p) {
  return load_stack_inputs(f, file, std::move(p), nullptr);
}

StackInputs load_stack_inputs(const io::SafetensorsFile& f, const std::string& file, Problem p, const RowPart* part) {
  p = dump_shapes(f, file, std::move(p));
  const int L = int(p.n_layers);
  const Schedule sched = p.schedule();
  std::vector<ref::LayerInputs> inputs(static_cast<size_t>(L));
  const int64_t s_kv = p.s_kv, H = p.index_n_heads, D = p.index_head_dim;
  // With a part, the per-row tensors' views hold its rows only (read_dump): s_q of them.
  const int64_t s_q = part ? part->end - part->begin : p.s_q;
  auto bf16_to_f = [](const Tensor<bf16_t>& b) {
    Tensor<float> x(b.shape);
    for (int64_t i = 0; i < b.numel(); ++i) x[i] = bf16_to_f32(b[i]);
    return x;
  };
  for (int l = 0; l < L; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    ref::LayerInputs& in = inputs[size_t(l)];
    in.has_indexer = f.find(pre + "indexer.q") != nullptr;
    require(in.has_indexer || !sched.is_full(l), file + ": Full layer " + std::to_string(l) + " has no '" + pre + "indexer.q'");
    io::TensorView rows_view;  // a per-row tensor's view with the part's row count
    auto get = [&](const std::string& n, const Shape& shape) -> const io::TensorView& {
      const io::TensorView& v = f.get(pre + n);
      if (!part || shape.empty() || shape[0] != s_q || !per_row_tensor(pre + n)) {
        io::expect_shape(v, shape, file);
        return v;
      }
      Shape whole = shape;
      whole[0] = p.s_q;
      io::expect_shape(v, whole, file);
      rows_view = io::TensorView{v.name, v.dtype, shape, v.bytes};
      return rows_view;
    };
    // Every float input must be finite (attn.sink may be +-inf: the sink rule defines both): a NaN
    // would otherwise reach the golden outputs, or surface late without the file and tensor.
    if (in.has_indexer) {
      if (p.indexer == IndexerMode::fp8) {
        in.index_q8 = io::as_tensor<e4m3_t>(get("indexer.q", {s_q, H, D}), file);
        in.index_k8 = io::as_tensor<e4m3_t>(get("indexer.k", {s_kv, D}), file);
        require_finite(in.index_q8, file, pre + "indexer.q");
        require_finite(in.index_k8, file, pre + "indexer.k");
      } else {
        const Tensor<bf16_t> q = io::as_tensor<bf16_t>(get("indexer.q", {s_q, H, D}), file);
        const Tensor<bf16_t> k = io::as_tensor<bf16_t>(get("indexer.k", {s_kv, D}), file);
        require_finite(q, file, pre + "indexer.q");
        require_finite(k, file, pre + "indexer.k");
        in.index_q = bf16_to_f(q);
        in.index_k = bf16_to_f(k);
      }
      in.index_k_scale = io::as_tensor<float>(get("indexer.k_scale", {s_kv}), file);
      in.index_weights = io::as_tensor<float>(get("indexer.weights", {s_q, H}), file);
      require_finite(in.index_k_scale, file, pre + "indexer.k_scale");
      require_finite(in.index_weights, file, pre + "indexer.weights");
      in.index_q_scale = Tensor<float>({s_q, H}, 1.0f);  // folded into the weights upstream
      in.ks = io::as_tensor<int32_t>(get("indexer.ks", {s_q}), file);
      in.ke = io::as_tensor<int32_t>(get("indexer.ke", {s_q}), file);
      for (int64_t t = 0; t < s_q; ++t)
        require(0 <= in.ks[t] && in.ks[t] <= in.ke[t] && in.ke[t] <= s_kv,
                file + ": " + pre + "indexer.ks/ke: row " + std::to_string(t) + " outside 0 <= ks <= ke <= s_kv");
    } else {
      in.ks = inputs[size_t(sched.source(l))].ks;
      in.ke = inputs[size_t(sched.source(l))].ke;
    }
    in.q = io::as_tensor<bf16_t>(get("attn.q", {s_q, p.h_q, p.d_qk}), file);
    in.kv = io::as_tensor<bf16_t>(get("attn.kv", {s_kv, 1, p.d_qk}), file);
    require_finite(in.q, file, pre + "attn.q");
    require_finite(in.kv, file, pre + "attn.kv");
    if (f.find(pre + "attn.sink")) {
      in.sink = io::as_tensor<float>(get("attn.sink", {p.h_q}), file);
      require_finite(*in.sink, file, pre + "attn.sink", /*allow_inf=*/true);
    }
  }
  return StackInputs{p, std::move(inputs)};
}

GoldenSet build_from(const std::string& file, Problem p, bool with_logits, const std::string& replay) {
  return build_from(file, load_stack_inputs(io::read_safetensors(file), file, std::move(p)), with_logits, replay);
}

GoldenSet build_from(const std::string& file, StackInputs si, bool with_logits, const std::string& replay,
                     const RowPart* part, Impl impl) {
  const Problem& q = si.problem;
  if (part && !si.part_rows)
    for (ref::LayerInputs& in : si.inputs) slice_rows(in, part->begin, part->end);
  GoldenSet g = build_stack(q, std::move(si.inputs), "stack", with_logits, replay, impl, nullptr, part);
  g.manifest["kind"] = "stack-from-file";
  g.manifest["source_file"] = file;
  return g;
}

StackInputs stack_inputs_of(const Loaded& g) {
  const json& c = g.manifest["config"];
  const std::string where = g.dir + "/manifest.json";
  require(g.manifest.value("kind", "") != "hyv4", where + ": field 'kind' is 'hyv4': a HY V4 set's indexer is not the stack's "
                                                          "(tools/lib/golden_hyv4.h): diff judges it, overlap and search read it");
  require(g.manifest.value("kind", "") != "kpool", where + ": field 'kind': a kpool set (GLM-5.3's pooled indexer) has no "
                                                  "token top-k (diff judges it, overlap and search read its pools)");
  require(!g.manifest.contains("rows"), where + ": field 'rows': the set holds sampled query rows (--rows); overlap "
                                        "statistics and position buckets need every row: use --problem with its problem");
  Problem p;
  try {
    p.d_v = c.at("d_v").get<int64_t>();
    p.index_topk = c.at("topk").get<int64_t>();
    p.sm = c.at("sm_scale").get<float>();
    if (!c.at("seed").is_number_integer() || c.at("seed").get<int64_t>() < 0) throw Error(where + ": field 'config.seed' is not an integer >= 0");
    p.seed = c.at("seed").get<uint64_t>();
    std::string pattern;
    for (const json& l : g.manifest.at("layers")) pattern += l.at("kind") == "full" ? 'F' : 'S';
    p.sched = pattern;
    p.n_layers = int64_t(pattern.size());
  } catch (const json::exception& e) {
    throw Error(where + ": config or layers: " + e.what());
  }
  p.s_q = p.s_kv = 1;  // replaced from the tensors
  return load_stack_inputs(g.data, g.dir + "/" + kTensorFile, p);
}

std::string dump_kind(const std::string& file) {
  io::SafetensorsIndex idx;
  try {
    idx = io::read_safetensors_index(file, 0);
  } catch (const Error&) {
    return "";  // not readable: the reader that follows checks the options first, then reports the file
  }
  const auto& m = idx.file.metadata;
  const auto f = m.find("format"), k = m.find("kind");
  return f != m.end() && f->second == kDumpFormat && k != m.end() ? k->second : "";
}

namespace detail {

Tensor<float> dumped_values(const io::SafetensorsFile& f, const std::string& file, const std::string& name,
                            std::initializer_list<io::DType> dtypes, const Shape& shape) {
  const io::TensorView* v = f.find(name);
  require(v != nullptr, file + ": tensor '" + name + "' is missing (the layer's kind needs it)");
  bool dtype_ok = false;
  for (io::DType d : dtypes) dtype_ok = dtype_ok || v->dtype == d;
  require(dtype_ok && v->shape == shape, file + ": tensor '" + name + "' is " + io::dtype_name(v->dtype) + " " + shape_str(v->shape) +
                                             ", expected " + io::dtype_name(*dtypes.begin()) + " " + shape_str(shape));
  Tensor<float> t(shape);
  if (v->dtype == io::DType::F32) {
    t = io::as_tensor<float>(*v, file);
  } else {
    const Tensor<bf16_t> b = io::as_tensor<bf16_t>(*v, file);
    for (int64_t i = 0; i < b.numel(); ++i) t[i] = bf16_to_f32(b[i]);
  }
  for (int64_t i = 0; i < t.numel(); ++i)
    require(std::isfinite(t[i]), file + ": tensor '" + name + "': element " + shape_str(unflatten(i, t.shape)) + " is not finite "
                                                                                                                  "(inputs must be finite)");
  return t;
}

}  // namespace detail

}  // namespace indexshare::golden
