// One Triton or Gluon kernel launch from C++: the parameters that Triton 3.6's generated launcher
// (backends/nvidia/driver.py, make_launcher) builds, from a template fixed per Launch and the call's tensors.
//
//   register_launch(function, grid, num_warps, num_ctas, shared, pdl, cooperative, slots) -> id
//   launch(id, stream, tensors)
//   describe(id, tensors) -> what launch would pass (no driver needed: the CPU tests' view)
//   register_pass(n_inputs, launch ids, bindings, outputs' sizes, strides, dtypes, scratch sizes, dtypes) -> id
//   run_pass(id, stream, inputs) -> outputs: a call's allocations and launches in one call
//   describe_pass(id, inputs) -> (outputs, what each launch would pass)
//   enable_ops(forward, backward, stream_of), disable_ops(): the custom ops' CUDA kernels in C++ (below), and
//   flash_attention's autograd node (the eager model path: no Python frame in either direction of a bound call);
//   set_node_mutant(m): one of the node's kept mutants (0: none)
//   bind(kind, tensors, is_causal, scale, pass), run_bound(kind, stream, tensors, is_causal, scale) -> outputs
//   or None: a call's key bound to a pass, and the bound pass run from Python in one call (the Gluon
//   autograd.Function's repeated calls); bound_pass (the look-up alone), bound_counts, clear_bound
//
// A slot is [kind, tensor, value, swizzle, elem_size, elem_type, box0 .. box4]:
//   PTR   the tensor's data pointer (a CUdeviceptr)
//   DESC  the tensor's CUtensorMap, encoded here as Triton's fill_tma_descriptor encodes it (whole tensor,
//         zero fill, 128 B L2 promotion), followed by its shape as i32 and strides as i64: the launcher's
//         expansion of a host tensor descriptor
//   WORD  the low bytes of ``value`` (an integer of any width, a float's bits, a null scratch pointer)
// Each parameter is passed as the address of an 8-byte word; the kernel reads as many bytes as its type has
// (little-endian), as cuLaunchKernelEx does with the launcher's typed locals.
#include <torch/extension.h>
#include <torch/library.h>
#include <cuda.h>
#include <dlfcn.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <type_traits>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// A caller's error as std::runtime_error, its message built without iostreams: on a GPU host (torch 2.11,
// g++ 13) an ostream insert compiled into this module reached a locale facet of the libstdc++ the process
// had loaded, not the one it was compiled against, and crashed (SIGSEGV in every error path, caught with
// a backtrace; TORCH_CHECK's c10::str formats with ostreams too).
inline std::string piece(const char* text) { return text; }
inline std::string piece(const std::string& text) { return text; }
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
std::string piece(T value) {
  return std::to_string(value);
}

template <typename... Parts>
void require(bool ok, const Parts&... parts) {
  if (ok) return;
  std::string text;
  ((text += piece(parts)), ...);
  throw std::runtime_error(text);
}

enum Kind : int64_t { PTR = 0, DESC = 1, WORD = 2 };
constexpr int MAX_RANK = 5;
constexpr int SLOT_FIELDS = 6 + MAX_RANK;
constexpr int MAX_PARAMS = 128;
constexpr int MAX_MAPS = 8;

struct Slot {
  int64_t kind, tensor;
  uint64_t value;
  int swizzle, elem_size, elem_type;
  cuuint32_t box[MAX_RANK];
};

struct Spec {
  CUfunction function;
  unsigned grid[3];
  unsigned block;
  unsigned num_ctas;
  unsigned shared;
  bool pdl, cooperative;
  std::vector<Slot> slots;
};

