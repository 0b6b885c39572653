// The backward node of roofline's ops in eager mode, in C++.
//
// A torch.autograd.Function's backward is a Python node: on every backward the engine takes the GIL, wraps the
// gradients in Python objects and runs several Python frames before the first kernel launches. Against one of
// torch's own C++ nodes that costs more host time than the kernels of a small op take (measured:
// benchmarks/results/h100-host.md, "Run of 2026-11-24"). This node is a C++ one. The first backward of each
// signature runs the op's Python backward and records what it did (roofline/ops/_eager_node.py): the aten calls
// it made (allocations, views, small reductions) and the Triton kernels it launched. Later backwards with that
// signature replay the record here, without Python: each aten call through the dispatcher, each kernel through
// cuLaunchKernel with the compiled kernel's handle, as Triton's own launcher does.
//
// A backward whose signature has no record, or that runs where the record does not hold (grad mode on, i.e.
// create_graph=True; a Python dispatch mode active), goes to the Python backward.
//
// Written against torch's C++ autograd API as both torch 2.11 (nodes held by std::shared_ptr) and 2.13
// (c10::intrusive_ptr) declare it.

#include <torch/extension.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <ATen/EmptyTensor.h>
#include <ATen/ScalarOps.h>
#include <ATen/autocast_mode.h>
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <type_traits>
#include <unordered_set>

namespace py = pybind11;
namespace ag = torch::autograd;

namespace {

using NodePtr = decltype(ag::Edge::function);   // std::shared_ptr<Node> or c10::intrusive_ptr<Node>
constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<ag::Node>>;

template <class T, class... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (kSharedNodes) {
    // deleteNode frees a long chain of nodes without recursing (found by argument-dependent lookup: torch 2.13
    // no longer declares it, and this branch is not instantiated there)
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...), [](T* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

template <class N>
NodePtr pointer_to(N* node) {
  if constexpr (kSharedNodes) {
    return node->shared_from_this();
  } else {
    return node->getptr();
  }
}

// ----------------------------------------------------------------------------------------------- CUDA driver

// CUresult cuLaunchKernel(CUfunction, grid x y z, block x y z, shared bytes, CUstream, params, extra)
using LaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**);

// CUresult cuTensorMapEncodeTiled(CUtensorMap*, data type, rank, address, dims, byte strides, box, element
// strides, interleave, swizzle, L2 promotion, out-of-bounds fill)
using EncodeTiled = int (*)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const unsigned*,
                            const unsigned*, int, int, int, int);

template <class F>
F driver_function(const char* name) {
  // libcuda is loaded by the time a kernel was compiled, which a recorded launch needs: take it, do not load it
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return library ? reinterpret_cast<F>(dlsym(library, name)) : nullptr;
}

LaunchKernel launch_kernel() {
  static LaunchKernel launch = driver_function<LaunchKernel>("cuLaunchKernel");
  TORCH_CHECK(launch != nullptr, "roofline: cuLaunchKernel was not found in a loaded libcuda.so.1");
  return launch;
}

// A TMA descriptor argument: what Triton's fill_tma_descriptor takes, dimensions innermost first as the driver
// wants them. Encoded anew at each launch from the tensor's address (the rest is fixed by the plan).
struct Descriptor {
  int data_type, swizzle, fill;
  unsigned rank;
  uint64_t dims[5], byte_strides[5];
  unsigned box[5];
};

struct alignas(64) TensorMap {   // CUtensorMap: 128 bytes, 64-byte aligned, passed by value
  uint8_t bytes[128];
};

void encode(const Descriptor& d, void* address, TensorMap* map) {
  static EncodeTiled encode_tiled = driver_function<EncodeTiled>("cuTensorMapEncodeTiled");
  TORCH_CHECK(encode_tiled != nullptr, "roofline: cuTensorMapEncodeTiled was not found in libcuda.so.1");
  const unsigned element_strides[5] = {1, 1, 1, 1, 1};
  int status = encode_tiled(map, d.data_type, d.rank, address, d.dims, d.byte_strides, d.box, element_strides,
                            /*interleave none*/ 0, d.swizzle, /*L2 promotion 128B*/ 2, d.fill);
  TORCH_CHECK(status == 0, "roofline: cuTensorMapEncodeTiled failed with CUDA driver error ", status);
}

// A number argument of `kind` ('b' i8, 'h' i16, 'i' i32, 'l' i64, 'f' fp32, 'd' fp64) written as cuLaunchKernel
// reads it: its bytes at the start of `value` (8 bytes).
void pack_number(char kind, int64_t integer, double real, void* value) {
  switch (kind) {
    case 'b': { int8_t v = static_cast<int8_t>(integer); std::memcpy(value, &v, 1); break; }
    case 'h': { int16_t v = static_cast<int16_t>(integer); std::memcpy(value, &v, 2); break; }
    case 'i': { int32_t v = static_cast<int32_t>(integer); std::memcpy(value, &v, 4); break; }
    case 'l': std::memcpy(value, &integer, 8); break;
    case 'f': { float v = static_cast<float>(real); std::memcpy(value, &v, 4); break; }
    case 'd': std::memcpy(value, &real, 8); break;
    default:
      TORCH_CHECK(false, "roofline: unknown launch argument kind ", kind);
  }
}

constexpr size_t kMaxArguments = 96;   // a kernel's parameters, at most (a launch packs them on the stack); the
                                        // Hopper attention backward takes 69

// cuLaunchKernel on the current CUDA device's current stream, one-dimensional blocks of `block` threads.
void launch_on_current_stream(void* function, const unsigned grid[3], unsigned block, unsigned shared,
                              void** params) {
  const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  void* stream = cuda->getStream(cuda->getDevice()).native_handle();
  int status = launch_kernel()(function, grid[0], grid[1], grid[2], block, 1, 1, shared, stream, params, nullptr);
  TORCH_CHECK(status == 0, "roofline: cuLaunchKernel failed with CUDA driver error ", status);
}

// ----------------------------------------------------------------------------------------------- programs

// What a recorded backward computes with: slot i is saved tensor i, then gradient i, then each result of a
// recorded aten call, in order.

struct AtenStep {
  c10::OperatorHandle op;
  torch::jit::Stack arguments;                   // as recorded, every tensor that is a slot replaced at replay
  std::vector<std::pair<size_t, int>> slots;     // (argument position, slot)
  size_t results;                                // how many values the call returns, each a new slot
  bool grad_mode;                                // autograd's grad mode when it was made (torch.no_grad blocks)

  // Appends the call's results to slots.
  void run(std::vector<at::Tensor>& slots) const {
    torch::jit::Stack stack = arguments;
    for (const auto& [position, slot] : this->slots) stack[position] = slots[slot];
    {
      at::AutoGradMode guard(grad_mode);
      op.callBoxed(&stack);
    }
    for (size_t i = 0; i < results; ++i) slots.push_back(stack[i].toTensor());
  }
};

// An allocation (torch.empty, empty_like, new_empty, empty_strided) whose result's layout the signature fixes:
// made by the device's allocator directly, as torch's own kernels make their outputs. Through the dispatcher,
// boxed, torch.empty_like cost a replay a sizeable share of a small op's host time (measured:
// benchmarks/results/h100-host.md, "2026-11-26"); torch's gelu, which a replayed gelu is compared with, pays no
// such call for its output. The recorded call runs instead where the direct path would skip something the
// dispatcher does: a profiler's record of the op, the NaN fill of
// torch.use_deterministic_algorithms(fill_uninitialized_memory), another current device than the recorded one.
struct AllocationStep {
  AtenStep call;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
  at::Device device;

