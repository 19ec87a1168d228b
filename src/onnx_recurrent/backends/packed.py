"""Matrix products of the numba kernels, on a right-hand matrix packed once per layer.

``C = A B`` where ``B`` (``W^T`` or ``R^T``: constant for the whole call) is packed by
:func:`.layout.panels` into column panels ``[panels, K, L]``: ``L`` columns, two SIMD vectors,
contiguous for each ``k``, zero-padded. :func:`mm` runs a micro-kernel written in LLVM
IR over them: a tile of ``R`` rows by ``L`` columns over the whole ``K``, its
``2 R`` vector accumulators in registers, one broadcast of ``A`` and two fused
multiply-adds per row and ``k``; ``R``, and the panels a tile of one or two rows spans,
are measured on the running CPU (:mod:`.tuning`). ``A`` may be two matrices side by side, ``[Xt,
Ht-1]``, so that a step's input and recurrent products are one.

Why not BLAS: a BLAS ``gemm`` packs ``B`` again at every call, i.e. at every time step.
On one Zen 4 core, at the per-step shapes (``[32, 256] x [256, 384..1024]``, float32),
this kernel runs at 57 GMAC/s where NumPy's OpenBLAS runs at 32-43; at the input
projection's shapes at 48-55 against 42-52. It needs no library: only numba.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.extending import intrinsic

from . import layout
from .jit_cache import jit

#: tile rows the planner chooses from (:mod:`.tuning`): ``2 R`` accumulators, two
#: vectors of ``B`` and a broadcast fit the registers (AVX-512: 32, else 16)
ROWS = (4, 6, 8, 12) if layout.VECTOR_BYTES == 64 else (4, 6)
#: rows of ``B`` that every row tile reads in one pass (0: all): a block of a panel
#: stays in cache between the tiles
DEPTHS = (0, 128, 256, 512)
#: panels a tile of one or two rows may span (more accumulators: a product of one row
#: is otherwise bound by the latency of its two chains of fused multiply-adds)
SPANS = (1, 2, 4)
ALIGN = layout.ALIGN

_jit = jit(nogil=True)


def _tile_of(R: int, G: int = 1):
    """The micro-kernel for tiles of up to ``R`` rows by ``G`` panels (an intrinsic)."""

    @intrinsic
    def tile(typingctx, A, lda, K1, A2, lda2, K2, mr, Bp, offset, C, ldc, bias, add):
        """``C[:mr, :G L] = start + [A[:mr, :K1], A2[:mr, :K2]] B`` for the panel rows
        ``Bp.flat[offset + g K L:][:(K1 + K2) L]`` of panels ``g < G`` (``K``: the
        panels' rows), ``mr <= R``; ``start``: ``C`` itself if ``add``, else ``bias``
        (``G L`` values; 0: zeros). ``A``, ``A2``, ``C``, ``bias``: addresses of
        row-major matrices with row strides ``lda``, ``lda2``, ``ldc`` elements. Rows
        past ``mr`` compute row 0 again and are not stored."""
        if not isinstance(Bp, types.Array) or not isinstance(Bp.dtype, types.Float):
            return None
        i64 = types.int64
        args = (i64, i64, i64, i64, i64, i64, i64, Bp, i64, i64, i64, i64, types.boolean)
        return types.void(*args), _codegen(R, G)

    return tile


def _codegen(R: int, G: int):
    def codegen(context, builder, signature, args):
        A_, lda_, K1_, A2_, lda2_, K2_, mr_, Bp_, offset_, C_, ldc_, bias_, add_ = args
        Bp = signature.args[7]
        i32, i64 = ir.IntType(32), ir.IntType(64)
        size = Bp.dtype.bitwidth // 8
        real = ir.FloatType() if size == 4 else ir.DoubleType()
        lanes = layout.VECTOR_BYTES // size
        vector = ir.VectorType(real, lanes)
        V = 2 * G  # vectors of a tile's row
        fma = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vector, [vector] * 3),
            f"llvm.fma.v{lanes}f{8 * size}",
        )

        def const(v):
            return ir.Constant(i64, v)

        def rows_of(address, stride):
            """Pointers to the tile's rows (rows past ``mr``: row 0)."""
            rows = []
            for r in range(R):
                used = builder.icmp_signed("<", const(r), mr_)
                row = builder.select(used, const(r), const(0))
                at = builder.add(address, builder.mul(row, builder.mul(stride, const(size))))
                rows.append(builder.inttoptr(at, real.as_pointer()))
            return rows

        def vector_at(row, v):
            """Vector ``v`` of a row of ``C``: panel ``v // 2``, half ``v % 2``."""
            return builder.bitcast(builder.gep(row, [const(v * lanes)]), vector.as_pointer())

        panel = context.make_array(Bp)(context, builder, Bp_)
        K, L = (builder.extract_value(panel.shape, i) for i in (1, 2))
        stride = builder.mul(K, L)  # elements of one panel
        B = [  # each panel's first vector at ``offset``
            builder.bitcast(
                builder.gep(panel.data, [builder.add(offset_, builder.mul(const(g), stride))]),
                vector.as_pointer(),
            )
            for g in range(G)
        ]
        start = [cgutils.alloca_once_value(builder, ir.Constant(vector, [0.0] * lanes))
                 for _ in range(V)]  # fmt: skip
        with builder.if_then(builder.icmp_unsigned("!=", bias_, const(0))):
            first = builder.inttoptr(bias_, vector.as_pointer())
            for v in range(V):
                builder.store(builder.load(builder.gep(first, [const(v)]), align=size), start[v])
        acc = [cgutils.alloca_once(builder, vector) for _ in range(V * R)]
        out = rows_of(C_, ldc_)
        with builder.if_else(add_) as (added, started):
            with added:
                for r in range(R):
                    for v in range(V):
                        at = vector_at(out[r], v)
                        builder.store(builder.load(at, align=size), acc[V * r + v])
            with started:
                for i, a in enumerate(acc):
                    builder.store(builder.load(start[i % V]), a)
        undef = ir.Constant(vector, ir.Undefined)
        splat = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
        for rows, first, count in (  # K1 panel rows times A, then K2 times A2
            (rows_of(A_, lda_), const(0), K1_),
            (rows_of(A2_, lda2_), K1_, K2_),
        ):
            with cgutils.for_range(builder, count) as loop:
                k2 = builder.mul(builder.add(first, loop.index), const(2))
                at = [builder.add(k2, const(half)) for half in range(2)]
                b = [builder.load(builder.gep(B[v // 2], [at[v % 2]]), align=size)
                     for v in range(V)]  # fmt: skip
                for r in range(R):
                    a = builder.load(builder.gep(rows[r], [loop.index]))
                    a = builder.shuffle_vector(
                        builder.insert_element(undef, a, ir.Constant(i32, 0)), undef, splat
                    )
                    for v in range(V):
                        total = builder.call(fma, [a, b[v], builder.load(acc[V * r + v])])
                        builder.store(total, acc[V * r + v])
        for r in range(R):
            with builder.if_then(builder.icmp_signed("<", const(r), mr_)):
                for v in range(V):
                    builder.store(builder.load(acc[V * r + v]), vector_at(out[r], v), align=size)
        return context.get_dummy_value()

    return codegen


#: tiles by (rows, panels): the rows of :data:`ROWS` and the short tiles at the end
_t12, _t8, _t6, _t4, _t2, _t1 = (_tile_of(R) for R in (12, 8, 6, 4, 2, 1))
_t1x2, _t1x4, _t2x2, _t2x4 = (_tile_of(R, G) for R, G in ((1, 2), (1, 4), (2, 2), (2, 4)))


@_jit
def mm(A, lda, K1, A2, lda2, K2, n, Bp, p0, p1, k0, C, ldc, bias, add, rows, span, depth):
    """``C[:n, :(p1-p0) L] = start + [A[:n, :K1], A2[:n, :K2]] B[k0:k0 + K1 + K2, p0 L:p1 L]``
    for ``Bp`` = :func:`.layout.panels` of ``B`` (panels ``p0 .. p1-1``); ``start``: ``C`` itself
    if ``add``, else ``bias`` (the address of ``(p1-p0) L`` values; 0: zeros). ``A``,
    ``A2``, ``C``: addresses of row-major matrices (row strides ``lda``, ``lda2``,
    ``ldc`` elements; ``C``'s rows at least :func:`columns` long). Raw addresses: the
    caller checks its operands once (:func:`check`). Panel by panel, ``depth`` of its
    rows at a time (0: all), so that they stay in cache while every row tile reads
    them; tiles of up to ``rows`` rows (:data:`ROWS`); one or two rows (a product's,
    or those past its last whole tile) in tiles of ``span`` panels at once
    (:data:`SPANS`). Every element is the same sum in the same order (kept in ``C``
    between blocks: no rounding) whatever the tile and depth: results do not depend
    on ``rows``, ``span`` or ``depth``."""
    K, L = Bp.shape[1], Bp.shape[2]
    Kt = K1 + K2
    if p1 - p0 == 1 and 0 < n <= 2 and (depth <= 0 or depth >= Kt):  # one tile: a step's
        offset = (p0 * K + k0) * L  # product of a small layer, without the loops
        _tile(1, n, A, lda, K1, A2, lda2, K2, Bp, offset, C, ldc, bias, add)
        return
    rows = min(max(rows, 1), 12)
    # One or two rows (a product's, or those past its last whole tile) span G panels:
    # a tile of two accumulators a panel is bound by the latency of their chains. Past
    # the whole tiles, they follow those of the same panels, which are still in cache.
    tail = n if n <= 2 else n % rows if n % rows <= 2 else 0
    end = n - tail
    G = span if tail else 1
    size = Bp.itemsize
    block = depth if 0 < depth < Kt else max(Kt, 1)
    p = p0
    while p < p1:
        g = 4 if G >= 4 and p1 - p >= 4 else 2 if G >= 2 and p1 - p >= 2 else 1
        # pass j < g: the whole tiles of panel p + j; pass g: the tail over all g
        # (one loop, so that the tiles are inlined once: compile time)
        for j in range(0 if end > 0 else g, g + 1 if tail else g):
            q, r0, r1, gq = (p + j, 0, end, 1) if j < g else (p, end, n, g)
            b0 = bias + (q - p0) * L * size if bias != 0 else 0
            kb = 0
            while kb == 0 or kb < Kt:  # while loops: a range of a variable step may raise
                ke = min(Kt, kb + block)
                k1 = max(0, min(ke, K1) - kb)  # this block's rows from A, then from A2
                k2 = ke - kb - k1
                s1, s2 = min(kb, K1), max(0, kb - K1)
                offset = (q * K + k0 + kb) * L
                start, more = (b0, add) if kb == 0 else (0, True)
                b = r0
                while b < r1:
                    m = min(rows, r1 - b)
                    a, a2 = A + (b * lda + s1) * size, A2 + (b * lda2 + s2) * size
                    c = C + (b * ldc + (q - p0) * L) * size
                    _tile(gq, m, a, lda, k1, a2, lda2, k2, Bp, offset, c, ldc, start, more)
                    b += rows
                kb += block
        p += g


@jit(nogil=True, inline="always")
def _tile(g, m, a, lda, K1, a2, lda2, K2, Bp, offset, c, ldc, b0, add):
    """The tile for ``m`` rows by ``g`` panels (``g > 1``: ``m <= 2``)."""
    if g == 4:
        if m == 1:
            _t1x4(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
        else:
            _t2x4(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
    elif g == 2:
        if m == 1:
            _t1x2(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
        else:
            _t2x2(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
    elif m > 8:
        _t12(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
    elif m > 6:
        _t8(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
    elif m > 4:
        _t6(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
    elif m > 2:  # a short tile: fewer rows computed for nothing
        _t4(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
    elif m == 2:
        _t2(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)
    else:
        _t1(a, lda, K1, a2, lda2, K2, m, Bp, offset, c, ldc, b0, add)


@_jit
def check(Bp, K, bias, C, rows, panels):
    """Whether :func:`mm` may read ``K`` rows of the panels ``Bp`` and ``bias``, and
    write ``rows`` rows of ``panels`` panels into ``C``: ``Bp`` and ``C`` C-ordered and
    cache-line aligned where the tile loads vectors, widths whole panels (a result,
    not an exception: the native nodes' code never raises)."""
    L = Bp.shape[2]
    if Bp.shape[1] != K or Bp.ctypes.data % ALIGN != 0 or not Bp.flags.c_contiguous:
        return False
    if bias.shape[0] < Bp.shape[0] * L:
        return False
    return not (C.ndim >= 2 and (C.shape[C.ndim - 1] < panels * L or C.shape[C.ndim - 2] < rows))


@_jit
def time_mm(A, Bp, C, rows, span, depth, repeat):
    """``C = A B`` ``repeat`` times with tiles of ``rows``, ``span`` and ``depth`` (what
    :func:`.tuning.measure_tiles` times): ``A`` ``[n, K]`` C-ordered, ``Bp`` its
    panels, ``C`` ``[n, >= panels L]``."""
    n, K = A.shape
    P, L = Bp.shape[0], Bp.shape[2]
    if Bp.shape[1] != K or C.shape[0] < n or C.shape[1] < P * L:
        return
    if not (A.flags.c_contiguous and C.flags.c_contiguous and Bp.flags.c_contiguous):
        return
    for _ in range(repeat):
        mm(A.ctypes.data, K, K, A.ctypes.data, K, 0, n, Bp, 0, P, 0, C.ctypes.data,
           C.shape[1], 0, False, rows, span, depth)  # fmt: skip