typedef CUresult (*LaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
typedef CUresult (*ErrorString)(CUresult, const char**);

void* libcuda() {  // opened as Triton opens it: the driver, not the runtime, and no link-time dependency
  static void* handle = dlopen("libcuda.so.1", RTLD_LAZY);
  if (!handle) throw std::runtime_error("native_launch: cannot open libcuda.so.1");
  return handle;
}

template <typename F>
F symbol(const char* name) {
  void* f = dlsym(libcuda(), name);
  if (!f) throw std::runtime_error(std::string("native_launch: libcuda.so.1 has no ") + name);
  return reinterpret_cast<F>(f);
}

void check(CUresult res, const char* what) {
  if (res == CUDA_SUCCESS) return;
  static ErrorString error_string = symbol<ErrorString>("cuGetErrorString");
  const char* text = nullptr;
  error_string(res, &text);
  throw std::runtime_error(std::string("native_launch: ") + what + ": " + (text ? text : "unknown CUDA error"));
}

std::deque<Spec> specs;  // a deque: registering one never moves those already handed out
std::mutex specs_mutex;

}  // namespace

int64_t register_launch(int64_t function, std::vector<int64_t> grid, int64_t num_warps, int64_t num_ctas,
                        int64_t shared, bool pdl, bool cooperative, std::vector<std::vector<int64_t>> slots) {
  require(grid.size() == 3, "native_launch: a grid has 3 dimensions, got ", grid.size());
  require(num_ctas >= 1 && num_warps >= 1, "native_launch: num_ctas and num_warps must be positive");
  Spec s;
  s.function = reinterpret_cast<CUfunction>(function);
  for (int i = 0; i < 3; ++i) s.grid[i] = static_cast<unsigned>(grid[i]);
  s.block = static_cast<unsigned>(32 * num_warps);
  s.num_ctas = static_cast<unsigned>(num_ctas);
  s.shared = static_cast<unsigned>(shared);
  s.pdl = pdl;
  s.cooperative = cooperative;
  int params = 0, maps = 0;
  for (const auto& v : slots) {
    require(v.size() == SLOT_FIELDS, "native_launch: a slot has ", SLOT_FIELDS, " fields, got ", v.size());
    require(v[0] == PTR || v[0] == DESC || v[0] == WORD, "native_launch: unknown slot kind ", v[0]);
    Slot slot{v[0], v[1], static_cast<uint64_t>(v[2]), static_cast<int>(v[3]), static_cast<int>(v[4]),
              static_cast<int>(v[5]), {}};
    for (int i = 0; i < MAX_RANK; ++i) slot.box[i] = static_cast<cuuint32_t>(v[6 + i]);
    params += slot.kind == DESC ? 1 + 2 * MAX_RANK : 1;
    maps += slot.kind == DESC;
    s.slots.push_back(slot);
  }
  require(params <= MAX_PARAMS && maps <= MAX_MAPS, "native_launch: more parameters than this launcher holds");
  std::lock_guard<std::mutex> lock(specs_mutex);
  specs.push_back(std::move(s));
  return static_cast<int64_t>(specs.size() - 1);
}