  void run(std::vector<at::Tensor>& slots) const {
    auto& context = at::globalContext();
    bool deterministic_fill = context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory();
    if (at::hasCallbacks() || deterministic_fill || (device.is_cuda() && current_cuda_device() != device.index())) {
      call.run(slots);
      return;
    }
    c10::DispatchKeySet keys(device.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU);
    slots.push_back(at::Tensor(
        at::detail::empty_strided_generic(sizes, strides, c10::GetAllocator(device.type()), keys, dtype)));
  }

  static c10::DeviceIndex current_cuda_device() {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  }
};

// Python objects a program or a node holds, released under the GIL wherever they die (often an engine thread).
struct PythonReference {
  py::object object;
  explicit PythonReference(py::object o) : object(std::move(o)) {}
  ~PythonReference() {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      object = py::object();
    } else {
      object.release();   // the interpreter is gone: nothing to decrement
    }
  }
};

class Programs;

// An op's node name, kept for the life of the process: a node refers to it instead of copying it (a name longer
// than std::string's inline buffer would cost every node an allocation). Ops are few, and so are their names.
const std::string* interned(const std::string& name) {
  static std::mutex mutex;
  static std::unordered_set<std::string> names;   // nodes never move: the pointers stay valid
  std::lock_guard<std::mutex> lock(mutex);
  return &*names.insert(name).first;
}

// A forward's attaching of its op's autograd node (an EagerNode) to the outputs of its kernels: what
// roofline/ops/_eager_node.py's attach does in Python, by slots. inputs: per argument of the op, its slot or -1
// (not a tensor, or None): an edge where the tensor requires grad; outputs: per output, its slot or -1.
struct AttachStep {
  const std::string* name;                                // interned
  std::shared_ptr<Programs> programs;                     // the node's recorded backwards
  std::shared_ptr<PythonReference> backward, context;     // its Python backward and the recorded call's context
  std::vector<int> inputs, outputs, non_differentiable, saved;
  bool once;                                              // the node hands its saved tensors on (EagerNode)
};

void attach_step(const AttachStep& step, const std::vector<at::Tensor>& slots);   // (below, with the node)

// A call back into Python that a recorded forward makes again at each replay: host-side work whose result is not
// fixed by the call's signature. The loss ops' check of their targets takes a slot of pinned memory for the count
// and queues it, reading (and raising for) the counts written since; a launch's scratch is chosen by the current
// stream. Arguments: slots, or constants; results (a tensor, or a tuple of them): new slots.
struct HostStep {
  std::shared_ptr<PythonReference> function;
  std::vector<int> slots;                                      // per argument: its slot, or -1 for a constant
  std::vector<std::shared_ptr<PythonReference>> constants;     // per argument: the constant (null for a slot)
  size_t results;

  void run(std::vector<at::Tensor>& slots_) const {
    py::gil_scoped_acquire gil;
    py::tuple args(slots.size());
    for (size_t i = 0; i < slots.size(); ++i)
      args[i] = slots[i] >= 0 ? py::cast(slots_[slots[i]]) : constants[i]->object;
    py::object out = function->object(*args);   // a Python exception propagates: the replay stops here
    if (THPVariable_Check(out.ptr())) {
      TORCH_CHECK(results == 1, "roofline: a host step returned one tensor where it was recorded with ", results);
      slots_.push_back(THPVariable_Unpack(out.ptr()));
      return;
    }
    TORCH_CHECK(PyTuple_Check(out.ptr()) && static_cast<size_t>(PyTuple_GET_SIZE(out.ptr())) == results,
                "roofline: a host step returned other than the ", results, " tensors it was recorded with");
    for (py::handle t : py::reinterpret_borrow<py::tuple>(out)) {
      TORCH_CHECK(THPVariable_Check(t.ptr()), "roofline: a host step returned a non-tensor");
      slots_.push_back(THPVariable_Unpack(t.ptr()));
    }
  }
};

struct LaunchArgument {
  char kind;          // 'p' pointer, 'T' TMA descriptor, 'b' i8, 'h' i16, 'i' i32, 'l' i64, 'f' fp32, 'd' fp64,
                      // '-' not passed
  int slot;           // for a pointer or a descriptor: the slot, or -1 for a constant tensor (in `constant`)
  int64_t integer;
  double real;
  at::Tensor constant;
  Descriptor descriptor;
};

struct LaunchStep {
  void* function;
  unsigned grid[3];
  unsigned block;
  unsigned shared;
  std::vector<LaunchArgument> arguments;
  size_t descriptors = 0;   // arguments of kind 'T'
};

// A tensor's layout as a signature holds it: defined, sizes, strides, dtype, device, and its data pointer
// modulo 16 (the kernels were compiled for, and recorded with, 16-byte aligned inputs).
struct Layout {
  bool defined = false;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::ScalarType::Undefined;
  at::Device device = at::kCPU;
  uintptr_t alignment = 0;

  static Layout of(const at::Tensor& t) {
    Layout layout;
    if (!t.defined()) return layout;
    layout.defined = true;
    layout.sizes = t.sizes().vec();
    layout.strides = t.strides().vec();
    layout.dtype = t.scalar_type();
    layout.device = t.device();
    layout.alignment = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16;
    return layout;
  }

  bool matches(const at::Tensor& t) const {
    if (!t.defined()) return !defined;
    return defined && t.scalar_type() == dtype && t.device() == device && t.sizes().equals(sizes) &&
           t.strides().equals(strides) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == alignment;
  }
};

struct Program {
  std::vector<Layout> inputs;          // the saved tensors', then the gradients' (for matching)
  bool replayable = false;             // false: a signature whose backward always runs in Python
  std::vector<std::variant<AtenStep, AllocationStep, LaunchStep, AttachStep, HostStep>> steps;
  std::vector<int> results;            // per gradient returned: its slot, or -1 for None
  size_t slot_count = 0;               // the slots a run fills in all (reserved at its start: no reallocation)

  bool matches(const ag::variable_list& saved, const ag::variable_list& grads) const {
    if (inputs.size() != saved.size() + grads.size()) return false;
    for (size_t i = 0; i < saved.size(); ++i)
      if (!inputs[i].matches(saved[i])) return false;
    for (size_t i = 0; i < grads.size(); ++i)
      if (!inputs[saved.size() + i].matches(grads[i])) return false;
    return true;
  }

  ag::variable_list run(ag::variable_list slots, const ag::variable_list& grads) const {
    // slots: the saved tensors, then the gradients, then each aten call's results
    slots.reserve(slot_count);
    slots.insert(slots.end(), grads.begin(), grads.end());
    for (const auto& step : steps) {
      if (const auto* aten = std::get_if<AtenStep>(&step)) {
        aten->run(slots);
      } else if (const auto* allocation = std::get_if<AllocationStep>(&step)) {
        allocation->run(slots);
      } else if (const auto* attach = std::get_if<AttachStep>(&step)) {
        attach_step(*attach, slots);
      } else if (const auto* host = std::get_if<HostStep>(&step)) {
        host->run(slots);
      } else {
        launch(std::get<LaunchStep>(step), slots);
      }
    }
    ag::variable_list out;
    out.reserve(results.size());
    for (int slot : results) out.push_back(slot < 0 ? at::Tensor() : slots[slot]);
    return out;
  }

