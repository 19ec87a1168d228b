"""The CPU quota (quota.py): the default threads are the smaller of the CPUs the process
may use and its cgroup's CPU quota, for our calls and for onnxruntime's intra-op pool.

Fake cgroup trees under ``tmp_path`` (the reader takes a root directory), then, where
the machine lets a test create a cgroup, a real one holding a child process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import pytest

from onnx_recurrent import quota, threads

TIMEOUT = 60  # seconds: only a hang gets near it


def _tree(root: Path, cgroup: str, files: dict[str, str | bytes], mountinfo: str | None = None):
    """A fake ``proc/self/cgroup`` (and ``mountinfo``) and cgroup files under ``root``;
    ``files`` maps paths relative to ``root`` to their contents."""
    (root / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    if mountinfo is not None:
        (root / "proc" / "self" / "mountinfo").write_text(mountinfo)
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


V1_CGROUP = "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n0::/\n"


def _on(monkeypatch, root: Path, usable: int = 16) -> None:
    """threads' defaults as on a machine whose files are under ``root`` and whose
    process may run on ``usable`` CPUs."""
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "_usable_cpus", lambda: usable)
    cpus = quota.cpus
    monkeypatch.setattr(quota, "cpus", lambda: cpus(root))


# --- cgroup v2 ---------------------------------------------------------------------


def test_v2_quota_of_two_cpus_on_sixteen(tmp_path, monkeypatch):
    _tree(
        tmp_path, "0::/kubepods/pod1\n", {"sys/fs/cgroup/kubepods/pod1/cpu.max": "200000 100000\n"}
    )
    assert quota.read(tmp_path) == 2.0
    _on(monkeypatch, tmp_path)
    assert threads._cpus() == 2
    assert threads.num_threads() == 2


@pytest.mark.parametrize(
    ("content", "cpus"),
    [("150000 100000", 2), ("50000 100000", 1), ("1000 100000", 1), ("100001 100000", 2)],
)
def test_v2_fractional_quota_rounds_up_to_at_least_one(tmp_path, monkeypatch, content, cpus):
    _tree(tmp_path, "0::/a\n", {"sys/fs/cgroup/a/cpu.max": content})
    assert quota.cpus(tmp_path) == cpus
    _on(monkeypatch, tmp_path)
    assert threads.num_threads() == cpus


def test_v2_max_is_no_quota(tmp_path, monkeypatch):
    _tree(tmp_path, "0::/a\n", {"sys/fs/cgroup/a/cpu.max": "max 100000\n"})
    assert quota.read(tmp_path) is None
    _on(monkeypatch, tmp_path)
    assert threads.num_threads() == 16


def test_v2_quota_above_the_cpus_leaves_the_cpus(tmp_path, monkeypatch):
    _tree(tmp_path, "0::/a\n", {"sys/fs/cgroup/a/cpu.max": "800000 100000\n"})
    _on(monkeypatch, tmp_path, usable=4)
    assert threads.num_threads() == 4


def test_v2_a_parent_with_a_smaller_quota_wins(tmp_path, monkeypatch):
    _tree(
        tmp_path,
        "0::/outer/middle/inner\n",
        {
            "sys/fs/cgroup/cpu.max": "garbage at the root, ignored",
            "sys/fs/cgroup/outer/cpu.max": "150000 100000\n",  # 1.5
            "sys/fs/cgroup/outer/middle/cpu.max": "max 100000\n",
            "sys/fs/cgroup/outer/middle/inner/cpu.max": "300000 50000\n",  # 6
        },
    )
    assert quota.read(tmp_path) == 1.5
    _on(monkeypatch, tmp_path)
    assert threads.num_threads() == 2


def test_v2_where_mountinfo_puts_it(tmp_path):
    """A hybrid host: cgroup2 at /sys/fs/cgroup/unified (mountinfo says so)."""
    mountinfo = (
        "25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
        "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw\n"
    )
    _tree(
        tmp_path,
        "0::/job\n",
        {"sys/fs/cgroup/unified/job/cpu.max": "300000 100000"},
        mountinfo,
    )
    assert quota.read(tmp_path) == 3.0


# --- cgroup v1 ---------------------------------------------------------------------


@pytest.mark.parametrize("mount", ["cpu,cpuacct", "cpu"])
def test_v1_quota_over_period(tmp_path, monkeypatch, mount):
    base = f"sys/fs/cgroup/{mount}/docker/abc"
    _tree(
        tmp_path,
        V1_CGROUP,
        {f"{base}/cpu.cfs_quota_us": "250000\n", f"{base}/cpu.cfs_period_us": "100000\n"},
    )
    assert quota.read(tmp_path) == 2.5
    _on(monkeypatch, tmp_path)
    assert threads.num_threads() == 3


def test_v1_minus_one_is_no_quota_and_a_parent_still_counts(tmp_path):
    base = "sys/fs/cgroup/cpu,cpuacct"
    files = {
        f"{base}/docker/abc/cpu.cfs_quota_us": "-1\n",
        f"{base}/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    _tree(tmp_path, V1_CGROUP, files)
    assert quota.read(tmp_path) is None
    files |= {
        f"{base}/docker/cpu.cfs_quota_us": "400000",
        f"{base}/docker/cpu.cfs_period_us": "100000",
    }
    _tree(tmp_path, V1_CGROUP, files)
    assert quota.read(tmp_path) == 4.0


def test_v1_container_mount_whose_root_is_the_cgroup(tmp_path):
    """Docker without a cgroup namespace: /proc/self/cgroup says /docker/abc, and the
    mount's own root is /docker/abc: its files are at the mount point."""
    mountinfo = (
        "40 35 0:35 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid master:17"
        " - cgroup cgroup rw,cpu,cpuacct\n"
        "41 35 0:36 /docker/abc /sys/fs/cgroup/memory ro master:18 - cgroup cgroup rw,memory\n"
    )
    base = "sys/fs/cgroup/cpu,cpuacct"
    _tree(
        tmp_path,
        V1_CGROUP,
        {f"{base}/cpu.cfs_quota_us": "50000", f"{base}/cpu.cfs_period_us": "100000"},
        mountinfo,
    )
    assert quota.read(tmp_path) == 0.5
    assert quota.cpus(tmp_path) == 1