namespace {

const Spec& spec_of(int64_t id) {
  std::lock_guard<std::mutex> lock(specs_mutex);
  require(id >= 0 && id < static_cast<int64_t>(specs.size()), "native_launch: no launch registered as ", id);
  return specs[id];  // a deque's elements stay where they are
}

// One tensor map's arguments to cuTensorMapEncodeTiled, innermost dimension first (as Triton's
// fill_tma_descriptor orders them).
struct MapArgs {
  CUtensorMapDataType elem_type;
  cuuint32_t rank;
  void* address;
  cuuint64_t dims[MAX_RANK], strides[MAX_RANK];
  cuuint32_t box[MAX_RANK];
  CUtensorMapSwizzle swizzle;
};

MapArgs map_args(const Slot& slot, const at::Tensor& t) {
  const int rank = static_cast<int>(t.dim());
  require(rank >= 1 && rank <= MAX_RANK, "native_launch: a descriptor over a ", rank, "-D tensor");
  MapArgs m{};
  m.elem_type = static_cast<CUtensorMapDataType>(slot.elem_type);
  m.rank = static_cast<cuuint32_t>(rank);
  m.address = t.data_ptr();
  for (int i = 0; i < rank; ++i) {
    m.dims[rank - 1 - i] = static_cast<cuuint64_t>(t.size(i));
    m.box[rank - 1 - i] = slot.box[i];
  }
  for (int i = 0; i + 1 < rank; ++i) m.strides[rank - 2 - i] = static_cast<cuuint64_t>(slot.elem_size * t.stride(i));
  m.swizzle = static_cast<CUtensorMapSwizzle>(slot.swizzle);
  return m;
}

// The kernel's parameters for one call, in the launcher's order: each a word, or (DESC) a tensor map
// followed by the tensor's shape (i32) and strides (i64).  ``on_map`` encodes (or records) each map.
template <typename OnMap>
int fill_params(const Spec& s, int64_t id, const std::vector<at::Tensor>& tensors, uint64_t* words, void** params,
                OnMap on_map) {
  int np = 0;
  auto push_word = [&](uint64_t w) {
    words[np] = w;
    params[np] = &words[np];
    ++np;
  };
  for (const Slot& slot : s.slots) {
    if (slot.kind == WORD) {
      push_word(slot.value);
      continue;
    }
    require(slot.tensor >= 0 && slot.tensor < static_cast<int64_t>(tensors.size()), "native_launch: launch ", id,
                " takes tensor ", slot.tensor, " and was given ", tensors.size());
    const at::Tensor& t = tensors[slot.tensor];
    if (slot.kind == PTR) {
      push_word(reinterpret_cast<uint64_t>(t.data_ptr()));
      continue;
    }
    params[np++] = on_map(map_args(slot, t));
    for (int64_t i = 0; i < t.dim(); ++i) push_word(static_cast<uint64_t>(static_cast<uint32_t>(t.size(i))));  // i32
    for (int64_t i = 0; i < t.dim(); ++i) push_word(static_cast<uint64_t>(t.stride(i)));                       // i64
  }
  return np;
}

}  // namespace

void launch(int64_t id, int64_t stream, const std::vector<at::Tensor>& tensors) {
  static LaunchKernelEx launch_kernel_ex = symbol<LaunchKernelEx>("cuLaunchKernelEx");
  static EncodeTiled encode_tiled = symbol<EncodeTiled>("cuTensorMapEncodeTiled");
  const Spec& s = spec_of(id);
  alignas(128) CUtensorMap maps[MAX_MAPS];  // the driver copies parameters at launch: locals suffice
  uint64_t words[MAX_PARAMS];
  void* params[MAX_PARAMS];
  int nm = 0;
  const cuuint32_t element_strides[MAX_RANK] = {1, 1, 1, 1, 1};
  fill_params(s, id, tensors, words, params, [&](const MapArgs& m) -> void* {
    // as Triton's fill_tma_descriptor: no interleave, 128 B L2 promotion, zero fill out of bounds
    check(encode_tiled(&maps[nm], m.elem_type, m.rank, m.address, m.dims, m.strides, m.box, element_strides,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, m.swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled");
    return &maps[nm++];
  });
  if (static_cast<uint64_t>(s.grid[0]) * s.grid[1] * s.grid[2] == 0) return;
  CUlaunchAttribute attrs[4];
  unsigned n_attrs = 0;
  if (s.pdl) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }
  if (s.cooperative) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n_attrs].value.cooperative = 1;
    ++n_attrs;
  }
  if (s.num_ctas != 1) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n_attrs].value.clusterDim.x = s.num_ctas;
    attrs[n_attrs].value.clusterDim.y = 1;
    attrs[n_attrs].value.clusterDim.z = 1;
    ++n_attrs;
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n_attrs].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
    ++n_attrs;
  }
  CUlaunchConfig config{};
  config.gridDimX = s.grid[0] * s.num_ctas;
  config.gridDimY = s.grid[1];
  config.gridDimZ = s.grid[2];
  config.blockDimX = s.block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = s.shared;
  config.hStream = reinterpret_cast<CUstream>(stream);
  config.attrs = attrs;
  config.numAttrs = n_attrs;
  check(launch_kernel_ex(&config, s.function, params, nullptr), "cuLaunchKernelEx");
}