  static void launch(const LaunchStep& step, const std::vector<at::Tensor>& slots) {
    if (static_cast<uint64_t>(step.grid[0]) * step.grid[1] * step.grid[2] == 0) return;   // as Triton does
    uint64_t values[kMaxArguments + 2] = {};   // + Triton's two scratch pointers (null); no allocation per launch
    void* params[kMaxArguments + 2];
    std::unique_ptr<TensorMap[]> maps(step.descriptors ? new TensorMap[step.descriptors] : nullptr);
    size_t m = 0;
    size_t n = 0;
    for (const auto& argument : step.arguments) {
      void* value = &values[n];
      switch (argument.kind) {
        case '-':
          continue;
        case 'p': {
          const at::Tensor& t = argument.slot < 0 ? argument.constant : slots[argument.slot];
          uint64_t pointer = reinterpret_cast<uint64_t>(t.data_ptr());
          std::memcpy(value, &pointer, 8);
          break;
        }
        case 'T': {
          const at::Tensor& t = argument.slot < 0 ? argument.constant : slots[argument.slot];
          encode(argument.descriptor, t.data_ptr(), &maps[m]);
          value = &maps[m++];
          break;
        }
        default:
          pack_number(argument.kind, argument.integer, argument.real, value);
      }
      params[n++] = value;
    }
    params[n] = &values[n];
    params[n + 1] = &values[n + 1];
    launch_on_current_stream(step.function, step.grid, step.block, step.shared, params);
  }
};

// The recorded programs of one op's plan (and the attributes its forward kept): one per signature, a few.
class Programs {
 public:
  static constexpr size_t kLimit = 16;   // signatures recorded; past it the backward stays in Python

  std::shared_ptr<const Program> find(const ag::variable_list& saved, const ag::variable_list& grads) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& program : programs_)
      if (program->matches(saved, grads)) return program;
    return nullptr;
  }

  bool full() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return programs_.size() >= kLimit;
  }

  void add(std::shared_ptr<Program> program) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (programs_.size() < kLimit) programs_.push_back(std::move(program));
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const Program>> programs_;
};

// ----------------------------------------------------------------------------------------------- forwards

// A forward's argument other than a tensor (or None), as a recorded forward holds it: a replay needs the same value.
struct Constant {
  char kind = 'x';   // 'b' bool, 'i' int, 'd' float, 's' str, 't' a tuple or list of ints (a shape); 'x' a type
                     // a replay cannot compare (any matches)
  int64_t integer = 0;
  double real = 0.0;
  py::object text;   // a str: compared by identity first (a literal in the caller's code is the same object)
  std::vector<int64_t> integers;

  // Whether o is a tuple or list of ints (a bool is no int here), each handed to visit(index, value), which may
  // stop the walk by returning false. No allocation: a replay compares a shape on every call.
  template <class Visit>
  static bool each_int(py::handle o, Visit&& visit) {
    if (!PyTuple_Check(o.ptr()) && !PyList_Check(o.ptr())) return false;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(o.ptr());
    PyObject** items = PySequence_Fast_ITEMS(o.ptr());
    for (Py_ssize_t i = 0; i < size; ++i) {
      if (!PyLong_Check(items[i]) || PyBool_Check(items[i])) return false;
      int overflow = 0;
      int64_t value = PyLong_AsLongLongAndOverflow(items[i], &overflow);
      if (overflow || !visit(static_cast<size_t>(i), value)) return false;
    }
    return true;
  }

  static Constant of(py::handle o) {
    Constant c;
    if (PyBool_Check(o.ptr())) {
      c.kind = 'b';
      c.integer = o.ptr() == Py_True;
    } else if (PyLong_Check(o.ptr())) {
      int overflow = 0;
      c.integer = PyLong_AsLongLongAndOverflow(o.ptr(), &overflow);
      c.kind = overflow ? 'x' : 'i';
    } else if (PyFloat_Check(o.ptr())) {
      c.kind = 'd';
      c.real = PyFloat_AS_DOUBLE(o.ptr());
    } else if (PyUnicode_Check(o.ptr())) {
      c.kind = 's';
      c.text = py::reinterpret_borrow<py::object>(o);
    } else if (each_int(o, [&c](size_t, int64_t value) { c.integers.push_back(value); return true; })) {
      c.kind = 't';
    }
    return c;
  }

  bool equals(py::handle o) const {
    switch (kind) {
      case 'b': return PyBool_Check(o.ptr()) && (o.ptr() == Py_True) == (integer != 0);
      case 'i': {
        if (!PyLong_Check(o.ptr()) || PyBool_Check(o.ptr())) return false;
        int overflow = 0;
        return PyLong_AsLongLongAndOverflow(o.ptr(), &overflow) == integer && !overflow;
      }
      case 'd': return PyFloat_Check(o.ptr()) && PyFloat_AS_DOUBLE(o.ptr()) == real;
      case 's':
        return o.ptr() == text.ptr() || (PyUnicode_Check(o.ptr()) && PyUnicode_Compare(o.ptr(), text.ptr()) == 0);
      case 't':
        return (PyTuple_Check(o.ptr()) || PyList_Check(o.ptr())) &&
               static_cast<size_t>(PySequence_Fast_GET_SIZE(o.ptr())) == integers.size() &&
               each_int(o, [this](size_t i, int64_t value) { return value == integers[i]; });
      default: return true;   // a program holding such a constant never replays: found, it sends calls to Python
    }
  }
};

// What a forward's behaviour may depend on beyond its arguments, which a recorded forward holds and a replay must
// find the same: autocast on CUDA and CPU, and its dtypes (a recording sees the calls autocast made of the op's).
struct CallState {
  bool autocast_cuda = false, autocast_cpu = false;
  at::ScalarType cuda_dtype = at::ScalarType::Undefined, cpu_dtype = at::ScalarType::Undefined;

  static CallState now() {
    CallState state;
    state.autocast_cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    state.autocast_cpu = at::autocast::is_autocast_enabled(at::kCPU);
    if (state.autocast_cuda) state.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    if (state.autocast_cpu) state.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    return state;
  }

  bool operator==(const CallState& o) const {
    return autocast_cuda == o.autocast_cuda && autocast_cpu == o.autocast_cpu && cuda_dtype == o.cuda_dtype &&
           cpu_dtype == o.cpu_dtype;
  }
};

// Tensors a replay must leave to Python: wrappers of another (functorch's batched and gradient wrappers,
// functionalization, a subclass with a dispatch of its own), whose memory the signature cannot describe.
const c10::DispatchKeySet kWrapperKeys{c10::DispatchKey::Python, c10::DispatchKey::FuncTorchBatched,
                                       c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Functionalize};

// A recorded forward: for each argument (positional, then keyword in the order the call gave them), a tensor slot
// (a tensor or None: its layout is the program's input of that position) or a constant; the keywords' names; the
// call state it was recorded in; the program; and whether the forward returned one tensor or a tuple.
struct ForwardProgram {
  std::shared_ptr<Program> program;
  std::vector<std::optional<Constant>> constants;   // per argument: nullopt for a tensor slot
  std::vector<char> wants_grad;                     // per argument: a tensor autograd records (grad mode on)
  std::vector<py::object> keywords;                 // the keyword arguments' names, in the call's order
  CallState state;
  bool single = true;
  int device = -1;   // the CUDA device its kernels were loaded on (-1: none launched)
  mutable uint64_t hits = 0;   // calls it matched (under its ForwardPrograms' lock)

  // Whether every argument matches what was recorded, autograd's grad mode being grad_mode; `tensors` gets the
  // arguments' tensors (undefined for None and constants).
  bool match(PyObject* const* args, size_t count, PyObject* kwargs, bool grad_mode,
             std::vector<at::Tensor>& tensors) const {
    size_t keyword_count = kwargs == nullptr ? 0 : static_cast<size_t>(PyDict_GET_SIZE(kwargs));
    if (count + keyword_count != constants.size() || keyword_count != keywords.size()) return false;
    tensors.assign(count + keyword_count, at::Tensor());
    for (size_t i = 0; i < count; ++i)
      if (!argument_matches(i, args[i], grad_mode, tensors)) return false;
    Py_ssize_t position = 0;
    PyObject *key, *value;
    for (size_t k = 0; kwargs != nullptr && PyDict_Next(kwargs, &position, &key, &value); ++k) {
      if (key != keywords[k].ptr() && PyUnicode_Compare(key, keywords[k].ptr()) != 0) return false;
      if (!argument_matches(count + k, value, grad_mode, tensors)) return false;
    }
    return true;
  }

