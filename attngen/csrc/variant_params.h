// A variant's extra parameters across the FFI. The generated traits (codegen/cuda_variant.py) declare
// the FFI types of the parameters, in declaration order, and how they fill the kernels' Params:
//
//   using ExtraArgs = attngen::ArgList<double, tvm::ffi::TensorView>;
//   static void set_params(const char* entry, Params& p, double soft_cap, tvm::ffi::TensorView slopes);
//
// Scalar parameters arrive as int64_t or double, tensor parameters as TensorView. The entry templates
// (entry_decode.h, entry_prefill.h) are specialised over ArgList<X...> so that each exported function
// takes `X... extra` after its own arguments, typed, and hands them to set_params.
#pragma once
#include "ffi_glue.h"

namespace attngen {

template <class... X>
struct ArgList {};

// A tensor parameter's data pointer, once its element type, rank and device are the declared ones and its
// layout is compact (a hook indexes it by its declared shape alone, whatever its element type).
template <class Elem>
Elem* tensor_param(const char* entry, const char* name, const tvm::ffi::TensorView& t, int ndim) {
  check_args(entry, {{name, t, ndim, dl_dtype<Elem>()}});
  if (!t.IsContiguous())
    ATTNGEN_THROW(ValueError) << entry << ": " << name << ": must be contiguous (a hook reads it by its declared "
                              << "shape)";
  return static_cast<Elem*>(data_of(t));
}

}  // namespace attngen