// What ``launch`` would pass, without a driver (for checking the layout on a CPU): per parameter, a word
// as an int, or a tensor map as the tuple of its encoding arguments (element type, rank, address,
// dims, byte strides of all but the outermost, box, swizzle), innermost first as the driver takes them.
py::list describe(int64_t id, const std::vector<at::Tensor>& tensors) {
  const Spec& s = spec_of(id);
  uint64_t words[MAX_PARAMS];
  void* params[MAX_PARAMS];
  std::vector<MapArgs> maps;
  maps.reserve(MAX_MAPS);
  int np = fill_params(s, id, tensors, words, params, [&](const MapArgs& m) -> void* {
    maps.push_back(m);
    return &maps.back();
  });
  py::list out;
  for (int i = 0; i < np; ++i) {
    if (params[i] != &words[i]) {
      const MapArgs& m = *static_cast<const MapArgs*>(params[i]);
      py::list dims, strides, box;
      for (cuuint32_t d = 0; d < m.rank; ++d) {
        dims.append(m.dims[d]);
        box.append(m.box[d]);
        if (d + 1 < m.rank) strides.append(m.strides[d]);
      }
      out.append(py::make_tuple(static_cast<int>(m.elem_type), m.rank, reinterpret_cast<uint64_t>(m.address), dims,
                                strides, box, static_cast<int>(m.swizzle)));
    } else {
      out.append(static_cast<int64_t>(words[i]));
    }
  }
  return out;
}

// --- a pass: a call's allocations and launches in one call from Python ---------------------------------

namespace {

struct Pass {
  size_t n_inputs;
  std::vector<int64_t> launches;               // registered launch ids, in issue order
  std::vector<std::vector<int64_t>> bindings;  // per launch: indices into inputs ++ outputs ++ scratch
  std::vector<std::vector<int64_t>> out_sizes, out_strides;
  std::vector<at::ScalarType> out_dtypes;
  std::vector<std::vector<int64_t>> scratch_sizes;
  std::vector<at::ScalarType> scratch_dtypes;
};

std::deque<Pass> passes;

const Pass& pass_of(int64_t id) {
  std::lock_guard<std::mutex> lock(specs_mutex);
  require(id >= 0 && id < static_cast<int64_t>(passes.size()), "native_launch: no pass registered as ", id);
  return passes[id];
}

// Allocates the outputs (returned) and the scratch, then hands each launch its tensors.
template <typename Issue>
std::vector<at::Tensor> run_with(const Pass& p, const std::vector<at::Tensor>& inputs, Issue issue) {
  require(inputs.size() == p.n_inputs, "native_launch: a pass of ", p.n_inputs, " inputs was given ",
              inputs.size());
  const auto options = inputs[0].options();
  std::vector<at::Tensor> all(inputs);
  all.reserve(p.n_inputs + p.out_sizes.size() + p.scratch_sizes.size());
  for (size_t i = 0; i < p.out_sizes.size(); ++i)
    all.push_back(at::empty_strided(p.out_sizes[i], p.out_strides[i], options.dtype(p.out_dtypes[i])));
  for (size_t i = 0; i < p.scratch_sizes.size(); ++i)
    all.push_back(at::empty(p.scratch_sizes[i], options.dtype(p.scratch_dtypes[i])));
  std::vector<at::Tensor> tensors;
  for (size_t l = 0; l < p.launches.size(); ++l) {
    tensors.clear();
    for (int64_t b : p.bindings[l]) tensors.push_back(all[b]);
    issue(p.launches[l], tensors);
  }
  return std::vector<at::Tensor>(all.begin() + p.n_inputs, all.begin() + p.n_inputs + p.out_sizes.size());
}

}  // namespace

