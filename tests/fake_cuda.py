"""DLPack tensors that claim a CUDA device over host memory, for calling exported CUDA functions on a machine without
a GPU up to their argument checks: a refusal that comes before any CUDA call (and reads no data) is testable here.
Call only what must be refused: a call that passes its checks would go on to launch kernels."""
from __future__ import annotations

import ctypes

import numpy as np

_KDLCUDA = 2
_CODES = {"float": 2, "int": 0, "uint": 1, "bfloat": 4}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


_ALIVE: list = []  # the fakes' memory outlives every tvm tensor made from them (no deleter is called)


class _Fake:
    def __init__(self, shape, dtype: str, device_id: int, strides):
        dt = np.dtype(dtype) if dtype != "bfloat16" else None
        code = _CODES["bfloat"] if dt is None else _CODES[{"f": "float", "i": "int", "u": "uint"}[dt.kind]]
        bits = 16 if dt is None else dt.itemsize * 8
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(shape))(*strides)
        self.buffer = ctypes.create_string_buffer(max(1, int(np.prod(shape))) * bits // 8)  # never read
        self.managed = _Managed()
        t = self.managed.dl_tensor
        t.data = ctypes.cast(self.buffer, ctypes.c_void_p)
        t.device = _Device(_KDLCUDA, device_id)
        t.ndim = len(shape)
        t.dtype = _DType(code, bits, 1)
        t.shape = self.shape
        t.strides = self.strides
        t.byte_offset = 0
        self.managed.deleter = ctypes.cast(None, _DELETER)
        self.device_id = device_id

    def __dlpack_device__(self):
        return (_KDLCUDA, self.device_id)

    def __dlpack__(self, stream=None, **_):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)


def fake_cuda(shape, dtype: str = "float32", device_id: int = 0, strides=None):
    """A tvm-ffi tensor of ``shape`` and ``dtype`` on cuda:``device_id`` (to its callee) over zeroed host memory."""
    import tvm_ffi

    fake = _Fake(tuple(shape), dtype, device_id, strides)
    _ALIVE.append(fake)
    return tvm_ffi.from_dlpack(fake)
