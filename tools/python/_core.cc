// indexshare._core: the nanobind extension under the Python package (tools/python/indexshare).
//
// It binds the library the CLI stands on (ref/, simd/, tools/lib/) and nothing else: the package's
// Python layer (tools/python/indexshare/*.py) checks and converts arguments (numpy / torch, dtypes,
// ranks, device) and names them in its errors; this layer takes C-contiguous CPU arrays of raw
// element types (bf16 as uint16 codes, e4m3 as uint8 codes) and returns numpy arrays that own the
// C++ result without a copy (a capsule holds the moved Tensor). indexshare::Error (bad input, with
// the library's message naming the tensor) becomes ValueError. The GIL is released while C++
// computes. Input arrays reach the kernels without a copy (borrow: a read-only view of their memory).
// topk, a short kernel where a call's fixed cost shows, also takes the caller's arrays as they are: its
// typed arguments refuse (TypeError) whatever the Python layer would check or convert, and torch tensors
// and its result go through DLPack's C exchange API (the fast path of indexshare/kernels.py topk).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ref/attention.h"
#include "ref/config.h"
#include "ref/error.h"
#include "ref/indexer.h"
#include "ref/kpool/layer.h"
#include "ref/module.h"
#include "ref/module_ops.h"
#include "ref/numerics.h"
#include "ref/overlap.h"
#include "ref/problem.h"
#include "ref/stack.h"
#include "ref/topk.h"
#include "ref/train/indexer_loss.h"
#include "ref/train/attention_bwd.h"
#include "ref/v4/layer.h"
#include "ref/fp4.h"
#include "simd/fp4.h"
#include "simd/simd.h"
#include "tools/lib/cost_report.h"
#include "tools/judge/diff.h"
#include "tools/lib/golden.h"
#include "tools/lib/golden_v4.h"
#include "tools/lib/golden_train.h"
#include "tools/lib/options.h"
#include "tools/lib/safetensors.h"
#include "tools/lib/svg.h"

#include "tools/python/core.h"

namespace nb = nanobind;
using namespace indexshare;
using namespace indexshare::core;


namespace {
std::string overlap_json(golden::StackInputs si, bool generate, int buckets, bool shared_stats, const std::string& impl);

// ---- torch tensors through DLPack's C exchange API (DLPack 1.3; a torch that has it, 2.15 here, puts it on
// the type as Tensor.__dlpack_c_exchange_api__, a capsule "dlpack_exchange_api"): a tensor's DLTensor is read and a
// result handed over by C function pointers, without torch's Python argument parsing or any capsule.
// The layouts below are DLPack 1.x's (stable within a major version; the header's major is checked).
namespace dlx {
using nb::dlpack::dltensor;
struct Version {
  uint32_t major, minor;
};
struct ManagedVersioned {  // DLManagedTensorVersioned
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedVersioned* self);
  uint64_t flags;
  dltensor dl_tensor;
};
struct ExchangeApi {  // DLPackExchangeAPI
  struct Header {
    Version version;
    Header* prev_api;
  } header;
  int (*managed_tensor_allocator)(dltensor*, ManagedVersioned**, void*, void (*)(void*, const char*, const char*));
  int (*managed_tensor_from_py_object_no_sync)(void*, ManagedVersioned**);
  int (*managed_tensor_to_py_object_no_sync)(ManagedVersioned*, void**);
  int (*dltensor_from_py_object_no_sync)(void*, dltensor*);
  int (*current_work_stream)(int32_t, int32_t, void**);
};
constexpr int32_t kCpu = 1;                      // kDLCPU
constexpr nb::dlpack::dtype kF32{2, 32, 1}, kI32{0, 32, 1};  // kDLFloat / kDLInt, bits, lanes

// The API of obj's type (cached for one type: torch.Tensor), or nullptr.
const ExchangeApi* api_of(nb::handle obj) {
  static PyTypeObject* type = nullptr;
  static const ExchangeApi* api = nullptr;
  PyTypeObject* t = Py_TYPE(obj.ptr());
  if (t == type) return api;
  PyObject* cap = PyObject_GetAttrString(reinterpret_cast<PyObject*>(t), "__dlpack_c_exchange_api__");
  const ExchangeApi* a = cap ? static_cast<const ExchangeApi*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api")) : nullptr;
  Py_XDECREF(cap);
  PyErr_Clear();
  if (a && (a->header.version.major != 1 || !a->dltensor_from_py_object_no_sync)) a = nullptr;
  type = t;
  api = a;
  return a;
}

// obj (a CPU tensor of dtype `want`, rank `ndim`, C-contiguous) as a read-only view of its memory; anything
// else is a TypeError, after which the Python layer takes its checked path (whose errors name the argument).
template <class T>
BorrowedTensor<T> borrow(const ExchangeApi* api, nb::handle obj, nb::dlpack::dtype want, int32_t ndim) {
  dltensor d;
  if (api_of(obj) != api || api->dltensor_from_py_object_no_sync(obj.ptr(), &d) != 0) {  // (same type only)
    PyErr_Clear();
    throw nb::type_error("not a DLPack tensor");
  }
  bool ok = d.device.device_type == kCpu && d.dtype == want && d.ndim == ndim;
  Shape shape;
  int64_t stride = 1;
  for (int32_t i = ok ? ndim - 1 : -1; i >= 0; --i) {
    if (d.strides && d.shape[i] > 1 && d.strides[i] != stride) ok = false;
    stride *= d.shape[i];
  }
  if (!ok) throw nb::type_error("not a C-contiguous CPU tensor of the expected dtype and rank");
  shape.assign(d.shape, d.shape + ndim);
  return BorrowedTensor<T>(std::move(shape), reinterpret_cast<const T*>(static_cast<const char*>(d.data) + d.byte_offset));
}

// Moves `t` into a DLManagedTensorVersioned that torch takes over (no copy; its deleter frees the Tensor).
template <class T>
nb::object to_torch(const ExchangeApi* api, Tensor<T>&& t, nb::dlpack::dtype dtype) {
  struct Held {
    ManagedVersioned m;
    Tensor<T> t;
    std::vector<int64_t> shape, strides;
  };
  auto* h = new Held{{}, std::move(t), {}, {}};
  h->shape.assign(h->t.shape.begin(), h->t.shape.end());
  h->strides.resize(h->shape.size());
  for (size_t i = h->shape.size(), s = 1; i-- > 0; s *= size_t(h->shape[i])) h->strides[i] = int64_t(s);
  h->m.version = {1, 0};
  h->m.manager_ctx = h;
  h->m.deleter = [](ManagedVersioned* m) { delete static_cast<Held*>(m->manager_ctx); };
  h->m.flags = 0;
  h->m.dl_tensor = {h->t.data.data(), {kCpu, 0}, int32_t(h->shape.size()), dtype, h->shape.data(), h->strides.data(), 0};
  void* out = nullptr;
  // (On failure torch may or may not have taken h over: it is left, never freed twice.)
  if (api->managed_tensor_to_py_object_no_sync(&h->m, &out) != 0) throw nb::python_error();
  return nb::steal(static_cast<PyObject*>(out));
}
}  // namespace dlx