int64_t register_pass(int64_t n_inputs, std::vector<int64_t> launches, std::vector<std::vector<int64_t>> bindings,
                      std::vector<std::vector<int64_t>> out_sizes, std::vector<std::vector<int64_t>> out_strides,
                      std::vector<at::ScalarType> out_dtypes, std::vector<std::vector<int64_t>> scratch_sizes,
                      std::vector<at::ScalarType> scratch_dtypes) {
  require(n_inputs >= 1, "native_launch: a pass takes at least one input");
  require(launches.size() == bindings.size(), "native_launch: one binding list per launch");
  require(out_sizes.size() == out_strides.size() && out_sizes.size() == out_dtypes.size(),
              "native_launch: each output needs sizes, strides and a dtype");
  require(scratch_sizes.size() == scratch_dtypes.size(), "native_launch: each scratch buffer needs a dtype");
  const int64_t n_all = n_inputs + static_cast<int64_t>(out_sizes.size() + scratch_sizes.size());
  for (const auto& b : bindings)
    for (int64_t i : b) require(i >= 0 && i < n_all, "native_launch: a binding names tensor ", i, " of ", n_all);
  for (int64_t id : launches) spec_of(id);  // each registered
  std::lock_guard<std::mutex> lock(specs_mutex);
  passes.push_back(Pass{static_cast<size_t>(n_inputs), std::move(launches), std::move(bindings), std::move(out_sizes),
                        std::move(out_strides), std::move(out_dtypes), std::move(scratch_sizes),
                        std::move(scratch_dtypes)});
  return static_cast<int64_t>(passes.size() - 1);
}

std::vector<at::Tensor> run_pass(int64_t id, int64_t stream, const std::vector<at::Tensor>& inputs) {
  return run_with(pass_of(id), inputs,
                  [&](int64_t launch_id, const std::vector<at::Tensor>& tensors) { launch(launch_id, stream, tensors); });
}

// What run_pass would do, without a driver: (outputs, per launch what ``launch`` would pass).
py::tuple describe_pass(int64_t id, const std::vector<at::Tensor>& inputs) {
  py::list launched;
  auto outputs = run_with(pass_of(id), inputs, [&](int64_t launch_id, const std::vector<at::Tensor>& tensors) {
    launched.append(describe(launch_id, tensors));
  });
  return py::make_tuple(outputs, launched);
}


// --- the custom ops' CUDA kernels: a call of a signature that has a pass runs it from here -------------
//
// llm_systems::flash_forward / flash_backward (impl/attention/custom_ops.py) get a CUDA kernel here once
// enable_ops is called.  A call's key holds what the Gluon plans' keys hold (flash_gluon._key: per tensor
// shape, strides, dtype, device and 16-byte alignment; causal, scale, deterministic mode); where a pass is
// bound to it and ``stream_of(device)`` gives a stream (the checks of triton_launch.fast_stream), the pass
// runs with no Python at all but that check.  Otherwise the Python kernel ``forward``/``backward`` runs and
// returns (outputs..., pass id or -1): the pass its plan took, bound to the key for the next call.

