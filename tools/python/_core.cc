// indexshare._core: the nanobind extension under the Python package (tools/python/indexshare).
//
// It binds the library the CLI stands on (ref/, simd/, tools/lib/) and nothing else: the package's
// Python layer (tools/python/indexshare/*.py) checks and converts arguments (numpy / torch, dtypes,
// ranks, device) and names them in its errors; this layer takes C-contiguous CPU arrays of raw
// element types (bf16 as uint16 codes, e4m3 as uint8 codes) and returns numpy arrays that own the
// C++ result without a copy (a capsule holds the moved Tensor). indexshare::Error (bad input, with
// the library's message naming the tensor) becomes ValueError. The GIL is released while C++
// computes; arrays are copied into the kernels' tensors before that (ref::Tensor owns its storage).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <omp.h>

#include <chrono>
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
#include "ref/overlap.h"
#include "ref/problem.h"
#include "ref/stack.h"
#include "ref/topk.h"
#include "simd/simd.h"
#include "tools/lib/cost_report.h"
#include "tools/lib/diff.h"
#include "tools/lib/golden.h"
#include "tools/lib/options.h"
#include "tools/lib/safetensors.h"
#include "tools/lib/svg.h"

namespace nb = nanobind;
using namespace indexshare;

namespace {

template <class Raw>
using In = nb::ndarray<const Raw, nb::c_contig, nb::device::cpu>;

// A C-contiguous CPU array of Raw elements -> Tensor<T> (T has Raw's size: bf16_t/uint16, ...).
template <class T, class Raw>
Tensor<T> to_tensor(const In<Raw>& a) {
  static_assert(sizeof(T) == sizeof(Raw));
  Shape shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(int64_t(a.shape(i)));
  Tensor<T> t(shape);  // as the CLI's tensors: huge pages advised for large ones (ref/tensor.h)
  if (!t.data.empty()) std::memcpy(static_cast<void*>(t.data.data()), a.data(), t.data.size() * sizeof(T));
  return t;
}

template <class T, class Raw>
std::optional<Tensor<T>> to_optional(const std::optional<In<Raw>>& a) {
  if (!a) return std::nullopt;
  return to_tensor<T, Raw>(*a);
}

// Moves `t` to the heap and returns a numpy array over its storage (no copy); the capsule frees it.
template <class Raw, class T>
nb::object to_numpy(Tensor<T>&& t) {
  static_assert(sizeof(T) == sizeof(Raw));
  auto* held = new Tensor<T>(std::move(t));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor<T>*>(p); });
  std::vector<size_t> shape(held->shape.begin(), held->shape.end());
  return nb::cast(nb::ndarray<nb::numpy, Raw>(reinterpret_cast<Raw*>(held->data.data()), shape.size(), shape.data(), owner));
}

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

// Seconds the last kernel call of this thread spent in C++ computing (the GIL released), for the
// overhead benchmark (tools/python/bench_overhead.py): a Python call's time less this is the binding's.
thread_local double last_kernel_seconds = 0;