nb::tuple attention_tuple(ref::AttentionOut&& a) {
  return nb::make_tuple(to_numpy<float>(std::move(a.out)), to_numpy<uint16_t>(std::move(a.out_bf16)),
                        to_numpy<float>(std::move(a.max_logits)), to_numpy<float>(std::move(a.lse)));
}

// A named, raw tensor as Python sees it: (name, safetensors dtype, shape, uint8 bytes).
using Raw = std::tuple<std::string, std::string, std::vector<int64_t>, In<uint8_t>>;

io::SafetensorsFile to_file(const std::vector<Raw>& tensors, const std::string& source) {
  io::SafetensorsFile f;
  f.source = source;
  for (const auto& [name, dtype, shape, bytes] : tensors) {
    io::TensorView v;
    v.name = name;
    v.dtype = io::parse_dtype(dtype);
    v.shape = shape;
    v.bytes.assign(bytes.data(), bytes.data() + bytes.size());
    require(int64_t(v.bytes.size()) == shape_numel(shape) * int64_t(io::dtype_size(v.dtype)),
            source + ": tensor '" + name + "': " + std::to_string(v.bytes.size()) + " bytes do not match dtype " + dtype +
                " and shape " + shape_str(shape));
    require(!f.find(name), source + ": tensor '" + name + "' is given twice");
    f.tensors.push_back(std::move(v));
  }
  return f;
}

// Views of `views` (owned by `owner`, a Python object that keeps them alive): (name, dtype, shape, uint8 array).
nb::list views_of(const std::vector<io::TensorView>& views, nb::handle owner) {
  nb::list out;
  for (const io::TensorView& v : views) {
    const size_t n = v.bytes.size();
    nb::ndarray<nb::numpy, const uint8_t> a(v.bytes.data(), 1, &n, owner);
    out.append(nb::make_tuple(v.name, io::dtype_name(v.dtype), v.shape, a));
  }
  return out;
}

// An in-memory golden set and the replay command it will record (without " --out DIR").
struct PyGolden {
  golden::GoldenSet set;
  std::string replay;
};

struct PyLoaded {
  golden::Loaded loaded;
};


Problem problem_of(const std::string& text) {
  Problem p = parse_problem(text);
  p.validate();
  return p;
}

// A kernel-level set (`indexshare golden --problem | --preset`): golden::plan_stack holds the rules
// the CLI applies (preset, overrides, --for, --rows). impl "" = the CLI without --impl: simd for a
// kernel preset, else "auto" (the package's default).
PyGolden golden_stack(const std::string& preset, const std::string& problem, const std::optional<std::string>& kind,
                      const std::string& impl, const std::optional<std::string>& rows_text, bool with_logits,
                      const std::string& for_kernel, int64_t layers, int64_t seq, int64_t seed) {
  golden::StackRequest req;
  req.preset = preset;
  req.problem = problem;
  req.kind_given = kind.has_value();
  if (kind) req.kind = *kind;
  req.for_kernel = for_kernel;
  req.layers = layers;
  req.seq = seq;
  req.seed = seed;
  req.rows_given = rows_text.has_value();
  if (rows_text) req.rows = *rows_text;
  const golden::StackPlan plan = golden::plan_stack(req);
  const Problem& p = plan.problem;
  const std::vector<int64_t>* rows = plan.rows_given ? &plan.rows : nullptr;
  const Impl how = impl.empty() && plan.kernel_preset
                       ? Impl::simd
                       : resolve_impl(impl.empty() ? "auto" : impl, p, rows ? int64_t(rows->size()) : p.s_q);
  PyGolden g;
  g.replay = golden::stack_replay(p, plan.kind, plan.kernel ? plan.kernel->name : "", rows, how, with_logits);
  nb::gil_scoped_release release;
  g.set = golden::build(p, plan.kind, with_logits, g.replay, how, rows);
  if (plan.kernel) golden::for_kernel(g.set, *plan.kernel, p);
  return g;
}

// The indexer's logits, FP8 mode (T = e4m3_t, codes as uint8) or unquantized (T = float).
template <class T, class RawT>
nb::object indexer_logits(In<RawT> q, In<RawT> k, In<float> k_scale, In<float> weights, In<int32_t> ks, In<int32_t> ke,
                          Impl impl) {
  const auto tq = borrow<T>(q), tk = borrow<T>(k);
  const auto ts = borrow<float>(k_scale), tw = borrow<float>(weights);
  const auto ts0 = borrow<int32_t>(ks), te = borrow<int32_t>(ke);
  note_inputs(&tq.get(), &tk.get(), &ts.get(), &tw.get(), &ts0.get(), &te.get());
  const ref::Kernels kern = kernels_for(impl);
  auto r = timed([&] {
    if constexpr (std::is_same_v<T, e4m3_t>) return kern.logits_fp8(tq, tk, ts, tw, ts0, te);
    else return kern.logits_f32(tq, tk, ts, tw, ts0, te);
  });
  return to_numpy<float>(std::move(r));
}