  bool argument_matches(size_t i, PyObject* o, bool grad_mode, std::vector<at::Tensor>& tensors) const {
    if (constants[i]) return constants[i]->equals(o);
    if (THPVariable_CheckExact(o)) {   // a Tensor or a Parameter; a subclass may mean something else
      tensors[i] = THPVariable_Unpack(o);
      if (tensors[i].key_set().has_any(kWrapperKeys)) return false;
      return (grad_mode && tensors[i].requires_grad()) == static_cast<bool>(wants_grad[i]) &&
             program->inputs[i].matches(tensors[i]);
    }
    return o == Py_None && !program->inputs[i].defined;
  }
};

// The recorded forwards of one op's plan (or of one entry point of the library), one per signature: the layouts of
// its tensors, its other arguments, the call state. The most recently used first: a replay's search meets the
// signatures a program is calling now before the others, and past kLimit a new signature takes the place of the
// one unused the longest. (It was the first 16 forever: a process that had decoded with one model then ran every
// int8_linear call of the next one through Python, the replay's search and a recording's checks included; the
// second model's int8 decoding ran slower than bf16 eager where the first's ran faster; measured:
// benchmarks/results/h100-models.md, "2026-11-26: the replays' signature limit".)
// Recording costs a call several times its Python run (a dispatch mode sees every aten call), so it stops once
// kWasteLimit recordings were wasted: a program that cannot replay, or one forgotten without having matched a
// call. Calls of ever new shapes (every prefill length, or the interpreter's launches in the CPU tests, which
// cannot replay) then run in Python, as the programs recorded keep replaying.
class ForwardPrograms {
 public:
  static constexpr size_t kLimit = 64;
  static constexpr size_t kWasteLimit = 16;

  // entry: the programs of a whole entry point (roofline/ops/_eager_node.py, entry_replay), which leaves to Python
  // the calls a profiler sees (Python records those under the op's name).
  explicit ForwardPrograms(bool entry = false) : entry_(entry) {}

  // The signatures held (at most kLimit).
  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return programs_.size();
  }

  // Whether recording has stopped (see kWasteLimit).
  bool full() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return wasted_ >= kWasteLimit;
  }

  // What the recorder built of a forward called with `args` then the keyword arguments named `keywords` (their
  // values at the end of `args`), on CUDA device `device` (-1 if none), which returned one tensor (`single`) or a
  // tuple; in the call state of now.
  void add(std::shared_ptr<Program> program, py::handle args, py::tuple keywords, bool single, int device) {
    auto forward = std::make_shared<ForwardProgram>();
    forward->program = std::move(program);
    forward->single = single;
    forward->device = device;
    forward->state = CallState::now();
    for (py::handle name : keywords) forward->keywords.push_back(py::reinterpret_borrow<py::object>(name));
    bool grad_mode = at::GradMode::is_enabled();
    for (py::handle o : py::reinterpret_borrow<py::sequence>(args)) {
      bool tensor = THPVariable_Check(o.ptr());
      forward->wants_grad.push_back(tensor && grad_mode && THPVariable_Unpack(o.ptr()).requires_grad());
      if (tensor || o.is_none()) {
        forward->constants.emplace_back(std::nullopt);
      } else {
        forward->constants.emplace_back(Constant::of(o));
        if (forward->constants.back()->kind == 'x') forward->program->replayable = false;
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!forward->program->replayable) ++wasted_;
    if (programs_.size() >= kLimit) {
      if (programs_.back()->hits == 0 && programs_.back()->program->replayable) ++wasted_;
      programs_.pop_back();
    }
    programs_.insert(programs_.begin(), std::move(forward));
  }

  // The forward's output, replayed; None where no program matches the call (record one); False where it must run
  // in Python: the one that matches cannot replay (a forward that could not be recorded), another device is
  // current, a dispatch mode is active, or, for an entry point, a profiler is on.
  py::object replay(const py::tuple& args, const py::object& kwargs) const {
    // before any tensor is looked at: a dispatch mode's tensors (FakeTensor) have no memory to match
    if (c10::impl::TorchDispatchModeTLS::stack_len() != 0 || (entry_ && at::hasCallbacks())) {
      return py::bool_(false);
    }
    PyObject* const* items = &PyTuple_GET_ITEM(args.ptr(), 0);
    size_t count = static_cast<size_t>(PyTuple_GET_SIZE(args.ptr()));
    PyObject* keywords = PyDict_Check(kwargs.ptr()) && PyDict_GET_SIZE(kwargs.ptr()) > 0 ? kwargs.ptr() : nullptr;
    CallState state = CallState::now();
    bool grad_mode = at::GradMode::is_enabled();
    std::shared_ptr<const ForwardProgram> found;
    std::vector<at::Tensor> tensors;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = programs_.begin(); it != programs_.end(); ++it) {
        if ((*it)->state == state && (*it)->match(items, count, keywords, grad_mode, tensors)) {
          found = *it;
          ++found->hits;
          std::rotate(programs_.begin(), it, it + 1);   // to the front
          break;
        }
      }
    }
    if (!found) return py::none();
    if (!found->program->replayable) return py::bool_(false);
    if (found->device >= 0) {
      const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      if (cuda->getDevice().index() != found->device) return py::bool_(false);
    }
    ++replayed_;
    ag::variable_list out;
    {
      // the recorded calls are those autocast made: replayed as they are, not cast again
      c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
      out = found->program->run(std::move(tensors), {});
    }
    if (found->single) return py::cast(out.at(0));
    py::tuple result(out.size());
    for (size_t i = 0; i < out.size(); ++i) result[i] = out[i].defined() ? py::cast(out[i]) : py::none();
    return result;
  }

  // Calls replayed so far (for the tests, and for a user asking whether an op's calls replay).
  uint64_t replayed() const { return replayed_; }

 private:
  bool entry_;
  mutable std::atomic<uint64_t> replayed_{0};
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<const ForwardProgram>> programs_;   // most recently used first
  size_t wasted_ = 0;   // recordings that could not replay, or were forgotten unused
};

// ForwardPrograms::replay as a builtin bound to its programs, called with (args: tuple, kwargs: dict | None): the
// replays' entry from Python without pybind11's method call, whose argument casting and overload dispatch cost a
// replay a noticeable share of a call as cheap as torch's sin (measured: benchmarks/results/h100-host.md,
// "2026-11-26, evening").
constexpr const char* kReplayer = "roofline.ForwardPrograms";

PyObject* replay_from_python(PyObject* self, PyObject* const* args, Py_ssize_t count) {
  HANDLE_TH_ERRORS
  if (count != 2 || !PyTuple_Check(args[0]) || !(args[1] == Py_None || PyDict_Check(args[1]))) {
    PyErr_SetString(PyExc_TypeError, "roofline: replay(args: tuple, kwargs: dict | None)");
    return nullptr;
  }
  const auto* programs = static_cast<std::shared_ptr<ForwardPrograms>*>(PyCapsule_GetPointer(self, kReplayer));
  if (programs == nullptr) return nullptr;
  return (*programs)
      ->replay(py::reinterpret_borrow<py::tuple>(args[0]), py::reinterpret_borrow<py::object>(args[1]))
      .release()
      .ptr();
  END_HANDLE_TH_ERRORS
}