def test_v1_and_v2_together_take_the_smaller(tmp_path):
    cgroup = "4:cpu:/a\n0::/b\n"
    _tree(
        tmp_path,
        cgroup,
        {
            "sys/fs/cgroup/cpu/a/cpu.cfs_quota_us": "300000",
            "sys/fs/cgroup/cpu/a/cpu.cfs_period_us": "100000",
            "sys/fs/cgroup/b/cpu.max": "200000 100000",
        },
    )
    assert quota.read(tmp_path) == 2.0


# --- what cannot be read is no quota --------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "",
        "\n",
        "abc 100000",
        "200000",
        "200000 0",
        "0 100000",
        "-5 100000",
        "200000 100000 7",
        "2e5 1e5",
        b"\xff\xfe\x00\x01",
    ],
)
def test_v2_malformed_cpu_max_is_no_quota(tmp_path, content):
    _tree(tmp_path, "0::/a\n", {"sys/fs/cgroup/a/cpu.max": content})
    assert quota.read(tmp_path) is None


@pytest.mark.parametrize(
    ("quota_us", "period_us"),
    [("", "100000"), ("x", "100000"), ("200000", ""), ("200000", "0"), ("200000", "-1")],
)
def test_v1_malformed_files_are_no_quota(tmp_path, quota_us, period_us):
    base = "sys/fs/cgroup/cpu,cpuacct/docker/abc"
    files = {f"{base}/cpu.cfs_quota_us": quota_us, f"{base}/cpu.cfs_period_us": period_us}
    _tree(tmp_path, V1_CGROUP, files)
    assert quota.read(tmp_path) is None


def test_unreadable_cpu_max_is_no_quota(tmp_path):
    (tmp_path / "sys/fs/cgroup/a/cpu.max").mkdir(parents=True)  # a directory: EISDIR
    _tree(tmp_path, "0::/a\n", {})
    assert quota.read(tmp_path) is None


@pytest.mark.parametrize(
    "cgroup",
    [
        "",
        "garbage",
        "0::relative/path\n",
        "::::\n",
        "0::/../../..\n",  # outside the namespace: only the mount's root is read
        "0::/a\x00b\n",
        b"\xff\xfe",
    ],
)
def test_malformed_proc_self_cgroup_is_no_quota(tmp_path, cgroup):
    _tree(tmp_path, "", {"sys/fs/cgroup/a/cpu.max": "100000 100000"})
    path = tmp_path / "proc/self/cgroup"
    path.write_bytes(cgroup if isinstance(cgroup, bytes) else cgroup.encode())
    assert quota.read(tmp_path) is None


def test_malformed_mountinfo_falls_back_to_the_usual_places(tmp_path):
    _tree(
        tmp_path,
        "0::/a\n",
        {"sys/fs/cgroup/a/cpu.max": "100000 100000"},
        mountinfo="nonsense\n1 2 3\n - cgroup2\n\\777 \\\n",
    )
    assert quota.read(tmp_path) == 1.0


def test_no_files_at_all_is_no_quota(tmp_path, monkeypatch):
    assert quota.read(tmp_path) is None
    assert quota.read(tmp_path / "missing") is None
    _on(monkeypatch, tmp_path, usable=5)
    assert threads.num_threads() == 5


# --- read once; the environment still wins ------------------------------------------