namespace {

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t w : key) h = (h ^ static_cast<uint64_t>(w)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

constexpr size_t MAX_BOUND = 4096;  // keys bound to passes; all dropped when full (a property run's shapes)

struct Ops {
  py::object forward, backward, stream_of;
  int64_t from_cpp = 0, from_python = 0;
};

Ops* op_state = nullptr;  // never freed: it holds Python objects, which must not die after the interpreter

// Keys bound to passes, shared by the ops' kernels and run_bound: a key holds everything a plan depends on,
// so whoever bound it, its pass serves any caller with that key.
std::unordered_map<std::vector<int64_t>, int64_t, KeyHash> bound;
int64_t bound_hits = 0, bound_misses = 0;  // run_bound's calls

void bind_key(std::vector<int64_t> key, int64_t pass) {
  if (bound.size() >= MAX_BOUND) bound.clear();
  bound[std::move(key)] = pass;
}

std::vector<int64_t> call_key(int64_t kind, const std::vector<at::Tensor>& tensors, bool is_causal, double scale,
                              bool deterministic) {
  std::vector<int64_t> key{kind, is_causal, 0, deterministic};
  static_assert(sizeof(double) == sizeof(int64_t), "a scale's bits in one word");
  std::memcpy(&key[2], &scale, sizeof(double));
  for (const at::Tensor& t : tensors) {
    key.push_back(t.dim());
    for (int64_t s : t.sizes()) key.push_back(s);
    for (int64_t s : t.strides()) key.push_back(s);
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(static_cast<int64_t>(t.device().type()));
    key.push_back(t.device().index());
    key.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
  }
  return key;
}

// The outputs: from the pass bound to the call's key, or from Python (binding the pass it names).
std::vector<at::Tensor> op_call(int64_t kind, const std::vector<at::Tensor>& inputs, bool is_causal, double scale,
                                c10::string_view flavour, bool same_dtypes, size_t n_outputs) {
  py::gil_scoped_acquire gil;  // the autograd engine's device threads call without it
  require(op_state != nullptr, "native_launch: enable_ops was not called");
  std::vector<int64_t> key;
  if (flavour == "gluon" && same_dtypes) {
    key = call_key(kind, inputs, is_causal, scale, kind == 1 && at::globalContext().deterministicAlgorithms());
    auto hit = bound.find(key);
    if (hit != bound.end()) {
      py::object stream = op_state->stream_of(inputs[0].device().index());
      if (!stream.is_none()) {
        ++op_state->from_cpp;
        return run_pass(hit->second, stream.cast<int64_t>(), inputs);
      }
    }
  }
  ++op_state->from_python;
  py::list args;
  for (const at::Tensor& t : inputs) args.append(t);
  args.append(is_causal);
  args.append(scale);
  args.append(std::string(flavour.data(), flavour.size()));
  py::tuple got = (kind == 0 ? op_state->forward : op_state->backward)(*args);
  require(got.size() == n_outputs + 1, "native_launch: the Python kernel returned ", got.size(), " values, not ",
          n_outputs + 1);
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < n_outputs; ++i) outputs.push_back(got[i].cast<at::Tensor>());
  const int64_t pass = got[n_outputs].cast<int64_t>();
  if (!key.empty() && pass >= 0) bind_key(std::move(key), pass);
  return outputs;
}

