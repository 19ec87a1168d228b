"""Bad input: a clear ValueError/TypeError naming the input, never a NumPy traceback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import onnx_recurrent as orc

from models import node_model, random_inputs

FUNCTIONS = {"GRU": orc.gru, "RNN": orc.rnn, "LSTM": orc.lstm}


def _shape_cases(op):
    f = random_inputs(op)
    yield "X 2-D", {**f, "X": f["X"][0]}, ValueError, r"X must be 3-D"
    yield "W shape", {**f, "W": f["W"][:, :-1]}, ValueError, r"W must have shape \[1, \d+, 4\]"
    yield "R not 3-D", {**f, "R": f["R"][0]}, ValueError, r"R must be 3-D"
    # one axis too many at the end: R, whose last axis gives hidden_size, is named, not W
    wider = np.concatenate([f["R"], f["R"][:, :, :1]], axis=2)
    yield "R last axis", {**f, "R": wider}, ValueError, r"R must have shape \[1, \d+, 4\]"
    yield "B shape", {**f, "B": f["B"][:, :-1]}, ValueError, r"B must have shape"
    yield (
        "initial_h shape",
        {**f, "initial_h": f["initial_h"][:, :2]},
        ValueError,
        (r"initial_h must have shape \[1, 3, 3\]"),
    )
    yield (
        "sequence_lens shape",
        {**f, "sequence_lens": f["sequence_lens"][:2]},
        ValueError,
        (r"sequence_lens must have shape \[3\]"),
    )
    yield (
        "sequence_lens > T",
        {**f, "sequence_lens": np.array([5, 6, 1], np.int32)},
        (ValueError),
        r"sequence_lens\[1\]=6",
    )
    yield (
        "sequence_lens < 0",
        {**f, "sequence_lens": np.array([5, -1, 1], np.int32)},
        (ValueError),
        r"sequence_lens\[1\]=-1",
    )
    yield (
        "sequence_lens float",
        {**f, "sequence_lens": np.ones(3, np.float32)},
        TypeError,
        (r"sequence_lens must have an integer dtype \(int32 in ONNX\)"),
    )
    yield "integer X", {**f, "X": np.ones((5, 3, 4), np.int64)}, TypeError, r"X must have a float"
    yield "mixed dtype", {**f, "W": f["W"].astype(np.float64)}, TypeError, r"W must have X's dtype"
    if op == "LSTM":
        yield "P shape", {**f, "P": f["P"][:, :-1]}, ValueError, r"P must have shape \[1, 9\]"
        yield (
            "initial_c shape",
            {**f, "initial_c": f["initial_c"][:, :, :2]},
            ValueError,
            (r"initial_c must have shape \[1, 3, 3\]"),
        )


SHAPE_CASES = [(op, *case) for op in FUNCTIONS for case in _shape_cases(op)]


@pytest.mark.parametrize(
    ("op", "what", "feeds", "error", "match"),
    SHAPE_CASES,
    ids=[f"{c[0]}-{c[1]}" for c in SHAPE_CASES],
)
def test_bad_inputs(op, what, feeds, error, match):
    with pytest.raises(error, match=match):
        FUNCTIONS[op](*feeds.values())


ATTRIBUTE_CASES = [
    ({"hidden_size": 4}, r"hidden_size=4 disagrees with R"),
    ({"direction": "sideways"}, r"direction must be one of"),
    ({"direction": "bidirectional"}, r"R must have shape \[2,"),
    ({"layout": 2}, r"layout must be 0 or 1"),
    ({"activations": "one too many"}, r"activations must list"),
    ({"activations": "Swish"}, r"unknown activation 'Swish'"),
    ({"activation_alpha": [0.1, 0.2]}, r"activation_alpha has 2 values"),
    ({"clip": 0.0}, r"clip must be a positive number"),
    ({"clip": float("nan")}, r"clip must be a positive number"),
    ({"clip": -1.0}, r"clip must be a positive number"),
]


#: attributes of another type than the specification's (as the onnx checker has them)
ATTRIBUTE_TYPE_CASES = [
    ({"clip": "3"}, TypeError, r"clip must be a float, got '3'"),
    ({"clip": True}, TypeError, r"clip must be a float, got True"),
    ({"hidden_size": 3.0}, TypeError, r"hidden_size must be an integer, got 3.0"),
    ({"hidden_size": True}, TypeError, r"hidden_size must be an integer, got True"),
    ({"direction": 1}, TypeError, r"direction must be a string"),
    ({"activations": "Tanh"}, TypeError, r"activations must be a list of strings, got 'Tanh'"),
    ({"activations": [1, 2, 3]}, TypeError, r"activations\[0\] must be a string, got 1"),
    ({"activation_alpha": ["x"]}, TypeError, r"activation_alpha\[0\] must be a float, got 'x'"),
    ({"activation_beta": 0.5}, TypeError, r"activation_beta must be a list of floats, got 0.5"),
    # 0-d arrays: NumPy's "iteration over a 0-d array", naming nothing
    (
        {"activation_alpha": np.array(0.5)},
        TypeError,
        r"activation_alpha must be a list of floats, got array\(0.5\)",
    ),
    ({"activations": np.array("Tanh")}, TypeError, r"activations must be a list of strings"),
    ({"layout": 1.0}, ValueError, r"layout must be 0 or 1 \(an integer\), got 1.0"),
    ({"layout": True}, ValueError, r"layout must be 0 or 1 \(an integer\), got True"),
]


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize(("attributes", "error", "match"), ATTRIBUTE_TYPE_CASES)
def test_attributes_of_another_type(op, attributes, error, match):
    with pytest.raises(error, match=match):
        FUNCTIONS[op](*random_inputs(op).values(), **attributes)


@pytest.mark.parametrize("value", ["no", 1.0, None])
def test_flags_are_integers(value):
    feeds = random_inputs("GRU")
    with pytest.raises(ValueError, match=r"linear_before_reset must be an integer \(nonzero"):
        orc.gru(*feeds.values(), linear_before_reset=value)
    feeds = random_inputs("LSTM")
    with pytest.raises(ValueError, match=r"input_forget must be an integer \(nonzero: true\)"):
        orc.lstm(*feeds.values(), input_forget=value)


@pytest.mark.parametrize("value", [2, -1, np.int64(7)])
def test_flags_nonzero_are_true(value):
    """``linear_before_reset != 0`` (SEMANTICS.md), as onnxruntime reads both flags."""
    feeds = random_inputs("GRU")
    np.testing.assert_array_equal(
        orc.gru(*feeds.values(), linear_before_reset=value)[1],
        orc.gru(*feeds.values(), linear_before_reset=1)[1],
    )
    feeds = random_inputs("LSTM")
    np.testing.assert_array_equal(
        orc.lstm(*feeds.values(), input_forget=value)[1],
        orc.lstm(*feeds.values(), input_forget=1)[1],
    )


@pytest.mark.parametrize("op", FUNCTIONS)
@pytest.mark.parametrize(("attributes", "match"), ATTRIBUTE_CASES)
def test_bad_attributes(op, attributes, match):
    n = {"GRU": 2, "RNN": 1, "LSTM": 3}[op]
    if attributes.get("activations") == "one too many":  # RNN: two is the schema's default
        attributes = {"activations": ["Tanh"] * (n + 1 + (op == "RNN"))}
    elif attributes.get("activations") == "Swish":
        attributes = {"activations": ["Swish"] * n}
    with pytest.raises(ValueError, match=match):
        FUNCTIONS[op](*random_inputs(op).values(), **attributes)


def test_activation_list_length_message_gives_the_count():
    f = random_inputs("GRU")
    with pytest.raises(ValueError, match=r"must list 4 functions .* got 2"):
        orc.gru(*f.values(), direction="bidirectional", activations=["Sigmoid", "Tanh"])


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_a_one_direction_rnn_takes_the_first_of_two_activations(direction):
    """RNN's schema lists two activations by default, ``[Tanh, Tanh]``; onnxruntime takes
    the first for one direction (they were refused). Each consumes its own alpha."""
    f = random_inputs("RNN")
    one = orc.rnn(
        *f.values(), direction=direction, activations=["LeakyRelu"], activation_alpha=[0.3]
    )
    two = orc.rnn(
        *f.values(),
        direction=direction,
        activations=["LeakyRelu", "Elu"],
        activation_alpha=[0.3, 2.0],
    )
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"must list 1 functions .* got 3"):
        orc.rnn(*f.values(), direction=direction, activations=["Tanh"] * 3)
    with pytest.raises(ValueError, match=r"must list 2 functions .* got 3"):
        orc.rnn(*f.values(), direction="bidirectional", activations=["Tanh"] * 3)


def test_non_contiguous_and_read_only_inputs_just_work():
    f = random_inputs("LSTM")
    expected = orc.lstm(*f.values())
    strided = {k: np.repeat(v, 2, axis=-1)[..., ::2] for k, v in f.items()}
    for v in strided.values():
        v.flags.writeable = False
    assert not strided["X"].flags.c_contiguous
    for got, e in zip(orc.lstm(*strided.values()), expected, strict=True):
        np.testing.assert_array_equal(got, e)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_arrays_in_the_other_byte_order_just_work(dtype):
    """Big-endian arrays (as read from a file written so) were refused as if not
    floats ("got >f4"); now computed as native ones, through every face that takes
    arrays, and left unchanged."""
    f = {
        k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in random_inputs("LSTM").items()
    }
    expected = orc.lstm(*f.values())
    swapped = {k: v.astype(v.dtype.newbyteorder(">")) for k, v in f.items()}
    copies = {k: v.copy() for k, v in swapped.items()}
    assert not swapped["X"].dtype.isnative and not swapped["W"].dtype.isnative
    for got, e in zip(orc.lstm(*swapped.values()), expected, strict=True):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, e)
    W, R, B, P = (swapped[k] for k in "WRBP")
    layer = orc.Layer("LSTM", W, R, B, {"hidden_size": R.shape[-1]}, P)
    rest = (swapped[k] for k in ("sequence_lens", "initial_h", "initial_c"))
    np.testing.assert_array_equal(layer(swapped["X"], *rest)[0], expected[0])
    for k, v in swapped.items():
        assert v.dtype == copies[k].dtype
        np.testing.assert_array_equal(v, copies[k])


def test_caller_arrays_are_not_modified():
    for op, fn in FUNCTIONS.items():
        f = random_inputs(op)
        copies = {k: v.copy() for k, v in f.items()}
        fn(*f.values(), direction="forward", clip=0.5)
        for k in f:
            np.testing.assert_array_equal(f[k], copies[k], err_msg=f"{op} modified {k}")


def test_errors_subclass_builtins():
    assert issubclass(orc.RecurrentError, ValueError)
    assert issubclass(orc.RecurrentTypeError, TypeError)


def test_attributes_parsed_once_still_checked_by_type_and_value():
    """Parsed attributes are reused by value and type: a value equal to a valid one
    (``True == 1``) is still rejected, and arrays (unhashable) are parsed every time."""
    feeds = random_inputs("GRU")
    orc.gru(**feeds, layout=0)
    with pytest.raises(ValueError, match="layout must be 0 or 1"):
        orc.gru(**feeds, layout=False)
    names = ["Affine", "Tanh"]
    a = orc.gru(**feeds, activations=names, activation_alpha=[0.5], activation_beta=[0.1])
    c = orc.gru(**feeds, activations=names, activation_alpha=[0.25], activation_beta=[0.1])
    assert not np.array_equal(a[1], c[1])  # alpha matters
    # the same array, changed in place between calls: its new values are used
    alpha = np.array([0.5])
    b = orc.gru(**feeds, activations=names, activation_alpha=alpha, activation_beta=(0.1,))
    np.testing.assert_array_equal(a[1], b[1])
    alpha[0] = 0.25
    b = orc.gru(**feeds, activations=names, activation_alpha=alpha, activation_beta=(0.1,))
    np.testing.assert_array_equal(c[1], b[1])
    # so is a list changed in place (kept parsed by value, not by identity)
    listed = [0.5]
    orc.gru(**feeds, activations=names, activation_alpha=listed, activation_beta=[0.1])
    listed[0] = 0.25
    b = orc.gru(**feeds, activations=names, activation_alpha=listed, activation_beta=[0.1])
    np.testing.assert_array_equal(c[1], b[1])
    # a list's items by type too: [True] refused after [1] was parsed (was accepted),
    # in a list or a tuple
    rnn = random_inputs("RNN")
    for given in ([1], (1,)):
        orc.rnn(**rnn, activations=["LeakyRelu"], activation_alpha=given)
        with pytest.raises(TypeError, match=r"activation_alpha\[0\] must be a float, got True"):
            orc.rnn(**rnn, activations=["LeakyRelu"], activation_alpha=type(given)([True]))
    # an array's refusal stands alone (was chained to "unhashable type: 'numpy.ndarray'")
    with pytest.raises(
        TypeError, match=r"must be a list of floats, got array\(\[\[1.\]\]\)"
    ) as caught:
        orc.rnn(**rnn, activations=["LeakyRelu"], activation_alpha=np.array([[1.0]]))
    assert caught.value.__context__ is None, repr(caught.value.__context__)


@pytest.mark.parametrize("op", FUNCTIONS)
def test_output_sequence_must_be_a_bool(op):
    # 'no' is true: it was taken as output_sequence=True, through Layer.run too
    feeds = random_inputs(op)
    for face in (
        lambda value: FUNCTIONS[op](**feeds, output_sequence=value),
        lambda value: orc.Layer(op, feeds["W"], feeds["R"]).run(feeds["X"], output_sequence=value),
    ):
        with pytest.raises(TypeError, match=r"output_sequence must be a bool, got str 'no'"):
            face("no")
        assert face(np.False_)[0] is None and face(0)[0] is None
        assert face(np.True_)[0] is not None


def test_one_line_words_any_error_on_one_line():
    from onnx_recurrent.errors import RecurrentError, one_line

    missing = FileNotFoundError(2, "No such file or directory", "m.onnx")
    assert one_line(missing) == "m.onnx: No such file or directory"
    assert one_line(missing, named=False) == "No such file or directory"
    assert one_line(RecurrentError("X must be\n  3-D")) == "X must be 3-D"
    assert one_line(ValueError("bad")) == "ValueError: bad"
    assert one_line(ValueError("bad"), typed=False) == "bad"
    assert one_line(KeyError()) == "KeyError"
    assert one_line(ValueError("x" * 50), 20) == "ValueError: xxxxx..."
    # the peers' wrapping: OpenVINO's source locations, onnxruntime's paths and prefix
    openvino = RuntimeError("Exception from a.cpp:1:\nbad shape")
    assert one_line(openvino) == "RuntimeError: bad shape"
    ort = "[ONNXRuntimeError] : 1 : FAIL : /src/x.cc:12 void f::g(int) bad"
    assert one_line(RuntimeError(ort), typed=False) == "FAIL : void bad"


def test_import_optional_says_what_to_install(monkeypatch):
    import sys

    from onnx_recurrent.errors import import_optional

    assert import_optional("numpy", "x", "pip install numpy") is np
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"^a bar needs tqdm, which is not installed"):
        import_optional("tqdm", "a bar", "pip install tqdm")
    with pytest.raises(ModuleNotFoundError, match="no_such_package_here") as info:
        import_optional("no_such_package_here.sub", "x", "pip install y")
    assert info.value.name == "no_such_package_here"
    with pytest.raises(ModuleNotFoundError, match="pip install y"):
        import_optional("no_such_package_here", "x", "pip install y", find_only=True)
    assert import_optional("numpy", "x", "y", find_only=True).name == "numpy"


def test_a_timeout_during_an_optional_import_is_the_timeout(tmp_path):
    # a SIGALRM handler raising TimeoutError (an OSError) during the import was held to
    # its end, then caught as the import's failure: "x needs slow_package, which cannot
    # be imported (TimeoutError: timer)"; the module is whole all the same. (In a child:
    # the signal and its handler are the process's.)
    (tmp_path / "slow_package.py").write_text(
        "import signal\nsignal.raise_signal(signal.SIGALRM)\nWHOLE = True\n"
    )
    code = (
        "import signal, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from onnx_recurrent.errors import import_optional\n"
        "def timer(signum, frame):\n"
        "    raise TimeoutError('timer')\n"
        "signal.signal(signal.SIGALRM, timer)\n"
        "try:\n"
        "    import_optional('slow_package', 'x', 'pip install y')\n"
        "except TimeoutError as e:\n"
        "    print('timeout', e)\n"
        "print(import_optional('slow_package', 'x', 'pip install y').WHOLE)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["timeout", "timer", "True"], done.stdout


def test_arrays_numpy_cannot_read_are_named():
    # NumPy's own errors came out naming no input ("setting an array element with a
    # sequence"), and a masked array's mask was ignored, silently
    feeds = random_inputs("GRU", T=3, N=2, I=3, H=4)
    X, W, R = feeds["X"], feeds["W"], feeds["R"]
    ragged = [[[0.0, 1.0, 2.0]], [[0.0]]]
    for name, call in (
        ("X", lambda: orc.gru(ragged, W, R)),
        ("R", lambda: orc.gru(X, W, [[[0.0] * 4] * 12, [[0.0]]])),
        ("W", lambda: orc.Layer("GRU", [[[0.0, 1.0]], [[0.0]]], R)),
        ("sequence_lens", lambda: orc.gru(X, W, R, sequence_lens=[[1, 2], [3]])),
        (
            "W",
            lambda: orc.gru_cell(
                X[0], np.zeros((2, 4), X.dtype), [[0.0], [0.0, 1.0]], R[0], hidden_size=4
            ),
        ),
    ):
        with pytest.raises(orc.RecurrentError, match=rf"^{name} cannot be read as an array"):
            call()
    masked = np.ma.masked_array(X, mask=np.zeros_like(X, dtype=bool))
    with pytest.raises(orc.RecurrentTypeError, match=r"^X is a masked array, whose mask"):
        orc.gru(masked, W, R)
    with pytest.raises(orc.RecurrentTypeError, match=r"^sequence_lens must have an integer"):
        orc.gru(X, W, R, sequence_lens=np.array([1.0, 2.0]))


@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
def test_x_given_as_a_list_takes_ws_dtype(op):
    # a list has no dtype of its own: it became float64, and W float32 was then blamed
    # ("W must have X's dtype float64")
    fn = {"GRU": orc.gru, "LSTM": orc.lstm, "RNN": orc.rnn}[op]
    feeds = random_inputs(op, T=4, N=2, I=3, H=5, full=False)
    want = fn(**feeds)
    for given in (feeds["X"].tolist(), tuple(feeds["X"].tolist())):
        got = fn(**{**feeds, "X": given})
        assert all(g.dtype == np.float32 for g in got)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match=r"W must have X's dtype float32, got float64"):
        fn(**{**feeds, "W": feeds["W"].astype(np.float64)})
    # a list of anything but numbers was converted without a word: None to NaN, complex
    # to its real part, numeric strings parsed, bools taken; words gave numpy's error
    for value, kind in [(None, "object"), (1 + 5j, "complex128"), ("1.5", "<U"),
                        (True, "bool"), ("a", "<U")]:  # fmt: skip
        X = np.full(feeds["X"].shape, 0.5 if value is not True else True).tolist()
        X[0][0][0] = value
        with pytest.raises(TypeError, match=rf"X as a list must hold numbers, got {kind}"):
            fn(**{**feeds, "X": X})
        with pytest.raises(TypeError, match=rf"X as a list must hold numbers, got {kind}"):
            orc.Layer(op, feeds["W"], feeds["R"])(X)
    layer = orc.Layer(op, feeds["W"], feeds["R"])  # a list of numbers: the layer's dtype
    for a, b in zip(layer(feeds["X"].tolist()), layer(feeds["X"]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
def test_x_and_w_at_odds_on_input_size_are_both_named(op):
    # the functions blamed W alone for X's last axis ("W must have shape [1, 12, 4]")
    fn = {"GRU": orc.gru, "LSTM": orc.lstm, "RNN": orc.rnn}[op]
    feeds = random_inputs(op, T=4, N=2, I=3, H=5, full=False)
    X = np.zeros((4, 2, 4), np.float32)
    with pytest.raises(
        ValueError, match=r"X and W disagree on input_size: X's last axis is 4, W's is 3"
    ):
        fn(**{**feeds, "X": X})
    with pytest.raises(ValueError, match=r"X must have input_size=3 \(W's last axis\)"):
        orc.Layer(op, feeds["W"], feeds["R"])(X)


def test_gru_cell_names_x_and_w_at_odds_on_input_size():
    # gru_cell still blamed W alone ("W must have shape [12, 4]") for X's last axis
    H = 4
    W, R = np.zeros((3 * H, 3), np.float32), np.zeros((3 * H, H), np.float32)
    with pytest.raises(
        ValueError, match=r"X and W disagree on input_size: X's last axis is 4, W's is 3"
    ):
        orc.gru_cell(
            np.ones((1, 4), np.float32), np.zeros((1, H), np.float32), W, R, hidden_size=H
        )


@pytest.mark.parametrize("op", ["GRU", "LSTM", "RNN"])
def test_states_and_biases_given_as_lists_are_taken_in_x_dtype(op):
    # refused as "initial_h must have X's dtype float32, got float64": NumPy's choice for
    # a list, not the caller's (X as a list is taken in W's dtype)
    fn = {"GRU": orc.gru, "LSTM": orc.lstm, "RNN": orc.rnn}[op]
    feeds = random_inputs(op, T=4, N=2, I=3, H=5, full=True)
    feeds = {k: v for k, v in feeds.items() if v is not None}
    listed = {
        k: (v.tolist() if k in ("B", "initial_h", "initial_c", "P") else v)
        for k, v in feeds.items()
    }
    assert any(isinstance(v, list) for v in listed.values())
    for a, b in zip(fn(**listed), fn(**feeds), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match=r"initial_h as a list must hold numbers, got <U"):
        fn(**{**feeds, "initial_h": [["a"]]})
    H = 5
    cell = (np.ones((2, 3), np.float32), np.zeros((2, H), np.float32).tolist())
    W, R = np.ones((3 * H, 3), np.float32), np.ones((3 * H, H), np.float32)
    got = orc.gru_cell(*cell, W, R, [0.5] * (3 * H), hidden_size=H)
    B = np.full(3 * H, 0.5, np.float32)
    want = orc.gru_cell(cell[0], np.zeros((2, H), np.float32), W, R, B, hidden_size=H)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("ragged", [False, True])
def test_no_rows_over_a_huge_seq_length_allocates_nothing_per_step(ragged):
    # X of shape (2**34, 0, I) holds nothing, yet a schedule of 2**34 steps was
    # allocated (MemoryError: 128 GiB)
    feeds = random_inputs("LSTM", T=2, N=1, I=2, H=4, full=False)
    X = np.empty((2**34, 0, 2), np.float32)
    lens = np.zeros(0, np.int32) if ragged else None
    for call in (orc.lstm, orc.Layer("LSTM", feeds["W"], feeds["R"])):
        args = (X,) if isinstance(call, orc.Layer) else (X, feeds["W"], feeds["R"])
        Y, Y_h, Y_c = call(*args, sequence_lens=lens)
        assert Y.shape == (2**34, 1, 0, 4) and Y_h.shape == Y_c.shape == (1, 0, 4)


NO_MEMORY_CHILD = """
import resource
import numpy as np
import onnx_recurrent as orc

vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30),) * 2)  # 1 GiB more than now
H = 2**17
R = np.broadcast_to(np.float32(0.1), (1, 3 * H, H))  # 192 GiB once copied
try:
    orc.Layer("GRU", np.full((1, 3 * H, 2), 0.1, np.float32), R)
except MemoryError as e:
    print(e)
X = np.broadcast_to(np.float32(1), (2**16, 2**16, 1))  # Y: 64 GiB
try:
    orc.gru(X, np.full((1, 12, 1), 0.1, np.float32), np.full((1, 12, 4), 0.1, np.float32))
except MemoryError as e:
    print(e)
X = np.broadcast_to(np.float32(1), (1, 2**24, 1))  # Y_h: 4 GiB, with no Y asked for
W, R = np.full((1, 192, 1), 0.1, np.float32), np.full((1, 192, 64), 0.1, np.float32)
try:
    orc.gru(X, W, R, output_sequence=False)
except MemoryError as e:
    print(e)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
def test_no_memory_for_a_weight_copy_or_y_names_it():
    # NumPy's MemoryError named a shape only ("Unable to allocate 192. GiB for an array
    # with shape (1, 393216, 131072)")
    run = subprocess.run(
        [sys.executable, "-c", NO_MEMORY_CHILD], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    copy, y, y_h = run.stdout.splitlines()
    assert copy.startswith("onnx-recurrent: no memory to copy R (shape [1, 393216, 131072]")
    assert y.startswith("onnx-recurrent: no memory for Y, the GRU output of shape [65536, 1,")
    assert "output_sequence=False" in y
    # the final states' too (NumPy's, which the hint about Y led to)
    assert y_h == (
        "onnx-recurrent: no memory for Y_h, the GRU output of shape [1, 16777216, 64] "
        "(float32: 4 GiB)"
    )


def test_bfloat16_scalars_and_torch_bfloat16_tensors_are_taken():
    """A bfloat16 ``clip`` or activation parameter was "must be a float, got 2" (ml_dtypes'
    scalars are no np.number); a torch bfloat16 tensor was "cannot be read as an array"
    (NumPy reads none), where float16 ones are taken."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = ml_dtypes.bfloat16
    feeds = random_inputs("RNN", T=3, N=2, I=4, H=5, dtype=bf, full=False)
    got = orc.rnn(**feeds, clip=bf(2), activations=["LeakyRelu"], activation_alpha=[bf(0.5)])
    want = orc.rnn(**feeds, clip=2.0, activations=["LeakyRelu"], activation_alpha=[0.5])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16))
    torch = pytest.importorskip("torch")
    tensor = torch.from_numpy(feeds["X"].view(np.int16)).view(torch.bfloat16)
    model = node_model("RNN", feeds, {"hidden_size": 5})
    runs = (
        lambda X: orc.rnn(**{**feeds, "X": X}),
        lambda X: orc.Layer("RNN", feeds["W"], feeds["R"])(X),
        lambda X: orc.InferenceSession(model, host="reference").run(None, {"X": X, **{
            k: v for k, v in feeds.items() if k != "X"}}),
    )  # fmt: skip
    for run in runs:
        for g, w in zip(run(tensor), run(feeds["X"]), strict=True):
            assert g.dtype == bf
            np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16))
