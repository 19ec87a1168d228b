"""Test support: hypothesis strategies for whole operator configurations, tolerances, and
a one-node onnxruntime runner."""

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import onnx
from hypothesis import assume
from hypothesis import strategies as st

import oracle
from oracle import gru_ref, lstm_ref, rnn_ref

#: op -> (gates, activations per direction, optional inputs in positional order)
OPS = {
    "gru": (3, 2, ("B", "sequence_lens", "initial_h")),
    "rnn": (1, 1, ("B", "sequence_lens", "initial_h")),
    "lstm": (4, 3, ("B", "sequence_lens", "initial_h", "initial_c", "P")),
}
REFS = {"gru": gru_ref, "rnn": rnn_ref, "lstm": lstm_ref}
ACTIVATION_NAMES = [
    "Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
    "HardSigmoid", "Elu", "Softsign", "Softplus",
]  # fmt: skip
DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]
#: range of drawn (alpha, beta) per activation; float32-exact values are drawn
PARAM_RANGES = {
    "affine": ((-1.5, 1.5), (-1.0, 1.0)),
    "leakyrelu": ((0.0, 1.0), None),
    "thresholdedrelu": ((-0.5, 1.5), None),
    "scaledtanh": ((-2.0, 2.0), (-2.0, 2.0)),
    "hardsigmoid": ((0.0, 1.0), (0.0, 1.0)),
    "elu": ((0.0, 2.0), None),
}
#: dtype -> (unit roundoff of the final rounding, error of the computation); float16 and
#: bfloat16 are computed in float32 and rounded once
TOLERANCES = {
    np.dtype(np.float64): (0.0, 1e-10),
    np.dtype(np.float32): (0.0, 1e-5),
    np.dtype(np.float16): (2.0**-11, 1e-5),
    np.dtype(ml_dtypes.bfloat16): (2.0**-8, 1e-5),
}


@dataclass
class Case:
    """One operator call: ``op``, its array inputs (``None`` = absent) and attributes."""

    op: str
    inputs: dict
    attrs: dict = field(default_factory=dict)

    @property
    def dtype(self):
        return self.inputs["X"].dtype

    @property
    def seq_length(self):
        return self.inputs["X"].shape[self.attrs.get("layout", 0)]

    def call(self, fn, inputs=None):
        """``fn(**inputs, **attrs)`` with the absent inputs left out."""
        inputs = self.inputs if inputs is None else inputs
        return fn(**{k: v for k, v in inputs.items() if v is not None}, **self.attrs)

    def reference(self, bound=1e3):
        """The oracle's float64 outputs, from the same (rounded) inputs.

        Rejects (``hypothesis.assume``) the rare draws whose outputs exceed ``bound``:
        unbounded activations can grow exponentially over the steps.
        """
        outputs = self.call(REFS[self.op])
        assume(all(np.max(np.abs(o), initial=0.0) <= bound for o in outputs))
        return outputs

    def sensitivity(self, reference):
        """How far rounding can move this draw's outputs (its conditioning), per output:
        the larger of the oracle's move when every float input is perturbed by one unit
        of the computation's precision, and (float32 computations) the gap between the
        oracle run in float32 and in float64, which sees the rounding of every step."""
        wide = self.dtype == np.float64
        eps = np.finfo(np.float64 if wide else np.float32).eps
        rng = np.random.default_rng(0)
        perturbed = {
            k: v if v is None or k == "sequence_lens"
            else v.astype(np.float64) * (1 + eps * rng.uniform(-1, 1, v.shape))
            for k, v in self.inputs.items()
        }  # fmt: skip
        moves = [self.call(REFS[self.op], perturbed)]
        if not wide:
            with oracle.computing_in(np.float32), np.errstate(all="ignore"):
                moves.append(self.call(REFS[self.op]))
        gaps = [
            max(float(np.max(np.abs(m[i] - r), initial=0.0)) for m in moves)
            for i, r in enumerate(reference)
        ]
        assume(all(math.isfinite(g) for g in gaps))  # overflows in float32 only
        return gaps


def _float32s(lo, hi):
    return st.floats(lo, hi, width=32)


@st.composite
def activation_attrs(draw, op, n_dir, complete=False):
    """``activations`` / ``activation_alpha`` / ``activation_beta`` attributes.

    With ``complete``, every parameter is given (onnxruntime's defaults differ).
    """
    k = OPS[op][1]
    if not complete and draw(st.integers(0, 3)) == 0:
        return {}
    names = draw(
        st.lists(st.sampled_from(ACTIVATION_NAMES), min_size=k * n_dir, max_size=k * n_dir)
    )
    if not complete:
        names = [draw(st.sampled_from([n, n.lower(), n.upper()])) for n in names]
    alphas, betas = [], []
    for name in names:
        alpha_range, beta_range = PARAM_RANGES.get(name.lower(), (None, None))
        if alpha_range:
            alphas.append(draw(_float32s(*alpha_range)))
        if beta_range:
            betas.append(draw(_float32s(*beta_range)))
    if not complete:  # shorter lists: the defaults apply to the rest
        alphas = alphas[: draw(st.integers(0, len(alphas)))]
        betas = betas[: draw(st.integers(0, len(betas)))]
    attrs = {"activations": names}
    if alphas or draw(st.booleans()):
        attrs["activation_alpha"] = alphas
    if betas or draw(st.booleans()):
        attrs["activation_beta"] = betas
    return attrs


@st.composite
def cases(
    draw,
    op,
    dtypes=DTYPES,
    layouts=(0, 1),
    complete_params=False,
    opset=22,
    max_sizes=(6, 4, 5, 5),
):
    """A whole configuration for ``op``; array values come from a drawn seed.

    ``complete_params``/``opset`` restrict to what onnxruntime computes like the spec;
    ``max_sizes`` bounds (seq_length, batch, input_size, hidden_size).
    """
    gates, _, optional = OPS[op]
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    layout = draw(st.sampled_from(layouts))
    direction = draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    n_dir = 2 if direction == "bidirectional" else 1
    T, N, I, H = (draw(st.integers(1, m)) for m in max_sizes)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def uniform(*shape, scale=1.0):
        return (scale * rng.uniform(-1, 1, shape)).astype(dtype)

    batch_first = layout == 1
    inputs = {
        "X": uniform(*((N, T) if batch_first else (T, N)), I),
        "W": uniform(n_dir, gates * H, I),
        "R": uniform(n_dir, gates * H, H, scale=min(1.0, 1.5 / math.sqrt(H))),  # not chaotic
        "B": uniform(n_dir, 2 * gates * H, scale=0.5),
        "sequence_lens": np.array(
            draw(st.lists(st.integers(0, T), min_size=N, max_size=N)), dtype=np.int32
        ),
        "initial_h": uniform(*((N, n_dir) if batch_first else (n_dir, N)), H),
        "initial_c": uniform(*((N, n_dir) if batch_first else (n_dir, N)), H),
        "P": uniform(n_dir, 3 * H),
    }
    present = draw(st.lists(st.booleans(), min_size=5, max_size=5))
    for name, keep in zip(
        ("B", "sequence_lens", "initial_h", "initial_c", "P"), present, strict=True
    ):
        if not keep or name not in optional:
            inputs[name] = None
    attrs = {"direction": direction, "layout": layout} if layout else {"direction": direction}
    if draw(st.booleans()):
        attrs["hidden_size"] = H
    attrs.update(draw(activation_attrs(op, n_dir, complete_params)))
    clip = draw(
        st.one_of(
            st.none(), _float32s(0.125, 4.0), st.just(math.inf) if opset == 22 else st.nothing()
        )
    )
    if clip is not None:
        # ThresholdedRelu at x == alpha is ambiguous (spec text ">=", onnxruntime ">"):
        # keep a clipped input (x == clip) away from every alpha, default 1.0 included
        assume(clip not in {1.0, *map(abs, attrs.get("activation_alpha", []))})
        attrs["clip"] = clip
    if op == "gru" and draw(st.booleans()):
        attrs["linear_before_reset"] = 1
    if op == "lstm" and draw(st.booleans()):
        attrs["input_forget"] = 1
    return Case(op, inputs, attrs)


def assert_close(actual, expected, dtype, factor=1.0, sensitivity=0.0):
    """Compare one output against the float64 oracle with the tolerance of ``dtype``.

    ``|actual - expected| <= roundoff * |expected| + err * (|expected| + max|expected|)``
    (``max|expected|`` at least 1), ``err`` the computation's error times ``factor``,
    plus ``10 * sensitivity`` (see :meth:`Case.sensitivity`) for ill-conditioned draws.
    """
    roundoff, err = TOLERANCES[np.dtype(dtype)]
    err *= factor
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(
        np.asarray(actual, np.float64),
        expected,
        rtol=roundoff + err,
        atol=err * scale + 10 * sensitivity,
    )


def run_onnxruntime(case, opset=14):
    """Run ``case`` (float32, layout 0) as a one-node ONNX model on onnxruntime's CPU."""
    import onnxruntime

    op_type = case.op.upper()
    names = ["X", "W", "R", *OPS[case.op][2]]
    present = [n for n in names if case.inputs.get(n) is not None]
    node_inputs = [n if n in present else "" for n in names[: names.index(present[-1]) + 1]]
    outputs = ["Y", "Y_h", "Y_c"][: 3 if case.op == "lstm" else 2]
    attrs = {k: v for k, v in case.attrs.items() if not (isinstance(v, list) and not v)}
    attrs.setdefault("hidden_size", case.inputs["R"].shape[-1])
    node = onnx.helper.make_node(op_type, node_inputs, outputs, **attrs)
    T = onnx.TensorProto

    def info(name, elem):
        return onnx.helper.make_tensor_value_info(name, elem, None)

    graph = onnx.helper.make_graph(
        [node], "g",
        [info(n, T.INT32 if n == "sequence_lens" else T.FLOAT) for n in present],
        [info(n, T.FLOAT) for n in outputs])  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    outputs = session.run(None, {n: case.inputs[n] for n in present})
    # onnxruntime's float32 Softplus, log(1 + e^x), overflows for x > 88: reject those draws
    assume(all(np.isfinite(o).all() for o in outputs))
    return outputs