PyMethodDef replay_method = {"replay", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(
                                           &replay_from_python)),
                             METH_FASTCALL, "replay(args, kwargs): ForwardPrograms.replay"};

py::object replayer(std::shared_ptr<ForwardPrograms> programs) {
  auto* held = new std::shared_ptr<ForwardPrograms>(std::move(programs));
  PyObject* capsule = PyCapsule_New(held, kReplayer, [](PyObject* o) {
    delete static_cast<std::shared_ptr<ForwardPrograms>*>(PyCapsule_GetPointer(o, kReplayer));
  });
  if (capsule == nullptr) {
    delete held;
    throw py::error_already_set();
  }
  PyObject* function = PyCFunction_NewEx(&replay_method, capsule, nullptr);
  Py_DECREF(capsule);   // (held by the function)
  if (function == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(function);
}

// Builds a Program from what the Python recorder saw.
class ProgramBuilder {
 public:
  explicit ProgramBuilder(const std::vector<std::optional<at::Tensor>>& inputs) {
    program_ = std::make_shared<Program>();
    for (const auto& t : inputs) program_->inputs.push_back(Layout::of(t.value_or(at::Tensor())));
  }

  // An aten call: op name and overload, its arguments as the recorder saw them, and the positions (in the
  // schema's order) of those that are slots.
  void aten(const std::string& name, const std::string& overload, const py::tuple& args, const py::dict& kwargs,
            const std::vector<std::pair<size_t, int>>& slots, bool grad_mode) {
    program_->steps.emplace_back(call(name, overload, args, kwargs, slots, grad_mode));
  }

  // An allocation that made `result` (see AllocationStep): the call as aten records it, and the result's layout.
  void allocate(const std::string& name, const std::string& overload, const py::tuple& args, const py::dict& kwargs,
                const std::vector<std::pair<size_t, int>>& slots, bool grad_mode, const at::Tensor& result) {
    program_->steps.emplace_back(AllocationStep{call(name, overload, args, kwargs, slots, grad_mode),
                                                result.sizes().vec(), result.strides().vec(), result.scalar_type(),
                                                result.device()});
  }

  void launch(uint64_t function, std::vector<unsigned> grid, unsigned block, unsigned shared,
              const std::string& kinds, const py::list& args) {
    TORCH_CHECK(grid.size() == 3 && kinds.size() == args.size() && kinds.size() <= kMaxArguments,
                "roofline: malformed launch record, or more than ", kMaxArguments, " arguments");
    LaunchStep step{reinterpret_cast<void*>(function), {grid[0], grid[1], grid[2]}, block, shared, {}, 0};
    for (size_t i = 0; i < kinds.size(); ++i) {
      LaunchArgument argument{kinds[i], -1, 0, 0.0, at::Tensor(), {}};
      py::handle value = args[i];
      if (argument.kind == 'T') {
        // (tensor or slot, swizzle, element size, data type, block, shape, strides, NaN padding), as Triton's
        // fill_tma_descriptor takes them
        py::tuple spec = py::reinterpret_borrow<py::tuple>(value);
        value = spec[0];
        auto block = spec[4].cast<std::vector<int64_t>>(), shape = spec[5].cast<std::vector<int64_t>>();
        auto strides = spec[6].cast<std::vector<int64_t>>();
        int64_t element_size = spec[2].cast<int64_t>();
        Descriptor& d = argument.descriptor;
        d.rank = static_cast<unsigned>(block.size());
        TORCH_CHECK(d.rank >= 1 && d.rank <= 5 && shape.size() == d.rank && strides.size() == d.rank,
                    "roofline: malformed descriptor record");
        d.swizzle = spec[1].cast<int>();
        d.data_type = spec[3].cast<int>();
        d.fill = spec[7].cast<int>() != 0 ? 1 : 0;   // NaN request zero FMA, else none
        for (unsigned i = 0; i < d.rank; ++i) {
          d.box[d.rank - 1 - i] = static_cast<unsigned>(block[i]);
          d.dims[d.rank - 1 - i] = static_cast<uint64_t>(shape[i]);
        }
        for (unsigned i = 0; i + 1 < d.rank; ++i) d.byte_strides[d.rank - 2 - i] = element_size * strides[i];
        d.byte_strides[d.rank - 1] = d.dims[d.rank - 1] * (d.rank == 1 ? element_size : d.byte_strides[d.rank - 2]);
        ++step.descriptors;
      }
      if (argument.kind == 'p' || argument.kind == 'T') {
        if (py::isinstance<py::int_>(value)) argument.slot = value.cast<int>();
        else argument.constant = value.cast<at::Tensor>();
      } else if (argument.kind == 'f' || argument.kind == 'd') {
        argument.real = value.cast<double>();
      } else if (argument.kind != '-') {
        argument.integer = value.cast<int64_t>();
      }
      step.arguments.push_back(std::move(argument));
    }
    program_->steps.emplace_back(std::move(step));
  }

  // An op's node attached to its outputs (see AttachStep), by slots.
  void attach(const std::string& name, std::shared_ptr<Programs> programs, py::object backward, py::object context,
              std::vector<int> inputs, std::vector<int> outputs, std::vector<int> non_differentiable,
              std::vector<int> saved, bool once) {
    program_->steps.emplace_back(AttachStep{interned(name), std::move(programs),
                                            std::make_shared<PythonReference>(std::move(backward)),
                                            std::make_shared<PythonReference>(std::move(context)),
                                            std::move(inputs), std::move(outputs), std::move(non_differentiable),
                                            std::move(saved), once});
  }

  // A call back into Python (see HostStep): per argument its slot or -1, and its constant (None for a slot).
  void host(py::object function, std::vector<int> slots, const py::list& constants, size_t results) {
    TORCH_CHECK(constants.size() == slots.size(), "roofline: malformed host step record");
    HostStep step{std::make_shared<PythonReference>(std::move(function)), std::move(slots), {}, results};
    for (size_t i = 0; i < step.slots.size(); ++i)
      step.constants.push_back(step.slots[i] >= 0 ? nullptr
                                                  : std::make_shared<PythonReference>(constants[i].cast<py::object>()));
    program_->steps.emplace_back(std::move(step));
  }

  std::shared_ptr<Program> finish(const std::vector<int>& results, bool replayable, size_t slot_count) {
    program_->results = results;
    program_->slot_count = slot_count;
    program_->replayable = replayable;
    if (!replayable) program_->steps.clear();
    return program_;
  }

 private:
  // The aten call op.overload(*args, **kwargs) as a step, the arguments at `slots` left to fill at replay.
  static AtenStep call(const std::string& name, const std::string& overload, const py::tuple& args,
                       const py::dict& kwargs, const std::vector<std::pair<size_t, int>>& slots, bool grad_mode) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    const auto& schema = op.schema();
    // A number passed for a Tensor (x.mul_(3.0)) reaches a dispatch mode as the number; the dispatcher takes
    // it as a wrapped-number tensor, which type promotion treats as a Python scalar.
    py::list values(args);
    for (size_t i = 0; i < values.size() && i < schema.arguments().size(); ++i) {
      if (schema.arguments()[i].type()->kind() != c10::TypeKind::TensorType) continue;
      py::handle v = values[i];
      std::optional<at::Scalar> number;
      if (py::isinstance<py::bool_>(v)) number = at::Scalar(v.cast<bool>());
      else if (py::isinstance<py::int_>(v)) number = at::Scalar(v.cast<int64_t>());
      else if (py::isinstance<py::float_>(v)) number = at::Scalar(v.cast<double>());
      if (number) {
        at::Tensor wrapped = c10::scalar_to_tensor(*number);
        wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
        values[i] = py::cast(wrapped);
      }
    }
    py::kwargs keywords = py::reinterpret_borrow<py::kwargs>(kwargs);
    auto stack = torch::jit::createStackForSchema(schema, torch::jit::tuple_slice(py::tuple(values)), keywords,
                                                  std::nullopt);
    for (const auto& [position, slot] : slots) {
      TORCH_CHECK(position < stack.size(), "roofline: argument position out of range");
      stack[position] = at::Tensor();   // not held by the program: the slot's tensor goes here at replay
    }
    return AtenStep{op, std::move(stack), slots, schema.returns().size(), grad_mode};
  }

  std::shared_ptr<Program> program_;
};