std::tuple<at::Tensor, at::Tensor> op_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              bool is_causal, double scale, c10::string_view flavour) {
  auto out = op_call(0, {q, k, v}, is_causal, scale, flavour, true, 2);
  return {out[0], out[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> op_backward(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, const at::Tensor& o,
                                                           const at::Tensor& lse, const at::Tensor& grad_o,
                                                           bool is_causal, double scale, c10::string_view flavour) {
  auto out = op_call(1, {q, k, v, o, lse, grad_o}, is_causal, scale, flavour, grad_o.scalar_type() == q.scalar_type(),
                     3);
  return {out[0], out[1], out[2]};
}

// --- flash_attention: the eager model path's op, with its autograd node in C++ -------------------------
//
// llm_systems::flash_attention(q, k, v, is_causal, scale, flavour) -> O gets its Autograd kernel here: the
// node saves q, k, v, O and L, and its backward calls flash_backward, so that neither direction of an eager
// call runs a Python frame where a pass is bound (the autograd engine's device thread runs this node as it
// runs aten's).  The forward and backward go below autograd to the ops' kernels above.  The course's
// contract (an autograd.Function whose saved tensors hold L) stays with the Python Functions.

using ForwardSchema = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                                         double, c10::string_view);
using BackwardSchema = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                      const at::Tensor&, const at::Tensor&,
                                                                      const at::Tensor&, const at::Tensor&, bool,
                                                                      double, c10::string_view);

const c10::TypedOperatorHandle<ForwardSchema>& forward_op() {
  static const auto handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("llm_systems::flash_forward", "").typed<ForwardSchema>();
  return handle;
}

const c10::TypedOperatorHandle<BackwardSchema>& backward_op() {
  static const auto handle =
      c10::Dispatcher::singleton().findSchemaOrThrow("llm_systems::flash_backward", "").typed<BackwardSchema>();
  return handle;
}

// A kept mutant of the node (set_node_mutant; 0 the node as written): 1 returns dV for K and dK for V,
// 2 lets a double backward through (its second derivative silently zero).  The suite's checks of the node
// must reject each.
enum NodeMutant : int64_t { NODE_AS_WRITTEN = 0, NODE_DK_DV_SWAPPED = 1, NODE_DOUBLE_BACKWARD_LET_THROUGH = 2 };
int64_t node_mutant = NODE_AS_WRITTEN;

struct FlashAttentionNode : public torch::autograd::Function<FlashAttentionNode> {
  // O; saved: q, k, v, O, L (float32 natural-log logsumexp), and the scalars
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, bool is_causal, double scale, c10::string_view flavour) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [o, lse] = forward_op().call(q, k, v, is_causal, scale, flavour);
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["flavour"] = std::string(flavour.data(), flavour.size());
    return o;
  }

  // dQ, dK, dV = flash_backward(q, k, v, O, L, dO)
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // the kernels' gradients carry no graph of their own: a second derivative would be silently zero
    require(node_mutant == NODE_DOUBLE_BACKWARD_LET_THROUGH || !torch::autograd::GradMode::is_enabled(),
            "llm_systems::flash_attention: double backward (create_graph=True) is not supported; "
            "its gradients come from kernels with no derivative of their own");
    const auto saved = ctx->get_saved_variables();
    const std::string flavour = ctx->saved_data["flavour"].toStringRef();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dq, dk, dv] = backward_op().call(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0],
                                           ctx->saved_data["is_causal"].toBool(), ctx->saved_data["scale"].toDouble(),
                                           flavour);
    if (node_mutant == NODE_DK_DV_SWAPPED) std::swap(dk, dv);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor flash_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                                    double scale, c10::string_view flavour) {
  return FlashAttentionNode::apply(q, k, v, is_causal, scale, flavour);
}

// Below autograd (inference mode, or tensors with no autograd keys): O alone.
at::Tensor flash_attention_forward_only(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
                                        double scale, c10::string_view flavour) {
  return std::get<0>(forward_op().call(q, k, v, is_causal, scale, flavour));
}

}  // namespace

torch::Library* op_library = nullptr;  // the kernels' registration: deleting it removes them
bool op_library_on_cpu = false;
torch::Library* autograd_library = nullptr;  // flash_attention's node and its forward-only kernel

// Registers the ops' kernels at the CUDA key (``on_cpu``: the CPU key, for checking this dispatch on a
// machine without a GPU).  A later call replaces the Python callables and unbinds every key.
void enable_ops(py::object forward, py::object backward, py::object stream_of, bool on_cpu) {
  if (op_state == nullptr) op_state = new Ops();
  op_state->forward = std::move(forward);
  op_state->backward = std::move(backward);
  op_state->stream_of = std::move(stream_of);
  bound.clear();
  if (op_library != nullptr && op_library_on_cpu != on_cpu) {
    delete op_library;
    op_library = nullptr;
  }
  if (op_library == nullptr) {
    op_library = new torch::Library(torch::Library::IMPL, "llm_systems",
                                    on_cpu ? c10::DispatchKey::CPU : c10::DispatchKey::CUDA, __FILE__, __LINE__);
    op_library->impl("flash_forward", TORCH_FN(op_forward));
    op_library->impl("flash_backward", TORCH_FN(op_backward));
    op_library_on_cpu = on_cpu;
  }
  if (autograd_library == nullptr) {  // no backend key: the node serves every device the ops' kernels serve
    autograd_library = new torch::Library(torch::Library::IMPL, "llm_systems", std::nullopt, __FILE__, __LINE__);
    autograd_library->impl("flash_attention", torch::dispatch(c10::DispatchKey::Autograd,
                                                              TORCH_FN(flash_attention_autograd)));
    autograd_library->impl("flash_attention", torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd,
                                                              TORCH_FN(flash_attention_forward_only)));
  }
}