// Runs f with the GIL released and records its time.
template <class F>
auto timed(F&& f) {
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = f();
  last_kernel_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

ref::Kernels kernels_of(bool simd) { return simd ? simd::kernels() : ref::Kernels{}; }

Problem problem_of(const std::string& text) {
  Problem p = parse_problem(text);
  p.validate();
  return p;
}

PyGolden golden_stack(const std::string& problem, const std::string& kind, const std::string& impl,
                      const std::optional<std::string>& rows_text, bool with_logits) {
  const Problem p = problem_of(problem);
  std::vector<int64_t> rows;
  if (rows_text) {
    require(kind == "stack", "rows: sampled sets are kind stack only, not '" + kind + "'");
    rows = parse_rows(*rows_text, p);
  }
  const bool simd = resolve_impl(impl, p, rows_text ? int64_t(rows.size()) : p.s_q) == "simd";
  PyGolden g;
  g.replay = golden::stack_replay(p, kind, "", rows_text ? &rows : nullptr, simd, with_logits);
  nb::gil_scoped_release release;
  g.set = golden::build(p, kind, with_logits, g.replay, simd, rows_text ? &rows : nullptr);
  return g;
}

// The indexer's logits, FP8 mode (T = e4m3_t, codes as uint8) or unquantized (T = float).
template <class T, class RawT>
nb::object indexer_logits(In<RawT> q, In<RawT> k, In<float> k_scale, In<float> weights, In<int32_t> ks, In<int32_t> ke,
                          bool simd) {
  const auto tq = to_tensor<T>(q);
  const auto tk = to_tensor<T>(k);
  const auto ts = to_tensor<float>(k_scale), tw = to_tensor<float>(weights);
  const auto ts0 = to_tensor<int32_t>(ks), te = to_tensor<int32_t>(ke);
  const ref::Kernels kern = kernels_of(simd);
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

  m.def("set_num_threads", [](int n) {
    require(n >= 1, "threads: expected >= 1, got " + std::to_string(n));
    omp_set_num_threads(n);
  });
  m.def("get_num_threads", [] { return omp_get_max_threads(); });
  m.def("simd_target", [] { return simd::current_target(); });
  m.def("last_kernel_seconds", [] { return last_kernel_seconds; });

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
  m.def("resolve_impl", [](const std::string& impl, const std::string& problem) { return resolve_impl(impl, problem_of(problem)); });
  m.def("presets", [] {
    std::vector<std::tuple<std::string, std::string, std::string, std::string>> out;
    for (const golden::Preset& p : golden::presets()) out.emplace_back(p.name, p.problem, p.kind, p.description);
    return out;
  });

  // ---- golden sets (tools/lib/golden.h) ----
  nb::class_<PyGolden>(m, "GoldenSet")
      .def_prop_ro("manifest_json", [](const PyGolden& g) { return g.set.manifest.dump(); })
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
  m.def("golden_stack", &golden_stack, nb::arg("problem"), nb::arg("kind"), nb::arg("impl"), nb::arg("rows").none(),
        nb::arg("with_logits"));
  m.def("golden_model", [](const std::string& model, int layers, int64_t seq, const std::string& schedule, uint64_t seed,
                           float sim, const std::string& variant, const std::string& impl) {
    golden::ModelSpec spec;
    spec.preset = model; spec.layers = layers; spec.seq = seq; spec.schedule = schedule; spec.seed = seed;
    spec.sim = sim; spec.variant = variant;
    spec.simd = resolve_model_impl(impl, model_preset(model), layers, seq) == "simd";
    PyGolden g;
    g.replay = golden::model_replay(spec);
    nb::gil_scoped_release release;
    g.set = golden::build_model(spec, g.replay);
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
                   const std::string& layers, const std::string& impl, const std::string& replay) {
    const io::SafetensorsFile c = path.empty() ? to_file(candidate, source) : io::read_safetensors(path);
    const std::set<int> ls = layers.empty() ? std::set<int>{} : diff::parse_layers(layers);
    const bool simd = choose_impl(impl, false) == "simd";
    std::string text, json;
    bool failed = false;
    {
      nb::gil_scoped_release release;
      const diff::Result r = diff::judge(g.loaded, c, ls, kernels_of(simd));
      text = r.text(replay);
      json = r.json().dump(2);
      failed = r.failed();
    }
    return std::make_tuple(failed, text, json);
  });

  m.def("write_safetensors", [](const std::string& path, const std::vector<Raw>& tensors) {
    io::write_safetensors(path, to_file(tensors, path).tensors);
  });

  // ---- kernels (ref/indexer.h, ref/topk.h, ref/attention.h, simd/simd.h) ----
  m.def("indexer_logits_fp8", &indexer_logits<e4m3_t, uint8_t>);
  m.def("indexer_logits_f32", &indexer_logits<float, float>);
  m.def("topk", [](In<float> logits, In<int32_t> ks, In<int32_t> ke, int64_t k, bool simd) {
    const auto tl = to_tensor<float>(logits); const auto ts = to_tensor<int32_t>(ks); const auto te = to_tensor<int32_t>(ke);
    auto r = timed([&] { return kernels_of(simd).topk(tl, ts, te, k); });
    return to_numpy<int32_t>(std::move(r));
  });
  m.def("indexer_topk_fp8", [](In<uint8_t> q, In<uint8_t> k, In<float> k_scale, In<float> weights, In<int32_t> ks,
                               In<int32_t> ke, int64_t topk, bool simd) {
    const auto tq = to_tensor<e4m3_t>(q); const auto tk = to_tensor<e4m3_t>(k);
    const auto ts = to_tensor<float>(k_scale); const auto tw = to_tensor<float>(weights);
    const auto ts0 = to_tensor<int32_t>(ks); const auto te = to_tensor<int32_t>(ke);
    auto r = timed([&] { return simd ? simd::indexer_topk_fp8(tq, tk, ts, tw, ts0, te, topk)
               : ref::topk(ref::indexer_logits_fp8(tq, tk, ts, tw, ts0, te), ts0, te, topk); });
    return to_numpy<int32_t>(std::move(r));
  });
  m.def("sparse_attention", [](In<uint16_t> q, In<uint16_t> kv, In<int32_t> indices, float sm_scale, int64_t d_v,
                               std::optional<In<int32_t>> topk_length, std::optional<In<float>> sink, bool simd) {
    const auto tq = to_tensor<bf16_t>(q); const auto tkv = to_tensor<bf16_t>(kv); const auto ti = to_tensor<int32_t>(indices);
    const auto tl = to_optional<int32_t>(topk_length); const auto tsk = to_optional<float>(sink);
    auto r = timed([&] { return kernels_of(simd).sparse_attention(tq, tkv, ti, sm_scale, d_v, tl ? &*tl : nullptr, tsk ? &*tsk : nullptr); });
    return attention_tuple(std::move(r));
  }, nb::arg("q"), nb::arg("kv"), nb::arg("indices"), nb::arg("sm_scale"), nb::arg("d_v"), nb::arg("topk_length").none(),
     nb::arg("sink").none(), nb::arg("simd"));
  m.def("dense_attention", [](In<uint16_t> q, In<uint16_t> kv, float sm_scale, int64_t d_v, In<int32_t> ks, In<int32_t> ke,
                              std::optional<In<float>> sink, bool simd) {
    const auto tq = to_tensor<bf16_t>(q); const auto tkv = to_tensor<bf16_t>(kv);
    const auto ts = to_tensor<int32_t>(ks); const auto te = to_tensor<int32_t>(ke); const auto tsk = to_optional<float>(sink);
    auto r = timed([&] { return simd ? simd::dense_attention(tq, tkv, sm_scale, d_v, ts, te, tsk ? &*tsk : nullptr)
               : ref::dense_attention(tq, tkv, sm_scale, d_v, ts, te, tsk ? &*tsk : nullptr); });
    return attention_tuple(std::move(r));
  }, nb::arg("q"), nb::arg("kv"), nb::arg("sm_scale"), nb::arg("d_v"), nb::arg("ks"), nb::arg("ke"), nb::arg("sink").none(),
     nb::arg("simd"));

  // ---- overlap statistics (ref/overlap.h): `indexshare overlap --golden DIR | --problem DESC --json` ----
  m.def("overlap", [](const std::string& golden_dir, const std::string& problem, int buckets, bool shared_stats,
                      const std::string& impl) {
    golden::StackInputs si = golden_dir.empty() ? golden::StackInputs{problem_of(problem), {}}
                                                : golden::stack_inputs_of(golden::read(golden_dir));
    const Problem& p = si.problem;
    ref::OverlapOptions opt;
    opt.kernels = kernels_of(resolve_impl(impl, p) == "simd");
    opt.n_buckets = buckets;
    opt.shared_stats = shared_stats;
    nb::gil_scoped_release release;
    if (golden_dir.empty()) si.inputs = ref::make_stack_inputs(p, p.schedule());
    const auto outs = ref::run_stack(p, p.schedule(), si.inputs, false, opt.kernels);
    return io::overlap_to_json(ref::overlap_report(p, si.inputs, outs, opt)).dump(2);
  });

  // ---- the cost model (ref/cost.h): `indexshare cost --preset NAME --json` ----
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
    const bool simd = resolve_impl(impl, p, rows_text ? int64_t(rows.size()) : p.s_q) == "simd";
    std::vector<ref::StackLayerOutputs> outs;
    {
      nb::gil_scoped_release release;
      const Schedule s = p.schedule();
      if (!inputs) in = rows_text ? ref::make_stack_inputs(p, s, rows) : ref::make_stack_inputs(p, s);
      outs = simd ? simd::run_stack(p, s, in, keep_logits) : ref::run_stack(p, s, in, keep_logits);
    }
    return std::make_pair(to_string(p), stack_outputs(std::move(outs)));
  }, nb::arg("problem"), nb::arg("rows").none(), nb::arg("inputs").none(), nb::arg("impl"), nb::arg("keep_logits"));
}