// ----------------------------------------------------------------------------------------------- the node

// An eager call's autograd node. `once`: its backward hands on, as gradients, tensors it saved (cross_entropy's
// gradient buffer, written by the forward and scaled in place): it lets go of them as it starts, so that autograd
// moves them into .grad instead of copying them (it copies a gradient something else still holds), and it runs
// only once.
struct EagerNode : ag::Node {
  EagerNode(const std::string* name, std::shared_ptr<Programs> programs, std::shared_ptr<PythonReference> backward,
            std::shared_ptr<PythonReference> context, bool once)
      : name_(name), programs_(std::move(programs)), backward_(std::move(backward)),
        context_(std::move(context)), once_(once) {}

  std::string name() const override { return *name_; }

  void reserve(size_t saved) { saved_.reserve(saved); }
  void save(const at::Tensor& tensor, bool is_output) { saved_.emplace_back(tensor, is_output); }

  ag::variable_list apply(ag::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!released_ || !once_, "roofline: ", *name_, " hands on as gradients the buffers its forward wrote, "
                "and so runs once: a second backward through the same forward (retain_graph=True) is not "
                "supported; use backend='torch' for that");
    TORCH_CHECK(!released_, "roofline: ", *name_, " was already run and its saved tensors freed; call backward "
                "with retain_graph=True to run it twice");
    ag::variable_list saved;
    saved.reserve(saved_.size());
    for (const auto& s : saved_) saved.push_back(s.unpack(pointer_to(this)));
    if (once_) {
      for (auto& s : saved_) s.reset_data();
      released_ = true;
    }
    // grad mode on (create_graph=True) or a dispatch mode active: the Python backward, which they can see
    bool plain = !at::GradMode::is_enabled() && c10::impl::TorchDispatchModeTLS::stack_len() == 0;
    auto program = plain ? programs_->find(saved, grads) : nullptr;
    if (program && program->replayable) {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
      try {
        return program->run(std::move(saved), grads);
      } catch (py::error_already_set& e) {   // from a host step (the targets' check raising)
        py::gil_scoped_acquire gil;
        throw_as_python_error(e);
      }
    }
    return run_python(saved, grads, plain && !program);
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved_) s.reset_data();
    released_ = true;
  }

 private:
  // `record`: record what the backward does into programs_ (this signature has no program yet)
  ag::variable_list run_python(const ag::variable_list& saved, const ag::variable_list& grads, bool record) {
    py::gil_scoped_acquire gil;
    try {
      py::tuple saved_tuple(saved.size()), grads_tuple(grads.size());
      for (size_t i = 0; i < saved.size(); ++i) saved_tuple[i] = optional_tensor(saved[i]);
      for (size_t i = 0; i < grads.size(); ++i) grads_tuple[i] = optional_tensor(grads[i]);
      py::object programs = record ? py::cast(programs_) : py::none();
      py::object result = backward_->object(context_->object, saved_tuple, grads_tuple, programs);
      ag::variable_list out;
      for (py::handle g : result) out.push_back(g.is_none() ? at::Tensor() : g.cast<at::Tensor>());
      TORCH_CHECK(out.size() == num_outputs(), "roofline: ", *name_, " returned ", out.size(),
                  " gradients for ", num_outputs(), " inputs");
      return out;
    } catch (py::error_already_set& e) {
      throw_as_python_error(e);
    }
  }

  // A Python exception raised on an engine thread, as autograd hands it back to the caller: as itself (a
  // ValueError stays a ValueError). Holds the GIL.
  [[noreturn]] static void throw_as_python_error(py::error_already_set& e) {
    e.restore();
    python_error error;
    error.persist();
    throw error;
  }

  static py::object optional_tensor(const at::Tensor& t) {
    return t.defined() ? py::cast(t) : py::none();
  }

  const std::string* name_;   // interned
  std::shared_ptr<Programs> programs_;
  std::shared_ptr<PythonReference> backward_, context_;   // shared by the nodes a recorded forward makes
  std::vector<ag::SavedVariable> saved_;
  bool once_;
  bool released_ = false;
};

// The tensors of a tuple or list (undefined for what is not a tensor), or of one tensor: unpacked without
// pybind11's casters, which cost microseconds a call here.
std::vector<at::Tensor> tensors_of(py::handle objects) {
  std::vector<at::Tensor> tensors;
  if (THPVariable_Check(objects.ptr())) {
    tensors.push_back(THPVariable_Unpack(objects.ptr()));
    return tensors;
  }
  py::sequence sequence = py::reinterpret_borrow<py::sequence>(objects);
  tensors.reserve(sequence.size());
  for (py::handle o : sequence) {
    tensors.push_back(THPVariable_Check(o.ptr()) ? THPVariable_Unpack(o.ptr()) : at::Tensor());
  }
  return tensors;
}

// Makes `outputs` (undefined for absent ones) the results of a new EagerNode whose inputs are the forward's `inputs`
// (an edge per argument, none where it is not a tensor), saving `saved`. Outputs in `non_differentiable` get no
// gradient, as ctx.mark_non_differentiable says in a torch.autograd.Function. sequence_nr: the autograd sequence
// number the forward's ForwardRecord was given (-1: the node takes the next).
void attach_node(const std::string* name, std::shared_ptr<Programs> programs, std::shared_ptr<PythonReference> backward,
                 std::shared_ptr<PythonReference> context, at::ArrayRef<at::Tensor> inputs,
                 at::ArrayRef<at::Tensor> outputs, at::ArrayRef<at::Tensor> non_differentiable,
                 at::ArrayRef<at::Tensor> saved, bool once, int64_t sequence_nr) {
  ag::edge_list edges;
  edges.reserve(inputs.size());
  for (const auto& t : inputs) {
    edges.push_back(t.defined() && t.requires_grad() ? ag::impl::gradient_edge(t) : ag::Edge());
  }
  auto node = make_node<EagerNode>(name, std::move(programs), std::move(backward), std::move(context), once);
  if (sequence_nr >= 0) node->set_sequence_nr(static_cast<uint64_t>(sequence_nr));
  node->set_next_edges(std::move(edges));
  auto among = [](const at::Tensor& t, at::ArrayRef<at::Tensor> tensors) {
    for (const auto& other : tensors)
      if (other.defined() && other.is_same(t)) return true;
    return false;
  };
  c10::SmallVector<at::Tensor, 4> differentiable;
  for (const auto& output : outputs) {
    if (output.defined() && ag::isDifferentiableType(output.scalar_type()) && !among(output, non_differentiable)) {
      auto nr = node->add_input_metadata(output);
      ag::impl::set_gradient_edge(output, ag::Edge(node, nr));
      differentiable.push_back(output);
    } else {
      node->add_input_metadata(ag::Node::undefined_input());
    }
  }
  // after the outputs have their grad_fn: a saved output holds the node weakly (no reference cycle)
  auto* eager = static_cast<EagerNode*>(node.get());
  eager->reserve(saved.size());
  for (const auto& t : saved) {
    eager->save(t, t.defined() && among(t, differentiable));
  }
}

