"""Model an LSTM row's cell update with llvm-mca: passes per gate against one pass.

The numba kernels update a share's rows either with a pass per gate and activation
(clip, scale, tanh, affine: any activation) or, with the default activations, in one
pass over the units (``numba_backend._lstm_rows``). This compiles the vector loop of
each pass kind and of the one pass (float32, AVX-512), emits assembly for each
``-mcpu`` with llvmlite, and runs ``llvm-mca`` on the main vector loop of each; it
prints steady-state cycles a unit: the passes' sum (weighted by how many of each an
LSTM unit takes) and the one pass, with its busiest port. Loop starts and ends, and
calls, are not modelled. Run it with an empty numba cache (``XDG_CACHE_HOME`` and a
copy of the package, or after deleting ``*.nbi``): cached code cannot be inspected.

    apt-get install llvm-19
    python scripts/mca_cell.py --cpus znver4,znver5,sapphirerapids

Used for docs/benchmarks.md ("Fifteenth session").
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys

import llvmlite.binding as llvm
import numba
import numpy as np
from mca_tiles import FEATURES, model

from onnx_recurrent.backends import numba_backend as nb

f32 = np.float32
_OPTIONS = {"fastmath": {"contract", "nsz"}, "error_model": "numpy"}


@numba.njit(**_OPTIONS)
def clip_pass(d, s, clip):
    for j in range(d.shape[0]):
        d[j] = min(max(s[j], -clip), clip)


@numba.njit(**_OPTIONS)
def scale_pass(v, s, clip):
    for j in range(v.shape[0]):
        v[j] = s[j] * f32(0.5)


@numba.njit(**_OPTIONS)
def tanh_pass(v, s, clip):
    for j in range(v.shape[0]):
        v[j] = nb._tanh32(s[j])


@numba.njit(**_OPTIONS)
def affine_pass(v, s, clip):
    for j in range(v.shape[0]):
        v[j] = f32(0.5) + f32(0.5) * s[j]


@numba.njit(**_OPTIONS)
def state_pass(c, f, i, g):
    for j in range(c.shape[0]):
        c[j] = f[j] * c[j] + i[j] * g[j]


@numba.njit(**_OPTIONS)
def product_pass(h, o, g, clip):
    for j in range(h.shape[0]):
        h[j] = o[j] * g[j]


_A = numba.float32[::1]
#: the passes of one LSTM unit without peepholes (``_lstm_row``): clip i, f, c, o; the
#: sigmoids of i, f, o (scale, tanh, affine); tanh of c and of Ct; Ct; Ct copied (as a
#: scale: one load, one store); h = o tanh(Ct)
PASSES = {
    clip_pass: ((_A, _A, numba.float32), 4),
    scale_pass: ((_A, _A, numba.float32), 4),
    tanh_pass: ((_A, _A, numba.float32), 5),
    affine_pass: ((_A, _A, numba.float32), 3),
    state_pass: ((_A, _A, _A, _A), 1),
    product_pass: ((_A, _A, _A, numba.float32), 1),
}
_M = numba.float32[:, ::1]
ONE_PASS = (_M, _M, _M, numba.boolean, numba.int64, numba.int64, numba.int64, numba.float32)


def vector_loops(asm: str) -> list[tuple[str, int]]:
    """The loops of ``asm`` that store 512-bit vectors, with their stores an iteration."""
    lines, found = asm.splitlines(), []
    for end, line in enumerate(lines):
        jump = re.match(r"\s+j\w+\s+(\.LBB\w+)", line)
        starts = [i for i in range(end) if jump and lines[i].startswith(jump.group(1) + ":")]
        if not starts:
            continue
        body = [
            s for s in lines[starts[-1] + 1 : end + 1] if s.strip() and s.strip()[0] not in ".#"
        ]
        stores = sum(bool(re.match(r"\s+vmovup[sd]\s+%zmm\d+, ", s)) for s in body)
        if stores:
            found.append(("\n".join(body), stores))
    return found


def per_unit(fn, signature, cpu: str, mca: str, stores_a_unit: int = 1) -> tuple[float, dict]:
    """Modelled cycles a unit of ``fn``'s main vector loop on ``cpu``, and llvm-mca's figures."""
    fn.compile(signature)
    target = llvm.Target.from_triple(llvm.get_process_triple())
    machine = target.create_target_machine(cpu=cpu, features=FEATURES[64], opt=3)
    asm = machine.emit_assembly(llvm.parse_assembly(fn.inspect_llvm(signature)))
    loops = vector_loops(asm)
    if not loops:
        raise SystemExit(f"{fn.__name__}: no vector loop (cached code? see the docstring)")
    body, stores = max(loops, key=lambda loop: loop[1])
    figures = model(body, cpu, mca)
    return figures["cycles"] / (16 * stores / stores_a_unit), figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpus", default="znver4,sapphirerapids", help="llvm-mca -mcpu values")
    p.add_argument("--mca", default=shutil.which("llvm-mca-19") or shutil.which("llvm-mca"))
    args = p.parse_args()
    if not args.mca:
        print("llvm-mca not found (apt-get install llvm-19)", file=sys.stderr)
        return 2
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    for cpu in args.cpus.split(","):
        parts = {fn.__name__: per_unit(fn, s, cpu, args.mca)[0] for fn, (s, _) in PASSES.items()}
        passes = sum(parts[fn.__name__] * k for fn, (_, k) in PASSES.items())
        one, figures = per_unit(nb._lstm_rows, ONE_PASS, cpu, args.mca, stores_a_unit=2)
        detail = ", ".join(f"{name.removesuffix('_pass')} {c:.2f}" for name, c in parts.items())
        print(
            f"{cpu:15s} passes {passes:.2f} cycles a unit ({detail}); one pass {one:.2f} "
            f"(busiest: {figures['port']}, {figures['port_cycles']:.1f} cycles for 16 units)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