def test_the_quota_is_read_once_per_process_and_a_fork_child_keeps_it(monkeypatch):
    reads = []

    def counted(root="/"):
        reads.append(root)
        return 1.5

    monkeypatch.setattr(quota, "read", counted)
    quota.cpus.cache_clear()
    try:
        assert [quota.cpus() for _ in range(3)] == [2, 2, 2]
        assert reads == ["/"]
        if hasattr(os, "fork"):
            r, w = os.pipe()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
                pid = os.fork()
            if pid == 0:  # the child: report, never return into pytest
                try:
                    os.write(w, f"{quota.cpus()} {len(reads)}".encode())
                finally:
                    os._exit(0)
            os.close(w)
            with os.fdopen(r) as pipe:
                assert pipe.read() == "2 1"
            os.waitpid(pid, 0)
    finally:
        quota.cpus.cache_clear()  # the real reading again, for later tests


def test_the_environment_variable_still_wins(tmp_path, monkeypatch):
    _tree(tmp_path, "0::/a\n", {"sys/fs/cgroup/a/cpu.max": "100000 100000"})
    _on(monkeypatch, tmp_path)
    assert threads.num_threads() == 1
    monkeypatch.setenv(threads.ENV, "7")
    assert threads.num_threads() == 7


# --- onnxruntime's intra-op threads under our host -----------------------------------


def _onnxruntime():
    for package in ("onnxruntime", "onnxruntime_extensions"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"the onnxruntime host needs {package}")
    import onnxruntime as ort

    from onnx_recurrent.runtime.hosts import onnxruntime as host

    return ort, host


@pytest.fixture(scope="module")
def model():
    from models import node_model, random_inputs

    return node_model("GRU", random_inputs("GRU", T=5, N=2, I=4, H=8), {})


def _host_options(model, sess_options=None):
    """The onnxruntime session options the host made for a session of ``model``."""
    import onnx_recurrent as orc

    session = orc.InferenceSession(model, sess_options=sess_options, host="onnxruntime")
    return session._host._options


def test_onnxruntime_intra_op_threads_get_the_quota(monkeypatch, model):
    ort, host = _onnxruntime()
    monkeypatch.delenv(host.ORT_THREADS_ENV, raising=False)
    monkeypatch.setattr(threads, "_usable_cpus", lambda: 16)
    monkeypatch.setattr(quota, "cpus", lambda: 2)
    assert _host_options(model).intra_op_num_threads == 2
    mine = ort.SessionOptions()
    mine.log_severity_level = 3
    assert _host_options(model, mine).intra_op_num_threads == 2
    assert mine.intra_op_num_threads == 0  # the caller's options unchanged


def test_onnxruntime_intra_op_threads_the_caller_set_are_kept(monkeypatch, model):
    ort, _host = _onnxruntime()
    monkeypatch.setattr(threads, "_usable_cpus", lambda: 16)
    monkeypatch.setattr(quota, "cpus", lambda: 2)
    mine = ort.SessionOptions()
    mine.intra_op_num_threads = 3
    assert _host_options(model, mine).intra_op_num_threads == 3
    assert mine.intra_op_num_threads == 3


@pytest.mark.parametrize("case", ["no quota", "quota above the CPUs", "ORT_INTRA_OP_NUM_THREADS"])
def test_onnxruntime_keeps_its_own_default_without_a_binding_quota(monkeypatch, model, case):
    _ort, host = _onnxruntime()
    monkeypatch.delenv(host.ORT_THREADS_ENV, raising=False)
    monkeypatch.setattr(threads, "_usable_cpus", lambda: 16)
    monkeypatch.setattr(quota, "cpus", lambda: 2)
    if case == "no quota":
        monkeypatch.setattr(quota, "cpus", lambda: None)
    elif case == "quota above the CPUs":
        monkeypatch.setattr(quota, "cpus", lambda: 32)
    else:
        monkeypatch.setenv(host.ORT_THREADS_ENV, "1")  # onnxruntime reads it itself
    assert _host_options(model).intra_op_num_threads == 0


# --- a real cgroup, where the machine allows one -------------------------------------

CHILD = (
    "import sys; sys.stdin.readline(); "
    "import onnx_recurrent.quota as q, onnx_recurrent.threads as t; "
    "print(q.read(), t.num_threads())"
)


