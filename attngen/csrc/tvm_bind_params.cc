// A model library's binding of a variant's tensor parameters to its cache's attention functions
// (attngen/tvm/bind_params.py compiles this file once per cache prefix and links it into the model).
//
// The exported function (its name: ATTNGEN_BIND_EXPORT, e.g. attngen_bind_tensor_params, exported as
// __tvm_ffi_<name>) takes an attention function and the tensor parameters' values (constants of the model,
// host tensors) and returns a function that calls the attention function with its own arguments followed by
// the tensors, each on the device of the call's first tensor argument: the tensor itself where it lives
// there, else a copy made at the first call on that device and kept for the next ones (the values are
// constants). The create call of the model's cache passes the returned functions in TVM's attention slots,
// whose argument lists carry no variant parameters; the attention functions check the tensors per call.
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#ifndef ATTNGEN_BIND_EXPORT
#error "define ATTNGEN_BIND_EXPORT: the name the binding function is exported as"
#endif

namespace {

namespace ffi = tvm::ffi;

class BoundTensors {
 public:
  BoundTensors(ffi::Function fn, ffi::Array<ffi::Tensor> tensors) : fn_(std::move(fn)) {
    for (const ffi::Tensor& t : tensors) host_.push_back(t);
  }

  void call(ffi::PackedArgs args, ffi::Any* rv) {
    DLDevice device{kDLCPU, 0};
    for (int i = 0; i < args.size(); ++i) {
      if (std::optional<ffi::Tensor> t = args[i].try_cast<ffi::Tensor>()) {
        device = t->device();
        break;
      }
    }
    const std::vector<ffi::Tensor>& tensors = on(device);
    std::vector<ffi::AnyView> all(args.data(), args.data() + args.size());
    for (const ffi::Tensor& t : tensors) all.emplace_back(t);
    fn_.CallPacked(all.data(), static_cast<int32_t>(all.size()), rv);
  }

 private:
  // the tensors on `device`, copied there at the first call that needs them
  const std::vector<ffi::Tensor>& on(DLDevice device) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::pair<int, int> key{static_cast<int>(device.device_type), device.device_id};
    auto found = copies_.find(key);
    if (found != copies_.end()) return found->second;
    std::vector<ffi::Tensor> out;
    for (const ffi::Tensor& t : host_) {
      if (t.device().device_type == device.device_type && t.device().device_id == device.device_id) {
        out.push_back(t);
        continue;
      }
      static const ffi::Function alloc = ffi::Function::GetGlobalRequired("runtime.TVMTensorAllocWithScope");
      static const ffi::Function copy = ffi::Function::GetGlobalRequired("runtime.TVMTensorCopyFromTo");
      const ffi::Shape shape(t.shape().begin(), t.shape().end());
      ffi::Tensor there = alloc(shape, t.dtype(), device, ffi::Optional<ffi::String>()).cast<ffi::Tensor>();
      copy(t, there);
      out.push_back(there);
    }
    return copies_.emplace(key, std::move(out)).first->second;
  }

  ffi::Function fn_;
  std::vector<ffi::Tensor> host_;
  std::mutex mu_;
  std::map<std::pair<int, int>, std::vector<ffi::Tensor>> copies_;
};

ffi::Function bind_tensor_params(ffi::Function fn, ffi::Array<ffi::Tensor> tensors) {
  auto state = std::make_shared<BoundTensors>(std::move(fn), std::move(tensors));
  return ffi::Function::FromPacked([state](ffi::PackedArgs args, ffi::Any* rv) { state->call(args, rv); });
}

}  // namespace

// (one level of indirection, so that the name macro expands before the export macro pastes it)
#define ATTNGEN_EXPORT_BINDING(name) TVM_FFI_DLL_EXPORT_TYPED_FUNC(name, bind_tensor_params)
ATTNGEN_EXPORT_BINDING(ATTNGEN_BIND_EXPORT)