std::vector<nb::dict> stack_outputs(std::vector<ref::StackLayerOutputs>&& outs) {
  std::vector<nb::dict> layers;
  for (ref::StackLayerOutputs& o : outs) {
    nb::dict d;
    d["layer"] = o.layer;
    d["kind"] = o.kind == LayerKind::full ? "full" : "shared";
    d["source"] = o.source;
    if (o.logits.numel()) d["logits"] = to_numpy<float>(std::move(o.logits));
    if (o.own_topk.numel()) d["own_topk"] = to_numpy<int32_t>(std::move(o.own_topk));
    d["used_topk"] = to_numpy<int32_t>(std::move(o.used_topk));
    d["indices"] = to_numpy<int32_t>(std::move(o.indices));
    nb::tuple a = attention_tuple(std::move(o.attn));
    d["out"] = a[0];
    d["out_bf16"] = a[1];
    d["max_logits"] = a[2];
    d["lse"] = a[3];
    layers.push_back(d);
  }
  return layers;
}

// Threads, the SIMD target, the per-thread records, the problem descriptor, Impl, the presets and kernels.
void bind_runtime(nb::module_& m) {
  m.def("set_num_threads", [](int n) {
    require(n >= 1, "threads: expected >= 1, got " + std::to_string(n));
    omp_set_num_threads(n);
  });
  m.def("get_num_threads", [] { return omp_get_max_threads(); });
  m.def("simd_target", [] { return simd::current_target(); });
  m.def("last_kernel_seconds", [] { return last_kernel_seconds; });
  m.def("last_input_pointers", [] { return last_input_pointers; });

  // ---- problem descriptor (ref/problem.h) ----
  m.def("problem_canonical", [](const std::string& text) { return to_string(problem_of(text)); });
  m.def("problem_fields", [](const std::string& text) {
    const Problem p = problem_of(text);
    nb::dict d;
    d["s_q"] = p.s_q; d["s_kv"] = p.s_kv; d["h_q"] = p.h_q; d["d_qk"] = p.d_qk; d["d_v"] = p.d_v;
    d["index_n_heads"] = p.index_n_heads; d["index_head_dim"] = p.index_head_dim; d["index_topk"] = p.index_topk;
    d["seed"] = p.seed; d["indexer"] = indexer_mode_name(p.indexer); d["sm_scale"] = p.sm_scale();
    d["sink"] = sink_mode_name(p.sink); d["n_layers"] = p.n_layers; d["sched"] = p.sched;
    d["schedule"] = p.schedule().pattern(); d["sim"] = p.sim; d["drift"] = p.drift; d["recency"] = p.recency;
    d["sinks"] = p.sinks; d["own"] = p.own; d["n_seqs"] = p.n_seqs;
    return d;
  });
  // The computation path the kernel and module functions take (tools/lib/impl.h).
  nb::enum_<Impl>(m, "Impl").value("ref", Impl::ref).value("simd", Impl::simd);
  m.def("resolve_impl", [](const std::string& impl, const std::string& problem) {
    return impl_name(resolve_impl(impl, problem_of(problem)));
  });
  m.def("presets", [] {
    std::vector<std::tuple<std::string, std::string, std::string, std::string, std::string>> out;
    for (const golden::Preset& p : golden::presets()) out.emplace_back(p.name, p.problem, p.kind, p.description, p.kernel);
    return out;
  });
  // The options golden and diff share with the CLI (option_table, tools/lib/options.h).
  m.def("options", [] {
    std::vector<std::tuple<std::string, std::string, std::string, std::string, int64_t, int64_t, std::string>> out;
    for (const OptionSpec& o : option_table()) out.emplace_back(o.command, o.cli, o.python, o.meaning, o.lo, o.hi, o.range);
    return out;
  });
  // The registered GPU kernels (tools/lib/kernel_registry.h): name and the golden kind of their sets.
  m.def("kernel_kinds", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const kreg::Kernel& k : kreg::kernels()) out.emplace_back(k.name, k.kind);
    return out;
  });
}