def _mount(version: int) -> Path:
    """The mount point of the cgroup hierarchy that holds the CPU quota, or skip."""
    if not sys.platform.startswith("linux"):
        pytest.skip("cgroups are Linux's")
    mounts = [Path(point) for v, point, _ in quota._mounts(Path("/")) if v == version]
    if not mounts:
        pytest.skip(f"no cgroup v{version} {'cpu controller ' if version == 1 else ''}mounted")
    if version == 2:
        controllers = _read(mounts[0] / "cgroup.subtree_control")
        if "cpu" not in controllers.split():
            pytest.skip(
                f"cgroup v2 at {mounts[0]} does not give its children the cpu controller "
                f"(cgroup.subtree_control: {controllers.strip()!r})"
            )
    if not os.access(mounts[0], os.W_OK):
        pytest.skip(f"no permission to create a cgroup under {mounts[0]}")
    return mounts[0]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def _cgroup(mount: Path, files: dict[str, str]):
    """A new child cgroup of ``mount`` with ``files`` written (in order), removed after."""
    directory = mount / f"onnx-recurrent-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        directory.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a cgroup under {mount}: {e}")
    try:
        for name, value in files.items():
            try:
                (directory / name).write_text(value)
            except OSError as e:
                pytest.skip(f"cannot write {value!r} to {directory / name}: {e}")
        yield directory
    finally:
        for _ in range(50):  # the child's exit may take a moment to leave the cgroup
            try:
                directory.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            warnings.warn(f"could not remove the test cgroup {directory}", stacklevel=1)


def _child_in(directory: Path) -> str:
    """A fresh interpreter moved into the cgroup ``directory`` before it reads the
    quota; what it prints: the quota and the default threads."""
    env = {k: v for k, v in os.environ.items() if k != threads.ENV}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        try:
            (directory / "cgroup.procs").write_text(str(child.pid))
        except OSError as e:
            pytest.skip(f"cannot move a process into {directory}: {e}")
        out, err = child.communicate("go\n", timeout=TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == 0, err
    return out.strip()


def test_real_cgroup_v2_quota_of_one_cpu():
    mount = _mount(2)
    with _cgroup(mount, {"cpu.max": "100000 100000"}) as directory:
        assert _child_in(directory) == "1.0 1"


def test_real_cgroup_v1_quota_of_one_cpu():
    mount = _mount(1)
    files = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
    with _cgroup(mount, files) as directory:
        assert _child_in(directory) == "1.0 1"


# --- an affinity mask narrower than the machine (taskset) ----------------------------


@pytest.mark.parametrize("usable, expected", [(2, 2), (16, 0)])
def test_onnxruntime_intra_op_threads_get_a_narrower_affinity_mask(
    monkeypatch, model, usable, expected
):
    # onnxruntime's default pool sizes itself from the machine and pins its threads to
    # the machine's cores, outside the mask: the host and the bench's peer give it the
    # mask's CPUs instead (0 where the mask is the whole machine: its own default)
    _ort, host = _onnxruntime()
    from onnx_recurrent.tools.check.peers import onnxruntime_options

    monkeypatch.delenv(host.ORT_THREADS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(threads, "_usable_cpus", lambda: usable)
    monkeypatch.setattr(quota, "cpus", lambda: None)
    assert threads.confined_pool_size() == expected
    assert _host_options(model).intra_op_num_threads == expected
    assert onnxruntime_options().intra_op_num_threads == expected
    assert onnxruntime_options(3).intra_op_num_threads == 3


MASKED_CHILD = """
import glob, os, sys, time

mask = {min(os.sched_getaffinity(0))}
os.sched_setaffinity(0, mask)  # before any import starts a thread (OpenBLAS's)
from models import node_model, random_inputs
import onnx_recurrent as orc
from onnx_recurrent.tools.check.peers import onnxruntime_session

inputs = random_inputs("GRU", T=5, N=2, I=4, H=8)
model = node_model("GRU", inputs, {"hidden_size": 8}, constants=["W", "R", "B"])
feeds = {k: v for k, v in inputs.items() if k not in ("W", "R", "B")}
if sys.argv[1] == "host":
    orc.InferenceSession(model, host="onnxruntime").run(None, feeds)
else:
    onnxruntime_session(model).run(None, feeds)
outside = set()
for _ in range(20):  # a new pool thread pins itself once it runs: watch for a while
    time.sleep(0.05)
    for task in glob.glob(f"/proc/{os.getpid()}/task/*/status"):
        allowed = next(l for l in open(task) if l.startswith("Cpus_allowed_list"))
        cpus = set()
        for part in allowed.split(":")[1].strip().split(","):
            a, _, b = part.partition("-")
            cpus.update(range(int(a), int(b or a) + 1))
        if not cpus <= mask:
            outside.add(allowed.strip())
print(sorted(outside))
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="one CPU"
)
@pytest.mark.parametrize("face", ["host", "bench peer"])
def test_onnxruntime_threads_stay_within_a_narrower_affinity_mask(face):
    # onnxruntime's default pool pins a thread to each physical core of the machine:
    # under taskset the host's sessions and the bench's peer ran outside the mask
    _onnxruntime()
    env = {k: v for k, v in os.environ.items() if k != "ORT_INTRA_OP_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", MASKED_CHILD, face.split()[0]],
        capture_output=True, text=True, env=env, timeout=TIMEOUT * 5,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout
