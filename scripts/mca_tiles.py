"""Model the packed micro-kernel's inner loop with llvm-mca on other CPUs than this one.

For each tile height R (rows of ``A`` per tile) and span G (panels at once; ``2 R G``
vector accumulators: see ``onnx_recurrent/backends/packed.py``), compiles the tile numba
emits here, takes its LLVM IR, emits assembly for each ``-mcpu`` with llvmlite, cuts out
the loop over ``k`` (the first backward jump after an FMA) and runs ``llvm-mca`` on it.
Prints, per tile and CPU: cycles per step of ``k`` (one broadcast of each row of ``A``
and ``2 R G`` FMAs), the bound of the busiest port, multiply-adds per cycle and that
port's name.

    apt-get install llvm-19          # llvm-mca with znver4 and znver5 (LLVM >= 19)
    python scripts/mca_tiles.py                    # AVX-512 (zmm) tiles
    python scripts/mca_tiles.py --vector-bytes 32  # AVX2 (ymm) tiles
    python scripts/mca_tiles.py --rows 1,2 --spans 1,2,4  # a product's one or two rows

Used for docs/benchmarks.md ("The micro-kernel on two CPUs, modelled").
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

import llvmlite.binding as llvm
import numba
import numpy as np

from onnx_recurrent.backends import layout, packed

FEATURES = {
    64: "+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx512cd,+fma,+avx2,+avx,+f16c",
    32: "+fma,+avx2,+avx,+f16c,-avx512f",
}
ITERATIONS = 200


def tile_ir(rows: int, span: int = 1) -> str:
    """LLVM IR of a function holding one float32 tile of ``rows`` rows by ``span`` panels."""
    tile = packed._tile_of(rows, span)

    @numba.njit
    def one_tile(A, lda, K, Bp, C, ldc):
        tile(A, lda, K, A, lda, 0, rows, Bp, 0, C, ldc, 0, False)

    i64 = numba.int64
    signature = (i64, i64, i64, numba.typeof(np.zeros((1, 1, 1), np.float32)), i64, i64)
    one_tile.compile(signature)
    return one_tile.inspect_llvm(signature)


def k_loop(asm: str, register: str) -> str:
    """The loop over ``k``: from the label of the first backward jump after an FMA on
    ``register`` vectors to that jump."""
    lines = asm.splitlines()
    first = next(i for i, line in enumerate(lines) if "vfmadd" in line and register in line)
    for end in range(first, len(lines)):
        jump = re.match(r"\s+j\w+\s+(\.LBB\w+)", lines[end])
        if jump and any(lines[i].startswith(jump.group(1) + ":") for i in range(first)):
            start = next(i for i in range(first) if lines[i].startswith(jump.group(1) + ":"))
            body = lines[start + 1 : end + 1]
            return "\n".join(s for s in body if s.strip() and not s.strip().startswith((".", "#")))
    raise ValueError("no loop around the FMAs")


def model(body: str, cpu: str, mca: str) -> dict:
    """llvm-mca's figures for ``body`` on ``cpu``: cycles per iteration, the busiest
    resource and its cycles per iteration."""
    text = subprocess.run(
        [mca, f"-mcpu={cpu}", f"-iterations={ITERATIONS}", "-mtriple=x86_64-unknown-linux-gnu"],
        input=body,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", text).group(1)) / ITERATIONS
    names = dict(re.findall(r"^\[([\d.]+)\]\s+-\s+(\S+)", text, re.M))
    table = text.split("Resource pressure per iteration:")[1].splitlines()
    heads, values = re.findall(r"\[([\d.]+)\]", table[1]), table[2].split()
    load, port = max((float(v), h) for h, v in zip(heads, values, strict=False) if v != "-")
    return {"cycles": cycles, "port": names.get(port, port), "port_cycles": load}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="4,6,8,10,12,14", help="tile heights R")
    p.add_argument("--spans", default="1", help="panels G a tile spans (with R <= 2: 2, 4)")
    p.add_argument("--cpus", default="znver4,sapphirerapids", help="llvm-mca -mcpu values")
    p.add_argument("--vector-bytes", type=int, choices=(32, 64), default=64)
    p.add_argument("--mca", default=shutil.which("llvm-mca-19") or shutil.which("llvm-mca"))
    args = p.parse_args()
    if not args.mca:
        print("llvm-mca not found (apt-get install llvm-19)", file=sys.stderr)
        return 2
    layout.VECTOR_BYTES = args.vector_bytes  # read by the tile's code generator
    lanes = args.vector_bytes // 4
    register = "zmm" if args.vector_bytes == 64 else "ymm"
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    print(f"{register} tiles, float32, {lanes} lanes; llvm-mca: {args.mca}")
    print("| R | G | -mcpu | cycles per k step | busiest port (cycles) | MAC/cycle |")
    print("|---|---|---|---|---|---|")
    shapes = [(int(r), int(g)) for r in args.rows.split(",") for g in args.spans.split(",")]
    for rows, span in shapes:
        ir = tile_ir(rows, span)
        for cpu in args.cpus.split(","):
            machine = target.create_target_machine(
                cpu=cpu, features=FEATURES[args.vector_bytes], opt=3
            )
            body = k_loop(machine.emit_assembly(llvm.parse_assembly(ir)), register)
            steps = body.count("vfmadd") // (2 * rows * span)  # the loop may be unrolled
            m = model(body, cpu, args.mca)
            per = m["cycles"] / steps
            print(
                f"| {rows} | {span} | {cpu} | {per:.1f} | {m['port']} "
                f"({m['port_cycles'] / steps:.1f}) | {2 * rows * span * lanes / per:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