// Golden sets (build, save, load), diff, and writing a safetensors file.
void bind_golden(nb::module_& m) {
  // ---- golden sets (tools/lib/golden.h) ----
  nb::class_<PyGolden>(m, "GoldenSet")
      .def_prop_ro("manifest_json", [](const PyGolden& g) { return golden::shortest_floats(g.set.manifest).dump(); })
      .def_prop_ro("replay", [](const PyGolden& g) { return g.replay; })
      .def("tensors", [](nb::handle self) { return views_of(nb::cast<PyGolden&>(self).set.tensors, self); })
      .def("roles", [](const PyGolden& g) {
        nb::dict d;
        for (const auto& [name, role] : g.set.roles) d[name.c_str()] = golden::role_name(role);
        return d;
      })
      .def("save", [](const PyGolden& g, const std::string& dir, bool force) {
        golden::GoldenSet copy = g.set;
        copy.manifest["replay"] = g.replay + " --out " + dir;
        nb::gil_scoped_release release;
        return golden::write(dir, std::move(copy), force).dump();
      });
  m.def("golden_stack", &golden_stack, nb::arg("preset"), nb::arg("problem"), nb::arg("kind").none(), nb::arg("impl"),
        nb::arg("rows").none(), nb::arg("with_logits"), nb::arg("for_kernel"), nb::arg("layers"), nb::arg("seq"),
        nb::arg("seed"));
  m.def("golden_model", [](const std::string& model, int layers, int64_t seq, const std::string& schedule, uint64_t seed,
                           float sim, const std::string& variant, const std::string& impl) {
    golden::ModelSpec spec;
    spec.preset = model; spec.layers = layers; spec.seq = seq; spec.schedule = schedule; spec.seed = seed;
    spec.sim = sim; spec.variant = variant;
    spec.impl = resolve_model_impl(impl, model_preset(model), layers, seq);
    PyGolden g;
    g.replay = golden::model_replay(spec);
    nb::gil_scoped_release release;
    g.set = golden::build_model(spec, g.replay);
    return g;
  });
  m.def("golden_train", [](const std::string& problem, const std::string& loss, const std::string& target, bool relu,
                           double loss_coeff, const std::string& impl, const std::string& for_kernel, bool preset,
                           bool edges, const std::vector<int>& loss_layers, const std::string& kl_form) {
    require(loss == "sparse" || loss == "dense", "train: loss must be \"sparse\" or \"dense\", got '" + loss + "'");
    require(kl_form == "kl-of-mean" || kl_form == "mean-of-kl", "train: kl_form must be \"kl-of-mean\" or \"mean-of-kl\", got '" + kl_form + "'");
    require(kl_form == "kl-of-mean" || target == "served-layers",
            "train: kl_form \"mean-of-kl\" needs target \"served-layers\" (with one teacher the two forms are one number)");
    const Problem p = parse_problem(problem);
    golden::TrainSpec t;
    t.sparse = loss == "sparse";
    t.target = target;
    t.kl_form = kl_form;
    t.relu = relu;
    t.loss_coeff = loss_coeff;
    t.edges = edges;
    t.loss_layers = loss_layers;
    // for_kernel: refused (every broken constraint listed) before computing; a preset computes with
    // simd unless impl is given, as the CLI's golden --preset.
    const kreg::Kernel* kern = for_kernel.empty() ? nullptr : &golden::check_train_kernel(for_kernel, p, t);
    const Impl im = preset && impl.empty() ? Impl::simd : resolve_impl(impl.empty() ? "auto" : impl, p, p.s_q);
    PyGolden g;
    g.replay = "indexshare golden --problem \"" + to_string(p) + "\" --kind train" + golden::train_options_text(t) +
               (kern ? " --for " + kern->name : "") + (im == Impl::ref ? "" : " --impl " + impl_name(im));
    nb::gil_scoped_release release;
    g.set = golden::build_train(p, t, g.replay, im);
    if (kern) golden::for_train_kernel(g.set, *kern, p, t);
    return g;
  });
  m.def("golden_from", [](const std::string& file, const std::string& problem, bool with_logits) {
    golden::StackInputs si = golden::load_dump(file, problem);
    PyGolden g;
    g.replay = golden::from_replay(file, si.problem, with_logits);
    nb::gil_scoped_release release;
    g.set = golden::build_from(file, std::move(si), with_logits, g.replay);
    return g;
  });

  nb::class_<PyLoaded>(m, "LoadedGolden")
      .def_prop_ro("dir", [](const PyLoaded& g) { return g.loaded.dir; })
      .def_prop_ro("manifest_json", [](const PyLoaded& g) { return g.loaded.manifest.dump(); })
      .def("tensors", [](nb::handle self) { return views_of(nb::cast<PyLoaded&>(self).loaded.data.tensors, self); })
      .def("summary", [](const PyLoaded& g) { return golden::summary(g.loaded); });
  m.def("load_golden", [](const std::string& dir) {
    PyLoaded g;
    nb::gil_scoped_release release;
    g.loaded = golden::read(dir);
    return g;
  });

  // ---- diff (tools/lib/diff.h) ----
  // candidate: the tensors given (source names them in errors), or the file `path` when not empty.
  m.def("diff", [](const PyLoaded& g, const std::vector<Raw>& candidate, const std::string& source, const std::string& path,
                   const std::string& layers, const std::string& impl, const std::string& replay, const std::string& precision) {
    const io::SafetensorsFile c = path.empty() ? to_file(candidate, source) : io::read_safetensors(path);
    const std::set<int> ls = layers.empty() ? std::set<int>{} : diff::parse_layers(layers);
    const prec::Contract contract = prec::parse_contract(precision);
    std::string text, json;
    bool failed = false;
    {
      nb::gil_scoped_release release;
      const diff::Result r = diff::judge(g.loaded, c, ls, kernels_for(choose_impl(impl, false)), false, contract);  // no picture is drawn here
      text = r.text(replay);
      json = r.json().dump(2);
      failed = r.failed();
    }
    return std::make_tuple(failed, text, json);
  });

  m.def("write_safetensors", [](const std::string& path, const std::vector<Raw>& tensors) {
    io::write_safetensors(path, to_file(tensors, path).tensors);
  });
}

