"""Units used across aisim, said once.

GB means 1e9 bytes and GiB 2**30 bytes; TFLOP/s means 1e12 FLOP/s. Every field and variable carries its unit
in its name (``latency_s``, ``hbm_bw_bytes_per_s``, ``memory_bytes``). One FLOP convention: a multiply-add is
2 FLOPs (as torch.utils.flop_counter; fvcore counts it as 1).
"""

GB = 1e9
GiB = 2**30
MB = 1e6
MiB = 2**20
TFLOP = 1e12
MS_PER_S = 1e3
US_PER_S = 1e6
FLOPS_PER_MAC = 2

# The one dtype table: bytes per element of every dtype aisim names (compute dtypes, index and flag tensors,
# weight-only quantization widths), and the torch dtype each compute dtype is built with.
DTYPE_BYTES = {
    "fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "mxfp4": 0.53125,
    "int64": 8, "int32": 4, "int16": 2, "uint8": 1, "bool": 1, "c64": 8,
}
TORCH_DTYPE_NAMES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# torch dtype (str(tensor.dtype)) -> aisim name
FROM_TORCH_DTYPE = {
    "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float64": "fp64",
    "torch.int64": "int64", "torch.int32": "int32", "torch.int8": "int8", "torch.uint8": "uint8",
    "torch.bool": "bool", "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "torch.int16": "int16",
    "torch.complex64": "c64",
}
