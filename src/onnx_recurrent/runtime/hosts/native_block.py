"""The words of a native node's kernel block, shared by the two halves of the native
nodes: :mod:`.native` (Python, which fills a block per node) and
:mod:`.native_compute` (compiled, which reads it at each call).
"""

# the kernel block's words
API, PLAN0, PLAN1, D, REVERSE, LAYOUT, HIDDEN, INPUT, FAST, SLOW = range(10)
ABORT, SYNC, CALLS, OUTPUTS, ZERO_STATES, INTERRUPTED, STATES, FUNCTIONS = range(10, 18)
# PARALLEL: multiply-adds of a call from which it runs on threads (0: never); GATES:
# gates * hidden_size; SLICES: slices of the batch a large call is cut into; TASK: the
# address of the ParallelFor callback (:func:`.native.compiled_address`)
PARALLEL, GATES, SLICES, TASK = 18, 19, 20, 21
# FAILED: the address of the message of a call that failed (no memory)
FAILED = 22
# DERIVED: for a node whose weights come per call, the address of the block made for
# the weights its Python path last prepared (0: none); that block's WEIGHTS: the
# address of their descriptors, WEIGHT_WORDS words for each input of WEIGHT_INPUTS
# (:func:`.native_compute.same_weights`)
DERIVED, WEIGHTS = 23, 24
WORDS = 25
#: the inputs W, R, B, P by position; a descriptor's words: the address of the layer's
#: copy (0: the input absent), its bytes, the input's dimension count and its dims (up
#: to WEIGHT_DIMS)
WEIGHT_INPUTS = (1, 2, 3, 7)
WEIGHT_DIMS = 3
WEIGHT_WORDS = 3 + WEIGHT_DIMS
# a large call's words (``usr_data`` of KernelContext_ParallelFor); T_FLAGS: the call's
# flags (:mod:`onnx_recurrent.backends.node`); T_SLICES: units of rows a direction is
# cut into; T_ORDER: 0 (slices of the batch in its order) or the address of the rows
# sorted by length, longest first (cut into buckets by ``scan.bucket_bounds``)
(T_KERNEL, T_X, T_D0, T_D1, T_LENS, T_H0, T_C0, T_Y, T_YH, T_YC, T_FLAGS, T_N, T_T,
 T_SLICES, T_ORDER, T_RESULTS) = range(16)  # fmt: skip
# FUNCTIONS: the address of the OrtApi functions used, in this order
(CREATE_STATUS, GET_INPUT_COUNT, GET_INPUT, GET_OUTPUT, GET_DATA, GET_TYPE_AND_SHAPE,
 GET_DIMENSIONS_COUNT, GET_DIMENSIONS, RELEASE_TYPE_AND_SHAPE, PARALLEL_FOR,
 SHAPE_REFERENCE, RELEASE_STATUS) = range(12)  # fmt: skip
FUNCTION_NAMES = (
    "CreateStatus",
    "KernelContext_GetInputCount",
    "KernelContext_GetInput",
    "KernelContext_GetOutput",
    "GetTensorMutableData",
    "GetTensorTypeAndShape",
    "GetDimensionsCount",
    "GetDimensions",
    "ReleaseTensorTypeAndShapeInfo",
    "KernelContext_ParallelFor",
    "GetTensorElementTypeAndShapeDataReference",  # 0 before onnxruntime 1.24
    "ReleaseStatus",
)
#: hidden units from which a large one-row call runs on the pool, its threads sharing
#: the units (faster-whisper's Silero, H=128, 312 steps: 19.0 ms on the pool, 18.7 ms on
#: one thread, while onnxruntime's own threads still spin: more threads than cores)
SHARE_HIDDEN = 256