// The kernels: indexer logits, top-k (also torch's fast path), the fused indexer top-k, attention.
void bind_kernels(nb::module_& m) {
  // ---- kernels (ref/indexer.h, ref/topk.h, ref/attention.h, simd/simd.h) ----
  m.def("indexer_logits_fp8", &indexer_logits<e4m3_t, uint8_t>);
  // The FP4 indexer (ref/fp4.h): x [..., D] f32 -> (codes [..., D/2] u8, ue8m0 scales [..., D/32] u8).
  m.def("fp4_quantize", [](In<float> x, const std::string& rule) {
    const auto tx = borrow<float>(x);
    ref::fp4::Quantized q = ref::fp4::quantize(tx, ref::fp4::parse_rule(rule));
    return nb::make_tuple(to_numpy<uint8_t>(std::move(q.data)), to_numpy<uint8_t>(std::move(q.scales)));
  });
  m.def("fp4_logits", [](In<uint8_t> qc, In<uint8_t> qs, In<uint8_t> kc, In<uint8_t> ks8, In<float> w, In<int32_t> ks, In<int32_t> ke,
                         bool bf16, Impl impl) {
    const ref::fp4::Quantized q{Tensor<uint8_t>(borrow<uint8_t>(qc).get()), Tensor<uint8_t>(borrow<uint8_t>(qs).get())};
    const ref::fp4::Quantized k{Tensor<uint8_t>(borrow<uint8_t>(kc).get()), Tensor<uint8_t>(borrow<uint8_t>(ks8).get())};
    const auto tw = borrow<float>(w);
    const auto t0 = borrow<int32_t>(ks), t1 = borrow<int32_t>(ke);
    const auto type = bf16 ? ref::fp4::LogitsType::bf16 : ref::fp4::LogitsType::f32;
    Tensor<float> r = impl == Impl::ref ? ref::fp4::logits(q, k, tw, t0, t1, type) : simd::fp4_logits(q, k, tw, t0, t1, type);
    return to_numpy<float>(std::move(r));
  });
  m.def("indexer_logits_f32", &indexer_logits<float, float>);
  m.def("topk", [](InN<float, 2> logits, InN<int32_t, 1> ks, InN<int32_t, 1> ke, int64_t k, Impl impl) {
    const auto tl = borrow<float>(logits); const auto ts = borrow<int32_t>(ks); const auto te = borrow<int32_t>(ke);
    note_inputs(&tl.get(), &ts.get(), &te.get());
    auto r = timed([&] { return kernels_for(impl).topk(tl, ts, te, k); });
    return to_numpy<int32_t>(std::move(r));
  }, nb::arg("logits").noconvert(), nb::arg("ks").noconvert(), nb::arg("ke").noconvert(), nb::arg("k"), nb::arg("impl"));
  // topk on torch tensors (the fast path of indexshare/kernels.py): read and returned by DLPack's C exchange API.
  m.def("topk_torch", [](nb::handle logits, nb::handle ks, nb::handle ke, int64_t k, Impl impl) {
    const dlx::ExchangeApi* api = dlx::api_of(logits);
    if (!api) throw nb::type_error("torch has no DLPack C exchange API");
    const auto tl = dlx::borrow<float>(api, logits, dlx::kF32, 2);
    const auto ts = dlx::borrow<int32_t>(api, ks, dlx::kI32, 1), te = dlx::borrow<int32_t>(api, ke, dlx::kI32, 1);
    note_inputs(&tl.get(), &ts.get(), &te.get());
    auto r = timed([&] { return kernels_for(impl).topk(tl, ts, te, k); });
    return dlx::to_torch(api, std::move(r), dlx::kI32);
  });
  m.def("indexer_topk_fp8", [](In<uint8_t> q, In<uint8_t> k, In<float> k_scale, In<float> weights, In<int32_t> ks,
                               In<int32_t> ke, int64_t topk, Impl impl) {
    const auto tq = borrow<e4m3_t>(q); const auto tk = borrow<e4m3_t>(k);
    const auto ts = borrow<float>(k_scale); const auto tw = borrow<float>(weights);
    const auto ts0 = borrow<int32_t>(ks); const auto te = borrow<int32_t>(ke);
    note_inputs(&tq.get(), &tk.get(), &ts.get(), &tw.get(), &ts0.get(), &te.get());
    const ref::Kernels kern = kernels_for(impl);  // the fused, streaming kernel where the path has one
    auto r = timed([&] { return kern.fused_topk_fp8 ? kern.fused_topk_fp8(tq, tk, ts, tw, ts0, te, topk)
               : kern.topk(kern.logits_fp8(tq, tk, ts, tw, ts0, te), ts0, te, topk); });
    return to_numpy<int32_t>(std::move(r));
  });
  m.def("sparse_attention", [](In<uint16_t> q, In<uint16_t> kv, In<int32_t> indices, float sm_scale, int64_t d_v,
                               std::optional<In<int32_t>> topk_length, std::optional<In<float>> sink, Impl impl) {
    const auto tq = borrow<bf16_t>(q); const auto tkv = borrow<bf16_t>(kv); const auto ti = borrow<int32_t>(indices);
    const auto tl = borrow_optional<int32_t>(topk_length); const auto tsk = borrow_optional<float>(sink);
    const Tensor<int32_t>* pl = tl ? &tl->get() : nullptr;
    const Tensor<float>* psk = tsk ? &tsk->get() : nullptr;
    note_inputs(&tq.get(), &tkv.get(), &ti.get(), pl, psk);
    auto r = timed([&] { return kernels_for(impl).sparse_attention(tq, tkv, ti, sm_scale, d_v, pl, psk); });
    return attention_tuple(std::move(r));
  }, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sm_scale"), nb::arg("d_v"), nb::arg("topk_length").none(),
     nb::arg("sink").none(), nb::arg("impl"));
  m.def("dense_attention", [](In<uint16_t> q, In<uint16_t> kv, float sm_scale, int64_t d_v, In<int32_t> ks, In<int32_t> ke,
                              std::optional<In<float>> sink, Impl impl) {
    const auto tq = borrow<bf16_t>(q); const auto tkv = borrow<bf16_t>(kv);
    const auto ts = borrow<int32_t>(ks); const auto te = borrow<int32_t>(ke); const auto tsk = borrow_optional<float>(sink);
    const Tensor<float>* psk = tsk ? &tsk->get() : nullptr;
    note_inputs(&tq.get(), &tkv.get(), &ts.get(), &te.get(), psk);
    auto r = timed([&] { return kernels_for(impl).dense_attention(tq, tkv, sm_scale, d_v, ts, te, psk); });
    return attention_tuple(std::move(r));
  }, nb::arg("q"), nb::arg("kv"), nb::arg("sm_scale"), nb::arg("d_v"), nb::arg("ks"), nb::arg("ke"), nb::arg("sink").none(),
     nb::arg("impl"));
}