// attach_node from Python: args and outputs a tensor or a tuple (None for absent ones).
void attach(const std::string& name, std::shared_ptr<Programs> programs, py::object backward, py::object context,
            py::handle args, py::handle outputs, py::handle non_differentiable, py::handle saved, bool once,
            int64_t sequence_nr) {
  attach_node(interned(name), std::move(programs), std::make_shared<PythonReference>(std::move(backward)),
              std::make_shared<PythonReference>(std::move(context)), tensors_of(args), tensors_of(outputs),
              tensors_of(non_differentiable), tensors_of(saved), once, sequence_nr);
}

// A recorded forward's AttachStep, replayed over its slots (in small vectors: a replay allocates nothing for
// them).
void attach_step(const AttachStep& step, const std::vector<at::Tensor>& slots) {
  using Tensors = c10::SmallVector<at::Tensor, 4>;
  auto fill = [&slots](const std::vector<int>& indices, Tensors& tensors) {
    for (int slot : indices) tensors.push_back(slot < 0 ? at::Tensor() : slots[slot]);
  };
  Tensors inputs, outputs, non_differentiable, saved;
  fill(step.inputs, inputs);
  fill(step.outputs, outputs);
  fill(step.non_differentiable, non_differentiable);
  fill(step.saved, saved);
  attach_node(step.name, step.programs, step.backward, step.context, inputs, outputs, non_differentiable, saved,
              step.once, -1);
}

// An eager forward as the profiler sees an aten op: a record under the op's own name, with its inputs (their
// shapes, where shapes are recorded) and the sequence number of the backward node it makes, which links the
// two in a trace. Made only while a profiler runs; end() closes it.
class ForwardRecord {
 public:
  ForwardRecord(const std::string& name, py::handle args, int64_t sequence_nr) : record_(at::RecordScope::FUNCTION) {
    if (!record_.isActive()) return;
    if (record_.needsInputs()) {
      for (py::handle o : py::reinterpret_borrow<py::sequence>(args)) inputs_.push_back(input_of(o));
    }
    record_.before(name.c_str(), &inputs_, sequence_nr);
  }
  void end() { record_.end(); }

 private:
  // a tensor, or a number the cost of the op may depend on (causal, a flag), as the profiler records inputs
  static c10::IValue input_of(py::handle o) {
    if (THPVariable_Check(o.ptr())) return THPVariable_Unpack(o.ptr());
    if (PyBool_Check(o.ptr())) return o.ptr() == Py_True;
    if (PyLong_Check(o.ptr())) {
      long long value = PyLong_AsLongLong(o.ptr());
      if (value == -1 && PyErr_Occurred()) {   // beyond 64 bits: not a number a cost depends on
        PyErr_Clear();
        return c10::IValue();
      }
      return static_cast<int64_t>(value);
    }
    if (PyFloat_Check(o.ptr())) return PyFloat_AsDouble(o.ptr());
    return c10::IValue();
  }

  std::vector<c10::IValue> inputs_;   // the record refers to them until it ends
  at::RecordFunction record_;
};

// ----------------------------------------------------------------------------------------------- launches from Python

// A compiled kernel that roofline/ops/_launch.py's Launch calls through cuLaunchKernel itself, where the kernel takes
// no tensor descriptor. Triton's generated launcher does more on each call: it parses a format string over all its
// arguments, unpacks the kernel's metadata and asks the driver about every pointer (cuPointerGetAttribute). A
// plan fixes all but the arguments' values, once.
struct PythonLaunch {
  void* function;
  unsigned grid[3];
  unsigned block, shared;
  std::string kinds;   // per runtime argument: 'p' a pointer (a tensor, an int or None), a number's kind, '-' none
  c10::DeviceIndex device;
};

constexpr const char* kPythonLaunch = "roofline.PythonLaunch";

// The pointer argument `o` (argument `i` of the kernel): a tensor the kernel's device can reach (on that device, or
// pinned host memory), an address, or None. False with a Python error set otherwise.
bool pointer_of(PyObject* o, size_t i, c10::DeviceIndex device, uint64_t* pointer) {
  *pointer = 0;
  if (THPVariable_Check(o)) {
    const at::Tensor& t = THPVariable_Unpack(o);
    // (pinned asked of the context, not by Tensor::is_pinned: that goes through the dispatcher, where a recording's
    // dispatch mode would see it)
    if (t.is_cuda() ? t.device().index() != device
                    : !at::globalContext().isPinnedPtr(t.storage().data(), c10::DeviceType::CUDA)) {
      PyErr_Format(PyExc_ValueError, "roofline: argument %zu of a kernel launch on cuda:%d is a tensor on %s%s",
                   i, static_cast<int>(device), t.device().str().c_str(), t.is_cuda() ? "" : " (not pinned)");
      return false;
    }
    *pointer = reinterpret_cast<uint64_t>(t.data_ptr());
  } else if (PyLong_Check(o)) {
    *pointer = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) return false;
  } else if (o != Py_None) {
    PyErr_Format(PyExc_TypeError, "roofline: argument %zu of a kernel launch must be a tensor, got %s", i,
                 Py_TYPE(o)->tp_name);
    return false;
  }
  return true;
}

// launch(spec, *args): the kernel of `spec` (python_launch) on its grid with these runtime arguments, on the current
// stream of its device. METH_FASTCALL: the arguments come as an array, with no tuple made.
PyObject* launch_from_python(PyObject*, PyObject* const* args, Py_ssize_t count) {
  try {
    const auto* spec = count > 0 ? static_cast<const PythonLaunch*>(PyCapsule_GetPointer(args[0], kPythonLaunch))
                                 : nullptr;
    if (spec == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "roofline: launch(spec, *args) takes a spec first");
      return nullptr;
    }
    const size_t arguments = static_cast<size_t>(count - 1);
    if (arguments != spec->kinds.size()) {
      PyErr_Format(PyExc_TypeError, "roofline: the kernel takes %zu arguments, got %zu", spec->kinds.size(),
                   arguments);
      return nullptr;
    }
    if (static_cast<uint64_t>(spec->grid[0]) * spec->grid[1] * spec->grid[2] == 0) Py_RETURN_NONE;   // as Triton
    uint64_t values[kMaxArguments + 2] = {};   // + Triton's two scratch pointers (null)
    void* params[kMaxArguments + 2];
    size_t n = 0;
    for (size_t i = 0; i < arguments; ++i) {
      const char kind = spec->kinds[i];
      PyObject* o = args[i + 1];
      if (kind == '-') continue;
      if (kind == 'p') {
        uint64_t pointer;
        if (!pointer_of(o, i, spec->device, &pointer)) return nullptr;
        std::memcpy(&values[n], &pointer, 8);
      } else if (kind == 'f' || kind == 'd') {
        double real = PyFloat_AsDouble(o);
        if (real == -1.0 && PyErr_Occurred()) return nullptr;
        pack_number(kind, 0, real, &values[n]);
      } else {
        long long integer = PyLong_AsLongLong(o);
        if (integer == -1 && PyErr_Occurred()) return nullptr;
        pack_number(kind, integer, 0.0, &values[n]);
      }
      params[n] = &values[n];
      ++n;
    }
    params[n] = &values[n];
    params[n + 1] = &values[n + 1];
    const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Device current = cuda->getDevice();
    if (current.index() == spec->device) {
      launch_on_current_stream(spec->function, spec->grid, spec->block, spec->shared, params);
    } else {   // the kernel is loaded in its device's context: launched there
      cuda->setDevice(c10::Device(c10::DeviceType::CUDA, spec->device));
      try {
        launch_on_current_stream(spec->function, spec->grid, spec->block, spec->shared, params);
      } catch (...) {
        cuda->setDevice(current);
        throw;
      }
      cuda->setDevice(current);
    }
    Py_RETURN_NONE;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyMethodDef launch_method = {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(
                                           &launch_from_python)),
                             METH_FASTCALL, "launch(spec, *args): a compiled kernel launched with cuLaunchKernel"};