// The node's kept mutant (NodeMutant), for the suite's check of the node; 0 restores it.
void set_node_mutant(int64_t mutant) {
  require(mutant >= NODE_AS_WRITTEN && mutant <= NODE_DOUBLE_BACKWARD_LET_THROUGH, "native_launch: no node mutant ",
          mutant);
  node_mutant = mutant;
}

// Removes the kernels (the Python ones serve again) and unbinds every key.
void disable_ops() {
  delete op_library;
  op_library = nullptr;
  delete autograd_library;
  autograd_library = nullptr;
  bound.clear();
}

// (calls served by a pass from C++, calls that went to Python, keys bound)
py::tuple op_counts() {
  if (op_state == nullptr) return py::make_tuple(0, 0, bound.size());
  return py::make_tuple(op_state->from_cpp, op_state->from_python, bound.size());
}

// --- a bound pass run from Python: the Gluon autograd.Function's repeated calls ------------------------
//
// The Function's Python path (the plan's key, its look-up, the plan's call) costs several us a call; a
// repeat of a bound key costs one call here.  ``scale`` is the call's scale, 0 for None (a real scale is
// positive, so no caller's key collides with another's); the deterministic mode is read here, for kind 1.

void bind(int64_t kind, const std::vector<at::Tensor>& tensors, bool is_causal, double scale, int64_t pass) {
  require(pass >= 0, "native_launch: bind takes a registered pass, got ", pass);
  pass_of(pass);
  bind_key(call_key(kind, tensors, is_causal, scale, kind == 1 && at::globalContext().deterministicAlgorithms()),
           pass);
}

// The pass bound to the call's key, or -1 (no driver needed: the CPU tests' view of run_bound's look-up).
int64_t bound_pass(int64_t kind, const std::vector<at::Tensor>& tensors, bool is_causal, double scale) {
  auto hit = bound.find(call_key(kind, tensors, is_causal, scale,
                                 kind == 1 && at::globalContext().deterministicAlgorithms()));
  return hit == bound.end() ? -1 : hit->second;
}

py::object run_bound(int64_t kind, int64_t stream, const std::vector<at::Tensor>& tensors, bool is_causal,
                     double scale) {
  const int64_t pass = bound_pass(kind, tensors, is_causal, scale);
  if (pass < 0) {
    ++bound_misses;
    return py::none();
  }
  ++bound_hits;
  return py::cast(run_pass(pass, stream, tensors));
}

// Unbinds every key (the passes stay registered): a test's fresh table.
void clear_bound() { bound.clear(); }

// (run_bound's calls served by a pass, run_bound's calls that found none)
py::tuple bound_counts() { return py::make_tuple(bound_hits, bound_misses); }

std::vector<int64_t> op_key(int64_t kind, const std::vector<at::Tensor>& tensors, bool is_causal, double scale,
                            bool deterministic) {
  return call_key(kind, tensors, is_causal, scale, deterministic);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_launch", &register_launch);
  m.def("launch", &launch);
  m.def("describe", &describe);
  m.def("register_pass", &register_pass);
  m.def("run_pass", &run_pass);
  m.def("describe_pass", &describe_pass);
  m.def("enable_ops", &enable_ops, py::arg("forward"), py::arg("backward"), py::arg("stream_of"),
        py::arg("on_cpu") = false);
  m.def("disable_ops", &disable_ops);
  m.def("set_node_mutant", &set_node_mutant);
  m.def("op_counts", &op_counts);
  m.def("op_key", &op_key);
  m.def("bind", &bind);
  m.def("bound_pass", &bound_pass);
  m.def("run_bound", &run_bound);
  m.def("bound_counts", &bound_counts);
  m.def("clear_bound", &clear_bound);
}