// Training: the indexer's distillation loss and the sparse attention backward.
void bind_train(nb::module_& m) {
  // ---- training: the indexer's distillation loss (ref/train/indexer_loss.h) ----
  // Teachers: one (q bf16 codes, kv bf16 codes, scale, non_compressed_lse or None) tuple per layer.
  // Returns a dict of the outputs (scores, p, log_q, kl, loss, n_rows, d_scores, dq, dk, dw).
  m.def("indexer_loss", [](In<float> q, In<float> k, In<float> w, In<int32_t> ks, In<int32_t> ke,
                           std::optional<In<int32_t>> topk,
                           const std::vector<std::tuple<In<uint16_t>, In<uint16_t>, float, std::optional<In<float>>>>& layers,
                           bool relu, bool sparse, double loss_coeff, bool per_token, bool all_rows, double grad,
                           const std::string& target, Impl impl) {
    const auto tq = borrow<float>(q), tk = borrow<float>(k), tw = borrow<float>(w);
    const auto tks = borrow<int32_t>(ks), tke = borrow<int32_t>(ke);
    const auto ttop = borrow_optional<int32_t>(topk);
    std::vector<BorrowedTensor<bf16_t>> aq, akv;
    std::vector<std::optional<BorrowedTensor<float>>> lse;
    for (const auto& L : layers) {
      aq.push_back(borrow<bf16_t>(std::get<0>(L)));
      akv.push_back(borrow<bf16_t>(std::get<1>(L)));
      lse.push_back(borrow_optional<float>(std::get<3>(L)));
    }
    std::vector<ref::train::TeacherLayer> teachers;
    for (size_t j = 0; j < layers.size(); ++j)
      teachers.push_back({&aq[j].get(), &akv[j].get(), std::get<2>(layers[j]), lse[j] ? &lse[j]->get() : nullptr});
    ref::train::IndexerLossOptions o;
    o.relu = relu, o.sparse = sparse, o.loss_coeff = loss_coeff, o.per_token = per_token, o.all_rows = all_rows;
    o.grad = grad, o.target = ref::train::parse_target(target);
    auto r = timed([&] {
      return kernels_for(impl).indexer_loss(tq, tk, tw, tks, tke, ttop ? &ttop->get() : nullptr, teachers, o);
    });
    nb::dict d;
    d["scores"] = to_numpy<float>(std::move(r.scores));
    d["p"] = to_numpy<float>(std::move(r.p));
    d["log_q"] = to_numpy<float>(std::move(r.log_q));
    d["kl"] = to_numpy<float>(std::move(r.kl));
    d["loss"] = r.loss;
    d["n_rows"] = r.n_rows;
    d["d_scores"] = to_numpy<float>(std::move(r.d_scores));
    d["dq"] = to_numpy<float>(std::move(r.dq));
    d["dk"] = to_numpy<float>(std::move(r.dk));
    d["dw"] = to_numpy<float>(std::move(r.dw));
    return d;
  });
  // ---- the sparse attention backward (ref/train/attention_bwd.h); lowp: its low-precision emulation (ref only) ----
  m.def("sparse_attention_backward", [](In<uint16_t> q, In<uint16_t> kv, In<int32_t> indices, float sm_scale, int64_t d_v,
                                        In<uint16_t> d_out, std::optional<In<int32_t>> topk_length,
                                        std::optional<In<float>> sink, Impl impl, bool lowp) {
    const auto tq = borrow<bf16_t>(q); const auto tkv = borrow<bf16_t>(kv); const auto ti = borrow<int32_t>(indices);
    const auto tdo = borrow<bf16_t>(d_out);
    const auto tl = borrow_optional<int32_t>(topk_length); const auto tsk = borrow_optional<float>(sink);
    const Tensor<int32_t>* pl = tl ? &tl->get() : nullptr;
    const Tensor<float>* psk = tsk ? &tsk->get() : nullptr;
    note_inputs(&tq.get(), &tkv.get(), &ti.get(), &tdo.get(), pl, psk);
    auto r = timed([&] {
      return lowp ? cmp::emulate_attention_backward_lowp(tq, tkv, ti, sm_scale, d_v, tdo, pl, psk)
                  : kernels_for(impl).sparse_attention_backward(tq, tkv, ti, sm_scale, d_v, tdo, pl, psk);
    });
    return nb::make_tuple(to_numpy<float>(std::move(r.lse)),
                          to_numpy<float>(std::move(r.delta)), to_numpy<float>(std::move(r.p)),
                          to_numpy<float>(std::move(r.ds)), to_numpy<float>(std::move(r.dq)),
                          to_numpy<uint16_t>(std::move(r.dq_bf16)), to_numpy<float>(std::move(r.dkv)),
                          to_numpy<uint16_t>(std::move(r.dkv_bf16)), to_numpy<float>(std::move(r.d_sink)));
  }, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sm_scale"), nb::arg("d_v"), nb::arg("d_out"),
     nb::arg("topk_length").none(), nb::arg("sink").none(), nb::arg("impl"), nb::arg("lowp"));
}

// DeepSeek-V4: the compressor, the indexer over compressed blocks, the attention given the entries.
void bind_v4(nb::module_& m) {
  // ---- DeepSeek-V4 (ref/v4): the compressor, the indexer over compressed blocks, the attention given the entries.
  // rope: (rope_dim, theta, yarn, factor, original_max_pos, beta_fast, beta_slow) (ref/v4/compressor.h RopeParams).
  using RopeTuple = std::tuple<int, double, bool, double, int, double, double>;
  static auto rope_of = [](const RopeTuple& r) {
    ref::v4::RopeParams p;
    std::tie(p.rope_dim, p.theta, p.yarn, p.factor, p.original_max_pos, p.beta_fast, p.beta_slow) = r;
    return p;
  };
  m.def("v4_compress", [](In<float> kv, In<float> gate, In<float> bias, In<float> norm, int64_t ratio, bool overlap,
                          float eps, const RopeTuple& rope, const std::string& rounding, Impl impl) {
    const auto a = borrow<float>(kv), b = borrow<float>(gate), c = borrow<float>(bias), d = borrow<float>(norm);
    ref::v4::CompressorParams p;
    p.ratio = ratio;
    p.overlap = overlap;
    p.eps = eps;
    p.rope = rope_of(rope);
    p.rounding = ref::v4::parse_rounding(rounding);
    auto r = timed([&] { return kernels_for(impl).v4_compress(a, b, c, d, p); });
    return to_numpy<float>(std::move(r));
  });
  m.def("v4_index_scores", [](In<float> q, In<float> k_comp, In<float> weights, int64_t ratio, const std::string& rotation,
                              Impl impl) {
    const auto a = borrow<float>(q), b = borrow<float>(k_comp), c = borrow<float>(weights);
    const ref::v4::IndexerRotation rot = ref::v4::parse_rotation(rotation);
    auto r = timed([&] { return ref::v4::index_scores(a, b, c, ratio, rot, kernels_for(impl)); });
    return to_numpy<float>(std::move(r));
  });
  m.def("v4_select_blocks", [](In<float> scores, int64_t ratio, int64_t index_topk, Impl impl) {
    const auto a = borrow<float>(scores);
    auto r = timed([&] { return ref::v4::select_blocks(a, ratio, index_topk, kernels_for(impl)); });
    return to_numpy<int32_t>(std::move(r));
  });
  // -> (out, out_bf16, max_logits, lse, indices): ref::v4::attend on q bf16 [T, H, D], kv bf16 [T, D], the
  // entries [n_c, D] and, for type "C", the blocks [T, k]; `rope` is the layer's (its inverse RoPE).
  m.def("v4_attend", [](In<uint16_t> q, In<uint16_t> kv, In<float> sink, In<float> entries,
                        std::optional<In<int32_t>> blocks, const std::string& type, int64_t window, int64_t hca_ratio,
                        const RopeTuple& rope, Impl impl) {
    const auto tq = borrow<bf16_t>(q), tkv = borrow<bf16_t>(kv);
    const auto ts = borrow<float>(sink), te = borrow<float>(entries);
    const auto tb = borrow_optional<int32_t>(blocks);
    require(tq.get().rank() == 3, "v4_attend q: expected rank 3 [T, H, D]");
    ref::v4::Config cfg;
    cfg.n_tokens = tq.get().dim(0);
    cfg.n_heads = tq.get().dim(1);
    cfg.head_dim = tq.get().dim(2);
    cfg.window = window;
    cfg.hca_ratio = hca_ratio;
    cfg.index_head_dim = cfg.head_dim;
    const ref::v4::LayerType t = ref::v4::parse_layer_type(type);
    (t == ref::v4::LayerType::sliding ? cfg.main_rope : cfg.compress_rope) = rope_of(rope);
    (t == ref::v4::LayerType::sliding ? cfg.compress_rope : cfg.main_rope).rope_dim = rope_of(rope).rope_dim;
    cfg.validate();
    ref::v4::LayerOutputs o;
    timed([&] {
      ref::v4::attend(cfg, t, tq, tkv, ts, te, tb ? &tb->get() : nullptr, o, kernels_for(impl));
      return 0;
    });
    return nb::make_tuple(to_numpy<float>(std::move(o.attn.out)), to_numpy<uint16_t>(std::move(o.attn.out_bf16)),
                          to_numpy<float>(std::move(o.attn.max_logits)), to_numpy<float>(std::move(o.attn.lse)),
                          to_numpy<int32_t>(std::move(o.indices)));
  }, nb::arg("q"), nb::arg("kv"), nb::arg("sink"), nb::arg("entries"), nb::arg("blocks").none(), nb::arg("type"),
     nb::arg("window"), nb::arg("hca_ratio"), nb::arg("rope"), nb::arg("impl"));
}