// ----------------------------------------------------------------------------------------------- routes' keys

// A tuple of `values`' items, each an int (a tensor's sizes or strides), or nullptr with a Python error set.
PyObject* int_tuple(c10::IntArrayRef values) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* item = PyLong_FromLongLong(values[i]);
    if (item == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), item);
  }
  return tuple;
}

// Appends what a route's key holds of one argument to `key` (a list): a tensor's sizes, strides, dtype and device
// (and whether it requires grad, into `grad`), a list as a tuple, anything else as it is. False on a Python error.
bool append_to_key(PyObject* key, PyObject* value, bool* grad) {
  PyObject* items[4] = {nullptr, nullptr, nullptr, nullptr};
  size_t count = 1;
  if (THPVariable_Check(value)) {
    const at::Tensor& t = THPVariable_Unpack(value);
    *grad = *grad || t.requires_grad();
    PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    Py_INCREF(dtype);
    if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {   // (symbolic ints: as Python gives them)
      items[0] = PyObject_GetAttrString(value, "shape");
      items[1] = PyObject_CallMethod(value, "stride", nullptr);
    } else {
      items[0] = int_tuple(t.sizes());
      items[1] = int_tuple(t.strides());
    }
    items[2] = dtype;
    items[3] = THPDevice_New(t.device());
    count = 4;
  } else if (PyList_Check(value)) {
    items[0] = PyList_AsTuple(value);
  } else {
    Py_INCREF(value);
    items[0] = value;
  }
  bool ok = true;
  for (size_t i = 0; i < count; ++i) ok = ok && items[i] != nullptr && PyList_Append(key, items[i]) == 0;
  for (size_t i = 0; i < count; ++i) Py_XDECREF(items[i]);
  return ok;
}

// route_key(op, args, kwargs, autocast): roofline/routing.py's _key built in C++, where a patched program pays it on
// every call: (op, whether a gradient is wanted, autocast, then per argument, positional then keyword, a tensor's
// sizes, strides, dtype and device, or a list as a tuple, or the value; then the keywords' names, if any).
PyObject* route_key_of(PyObject* const* args, Py_ssize_t count) {
  if (count != 4 || !(PyTuple_Check(args[1]) || PyList_Check(args[1])) ||
      !(args[2] == Py_None || PyDict_Check(args[2]))) {
    PyErr_SetString(PyExc_TypeError,
                    "roofline: route_key(op, args: tuple | list, kwargs: dict | None, autocast: bool)");
    return nullptr;
  }
  PyObject* key = PyList_New(0);
  if (key == nullptr) return nullptr;
  bool grad = false;
  bool ok = PyList_Append(key, args[0]) == 0 && PyList_Append(key, Py_False) == 0 &&
            PyList_Append(key, args[3]) == 0;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(args[1]); ++i) {   // a tuple or a list
    ok = append_to_key(key, PySequence_Fast_GET_ITEM(args[1], i), &grad);
  }
  if (ok && args[2] != Py_None && PyDict_GET_SIZE(args[2]) > 0) {
    PyObject *name, *value;
    Py_ssize_t position = 0;
    while (ok && PyDict_Next(args[2], &position, &name, &value)) ok = append_to_key(key, value, &grad);
    PyObject* names = ok ? PySequence_Tuple(args[2]) : nullptr;
    ok = names != nullptr && PyList_Append(key, names) == 0;
    Py_XDECREF(names);
  }
  if (!ok) {
    Py_DECREF(key);
    return nullptr;
  }
  PyObject* wanted = grad && at::GradMode::is_enabled() ? Py_True : Py_False;
  Py_INCREF(wanted);
  PyList_SetItem(key, 1, wanted);   // steals wanted, releases the False it replaces
  PyObject* tuple = PyList_AsTuple(key);
  Py_DECREF(key);
  return tuple;
}

PyObject* route_key(PyObject*, PyObject* const* args, Py_ssize_t count) {
  try {
    return route_key_of(args, count);
  } catch (const std::exception& e) {   // (a C++ error must not cross into Python's C API)
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyMethodDef route_key_method = {"route_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(
                                                 &route_key)),
                                METH_FASTCALL, "route_key(op, args, kwargs, autocast): a route's key for a call"};

// The spec `launch` takes: a compiled kernel (its CUfunction), grid, threads a block, shared memory bytes and its
// runtime arguments' kinds ('p', 'b', 'h', 'i', 'l', 'f', 'd', '-'), on CUDA device `device`.
py::object python_launch(uint64_t function, std::vector<unsigned> grid, unsigned block, unsigned shared,
                         const std::string& kinds, int device) {
  TORCH_CHECK(grid.size() == 3 && kinds.size() <= kMaxArguments &&
                  kinds.find_first_not_of("pbhilfd-") == std::string::npos,
              "roofline: python_launch takes a grid of 3 and at most ", kMaxArguments,
              " arguments of kinds 'pbhilfd-', got kinds '", kinds, "'");
  auto* spec = new PythonLaunch{reinterpret_cast<void*>(function), {grid[0], grid[1], grid[2]}, block, shared,
                                kinds, static_cast<c10::DeviceIndex>(device)};
  PyObject* capsule = PyCapsule_New(spec, kPythonLaunch, [](PyObject* o) {
    delete static_cast<PythonLaunch*>(PyCapsule_GetPointer(o, kPythonLaunch));
  });
  if (capsule == nullptr) {
    delete spec;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Programs, std::shared_ptr<Programs>>(m, "Programs")
      .def(py::init<>())
      .def("full", &Programs::full)
      .def("add", &Programs::add);
  py::class_<Program, std::shared_ptr<Program>>(m, "Program");
  py::class_<ForwardPrograms, std::shared_ptr<ForwardPrograms>>(m, "ForwardPrograms")
      .def(py::init<bool>(), py::arg("entry") = false)
      .def_readonly_static("limit", &ForwardPrograms::kLimit)
      .def_readonly_static("waste_limit", &ForwardPrograms::kWasteLimit)
      .def("size", &ForwardPrograms::size)
      .def("full", &ForwardPrograms::full)
      .def("add", &ForwardPrograms::add)
      .def("replayed", &ForwardPrograms::replayed)
      .def("replayer", &replayer);
  py::class_<ProgramBuilder>(m, "ProgramBuilder")
      .def(py::init<const std::vector<std::optional<at::Tensor>>&>())
      .def("aten", &ProgramBuilder::aten)
      .def("allocate", &ProgramBuilder::allocate)
      .def("launch", &ProgramBuilder::launch)
      .def("attach", &ProgramBuilder::attach)
      .def("host", &ProgramBuilder::host)
      .def("finish", &ProgramBuilder::finish);
  m.def("attach", &attach);
  m.def("python_launch", &python_launch);
  m.add_object("launch", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&launch_method, nullptr, nullptr)));
  m.add_object("route_key",
               py::reinterpret_steal<py::object>(PyCFunction_NewEx(&route_key_method, nullptr, nullptr)));
  m.def("reserve_sequence_number", [] { return static_cast<int64_t>(at::sequence_number::get_and_increment()); });
  py::class_<ForwardRecord>(m, "ForwardRecord")
      .def(py::init<const std::string&, py::handle, int64_t>())
      .def("end", &ForwardRecord::end);
}