// GLM-5.3's pooled indexer: one layer's pooled keys, scores and selection, and a whole layer.
void bind_kpool(nb::module_& m) {
  // ---- GLM-5.3's pooled indexer (ref/kpool/): the pooled keys, scores and selection of one layer on the
  // caller's f32 tensors (the last s_q = q.shape[0] of s_kv = k.shape[0] positions are the query rows).
  m.def("kpool_indexer", [](In<float> q, In<float> k, In<float> g, In<float> ape, In<float> weights, int64_t index_topk,
                            bool tail, const std::string& rounding, Impl impl) {
    const auto tq = borrow<float>(q), tk = borrow<float>(k), tg = borrow<float>(g), ta = borrow<float>(ape);
    const auto tw = borrow<float>(weights);
    const ref::Kernels kern = kernels_for(impl);
    require(ta.get().rank() == 2, "kpool ape: expected rank 2 [P, D], got " + shape_str(ta.get().shape));
    const int64_t P = ta.get().dim(0), s_kv = tk.get().rank() == 2 ? tk.get().dim(0) : 0;
    ref::kpool::check_pool_inputs(tk, tg, ta);
    Tensor<float> z = ref::kpool::pool_logits(tg, ta);
    Tensor<float> kbar = kern.kpool_pool_keys(tk, z, ref::kpool::parse_rounding(rounding));
    Tensor<float> scores = ref::kpool::pool_scores(tq, kbar, tw, s_kv, P, kern);
    ref::kpool::Selection sel = ref::kpool::select_tokens(scores, s_kv, P, index_topk, tail, kern);
    nb::dict d;
    d["z"] = to_numpy<float>(std::move(z));
    d["kbar"] = to_numpy<float>(std::move(kbar));
    d["scores"] = to_numpy<float>(std::move(scores));
    d["select_k"] = sel.select_k;
    d["pools"] = to_numpy<int32_t>(std::move(sel.pools));
    d["history"] = to_numpy<int32_t>(std::move(sel.history));
    d["tail"] = to_numpy<int32_t>(std::move(sel.tail));
    d["indices"] = to_numpy<int32_t>(std::move(sel.indices));
    return d;
  }, nb::arg("q"), nb::arg("k"), nb::arg("g"), nb::arg("ape"), nb::arg("weights"), nb::arg("index_topk"),
     nb::arg("tail") = true, nb::arg("rounding") = "f32", nb::arg("impl") = Impl::ref);

  // One generated KPool layer (ref/kpool/layer.h): its inputs and every named output.
  m.def("kpool_layer", [](int64_t s_q, int64_t s_kv, int64_t heads, int64_t dim, int64_t pool, int64_t index_topk,
                          bool tail, const std::string& rounding, int64_t h_q, int64_t d_qk, int64_t d_v, float sm_scale,
                          uint64_t seed, const std::string& dist, int layer, Impl impl) {
    ref::kpool::KpoolConfig c;
    c.s_q = s_q, c.s_kv = s_kv, c.heads = heads, c.dim = dim, c.pool = pool, c.index_topk = index_topk;
    c.tail = tail, c.rounding = ref::kpool::parse_rounding(rounding), c.h_q = h_q, c.d_qk = d_qk, c.d_v = d_v;
    c.sm_scale = sm_scale, c.seed = seed, c.dist = parse_dist(dist);
    const ref::Kernels kern = kernels_for(impl);
    ref::kpool::KpoolLayerInputs in = ref::kpool::make_kpool_layer_inputs(c, layer, true, kern);
    ref::kpool::KpoolLayerOutputs o = ref::kpool::run_kpool_layer(c, in, layer, kern);
    ref::kpool::KpoolIndexerOutputs& x = *o.indexer;
    nb::dict d;
    d["q"] = to_numpy<float>(std::move(in.q));
    d["k"] = to_numpy<float>(std::move(in.k));
    d["g"] = to_numpy<float>(std::move(in.g));
    d["ape"] = to_numpy<float>(std::move(in.ape));
    d["weights"] = to_numpy<float>(std::move(in.weights));
    d["attn_q"] = to_numpy<uint16_t>(std::move(in.attn_q));
    d["attn_kv"] = to_numpy<uint16_t>(std::move(in.attn_kv));
    d["z"] = to_numpy<float>(std::move(x.z));
    d["kbar"] = to_numpy<float>(std::move(x.kbar));
    d["ke"] = to_numpy<int32_t>(std::move(x.ke));
    d["valid"] = to_numpy<uint8_t>(std::move(x.valid));
    d["scores"] = to_numpy<float>(std::move(x.scores));
    d["select_k"] = x.sel.select_k;
    d["pools"] = to_numpy<int32_t>(std::move(x.sel.pools));
    d["history"] = to_numpy<int32_t>(std::move(x.sel.history));
    d["tail"] = to_numpy<int32_t>(std::move(x.sel.tail));
    d["indices"] = to_numpy<int32_t>(std::move(o.indices));
    nb::tuple a = attention_tuple(std::move(o.attn));
    d["out"] = a[0];
    d["max_logits"] = a[2];
    d["lse"] = a[3];
    return d;
  }, nb::arg("s_q"), nb::arg("s_kv"), nb::arg("heads") = 4, nb::arg("dim") = 32, nb::arg("pool") = 4,
     nb::arg("index_topk") = 16, nb::arg("tail") = true, nb::arg("rounding") = "f32", nb::arg("h_q") = 2,
     nb::arg("d_qk") = 512, nb::arg("d_v") = 512, nb::arg("sm_scale") = 0.0625f, nb::arg("seed") = 1,
     nb::arg("dist") = "normal", nb::arg("layer") = 0, nb::arg("impl") = Impl::ref);
}

// Overlap statistics, the cost model and the stack.
void bind_analysis(nb::module_& m) {
  // ---- overlap statistics (ref/overlap.h): `indexshare overlap --golden DIR | --problem DESC --json` ----
  m.def("overlap", [](const std::string& golden_dir, const std::string& problem, int buckets, bool shared_stats,
                      const std::string& impl) {
    if (!golden_dir.empty()) {
      golden::Loaded g = golden::read(golden_dir);
      if (g.manifest.value("kind", "") == "v4") {  // the C4A layers' block indices (ref/v4/sharing.h)
        const golden::V4Dump d = golden::v4_set_inputs(g);
        const std::optional<Impl> vi = impl == "auto" ? std::optional<Impl>(Impl::simd) : impl_named(impl);
        require(vi.has_value(), "impl: expected ref, simd or auto, got '" + impl + "'");
        std::vector<int> c4a;
        nb::gil_scoped_release release;
        nlohmann::json j = io::overlap_to_json(golden::v4_overlap(d, buckets, kernels_for(*vi), c4a));
        j["c4a_layers"] = c4a;
        return j.dump(2);
      }
      return overlap_json(golden::stack_inputs_of(g), false, buckets, shared_stats, impl);
    }
    return overlap_json(golden::StackInputs{problem_of(problem), {}}, true, buckets, shared_stats, impl);
  });

  // ---- the cost model (ref/cost.h): `indexshare cost --model NAME --json` ----
  m.def("cost", [](const std::string& preset, const std::string& contexts, const std::string& schedule, const std::string& mode) {
    const ModelConfig cfg = model_preset(preset);
    require(mode == "decode" || mode == "prefill" || mode == "both", "mode: expected decode, prefill or both, got '" + mode + "'");
    const Schedule sched = schedule.empty() ? cfg.resolve_schedule() : parse_schedule(schedule, cfg.n_layers);
    return cost_report_json(cfg, sched, parse_contexts(contexts), mode, CostOptions{}).dump(2);
  });

  // ---- the stack (ref/stack.h): generated inputs, or given ones under the golden tensor names ----
  m.def("run_stack", [](const std::string& problem, const std::optional<std::string>& rows_text,
                        const std::optional<std::vector<Raw>>& inputs, const std::string& impl, bool keep_logits) {
    Problem p = problem_of(problem);
    std::vector<ref::LayerInputs> in;
    if (inputs) {
      require(!rows_text, "rows: applies to generated inputs, not given ones");
      golden::StackInputs si = golden::load_stack_inputs(to_file(*inputs, "inputs"), "inputs", p);
      p = si.problem;
      in = std::move(si.inputs);
    }
    std::vector<int64_t> rows = rows_text ? parse_rows(*rows_text, p) : std::vector<int64_t>{};
    const ref::Kernels kern = kernels_for(resolve_impl(impl, p, rows_text ? int64_t(rows.size()) : p.s_q));
    std::vector<ref::StackLayerOutputs> outs;
    {
      nb::gil_scoped_release release;
      const Schedule s = p.schedule();
      if (!inputs) in = rows_text ? ref::make_stack_inputs(p, s, rows) : ref::make_stack_inputs(p, s);
      outs = ref::run_stack(p, s, in, keep_logits, kern);
    }
    return std::make_pair(to_string(p), stack_outputs(std::move(outs)));
  }, nb::arg("problem"), nb::arg("rows").none(), nb::arg("inputs").none(), nb::arg("impl"), nb::arg("keep_logits"));
}
// indexshare.overlap of a kernel-level stack: its inputs (generate: made from the problem here).
std::string overlap_json(golden::StackInputs si, bool generate, int buckets, bool shared_stats, const std::string& impl) {
  const Problem& p = si.problem;
  ref::OverlapOptions opt;
  opt.kernels = kernels_for(resolve_impl(impl, p));
  opt.n_buckets = buckets;
  opt.shared_stats = shared_stats;
  nb::gil_scoped_release release;
  if (generate) si.inputs = ref::make_stack_inputs(p, p.schedule());
  const auto outs = ref::run_stack(p, p.schedule(), si.inputs, false, opt.kernels);
  return io::overlap_to_json(ref::overlap_report(p, si.inputs, outs, opt)).dump(2);
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "indexshare's C++ library (ref/, simd/, tools/lib/); use the indexshare package, not this module";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.attr("version") = INDEXSHARE_VERSION;

  bind_runtime(m);
  bind_golden(m);
  bind_kernels(m);
  bind_train(m);
  bind_v4(m);
  bind_kpool(m);
  bind_hyv4(m);
  bind_analysis(m);
  bind_module_ops(m);
  bind_module_steps(m);
}
