"""Where the numba kernels cache their compiled code: the one owner of that fault.

The kernels are compiled with ``cache=True``, so that a process loads them instead of
compiling them again (seconds per kernel). numba writes its cache next to the source
(``__pycache__``), in ``NUMBA_CACHE_DIR`` when set, or in its user cache directory;
where none of these can be written, numba refuses the function ("cannot cache
function"), and every call would fail. :func:`jit` decides once per process, for the
directory of the decorated functions' source, on the first function decorated:

1. numba's own choice, where it finds a writable directory: nothing changes;
2. else a per-user directory of ours: ``onnx-recurrent/numba`` in the platform's user
   cache directory (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux), then
   ``onnx-recurrent-<uid>/numba`` in the temporary directory, private to the user (a
   cache is loaded as code: a directory others can write is refused), handed to numba
   through its process-wide ``CACHE_DIR`` while it decorates (:func:`numba_cache_dir`);
3. else no cache, with one :class:`CompileCacheWarning` naming the directories tried.

It also owns when compiling happens. The kernels that Python calls (the *entries*)
are compiled or loaded by :func:`prepare` when a layer is prepared, out of Ctrl-C's
reach (an interrupt inside numba's compiler can leave its lock held, and a pool
thread waiting for that lock hangs the process): on the main thread, on a thread of
its own that the main thread waits for, so that Ctrl-C stops the wait at once
(:func:`~onnx_recurrent.threads.compiling`); afterwards an entry converts its
arguments to a prepared signature and never compiles on a call's path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numba
from numba.core import caching, config, serialize, sigutils
from numba.core.ccallback import CFunc

from ..threads import ForkLock, compiling
from .cache_dirs import (
    CompileCacheWarning,
    first_usable,
    read_regular,
    readable_roots,
    replacing,
    warn_once,
    writable,
    write_atomic,
)

if TYPE_CHECKING:
    from numba.core.dispatcher import Dispatcher

__all__ = [
    "CompileCacheWarning",
    "cache_index",
    "cache_state",
    "cfunc",
    "cfunc_code",
    "jit",
    "numba_cache_dir",
    "prepare",
]


_lock = ForkLock()
#: source directory -> cache root of ours ("" for numba's own choice, None for no cache)
_cache_roots: dict[str, str | None] = {}
#: the largest cache file :func:`_seed` copies (numba's are a few MB)
SEED_LIMIT = 1 << 28
#: (dispatcher, signature) pairs prepared (``dispatcher.signatures`` is a new list)
_prepared: set[tuple] = set()
#: the cached dispatchers, for :func:`cache_state`
_cached: list = []


def jit(**options) -> Callable:
    """``numba.njit(cache=True, **options)``, with a cache that never fails a call.

    Parameters
    ----------
    **options
        numba's options (``nogil``, ``fastmath``, ...), ``cache`` excepted.
    """

    def decorate(func: Callable) -> Callable:
        return _cached_compile(numba.njit, func, options)

    return decorate


def cfunc(signature, func: Callable, **options):
    """``numba.cfunc(signature, cache=True, **options)(func)`` with the cache of
    :func:`jit` (compiled or loaded now, out of Ctrl-C's reach:
    :func:`~onnx_recurrent.threads.compiling`)."""

    def make(cache: bool, **options):  # numba.cfunc, its cache sealed before it loads
        def decorate(func: Callable) -> CFunc:
            compiled = CFunc(func, sigutils.normalize_signature(signature), {}, options)
            if cache:
                compiled.enable_caching()
                _seal(compiled)
            compiled.compile()
            return compiled

        return decorate

    return compiling(lambda: _cached_compile(make, func, options))


def cfunc_code(signature, func: Callable, **options) -> tuple[str, str]:
    """The LLVM IR (callees linked in) and the symbol of ``numba.cfunc(signature,
    **options)(func)``, compiled now, not loaded from numba's cache (whose code cannot
    be read back), out of Ctrl-C's reach (:func:`~onnx_recurrent.threads.compiling`);
    its callees come from the cache (:mod:`.native_code` keeps the result as machine
    code)."""

    def build():
        return numba.cfunc(signature, cache=False, **options)(func)

    def once_more():  # a callee's cache files damaged, or not written (a full disk)
        try:
            return build()
        except (MemoryError, numba.core.errors.NumbaError):
            raise  # no memory, or the code's fault: not the cache's
        except Exception as e:
            _warn_fault(func, e)
            _heal()  # then the callees compiled so far are kept, in memory
            return build()

    compiled = compiling(once_more)
    return compiled.inspect_llvm(), compiled.native_name


def _cached_compile(make: Callable, func: Callable, options: dict):
    with _lock:
        root = _cache_root(func)
        if root is not None:
            try:
                with numba_cache_dir(root or None):
                    compiled = make(cache=True, **options)(func)
                if make is numba.njit:
                    _seal(compiled)
                    _cached.append(compiled)
                return compiled
            except RuntimeError:  # a directory found writable was taken away since
                _warn([root] if root else _numba_dirs(inspect.getfile(func)), 4)
            except Exception as e:
                _warn_fault(func, e)
        return make(cache=False, **options)(func)


#: the head of a file sealed by :class:`_SealedCacheFile` (the sha256 of the rest follows)
SEAL = b"onnx-recurrent sealed 2\n"


class _SealedCacheFile(caching.IndexDataCacheFile):
    """numba's cache files sealed: each file (index and data) the sha256 of its content
    ahead of it, checked before anything in it is read, and each data file its
    function's and its entry's key inside.

    numba runs the machine code of its data files as it finds them: a bit flipped on
    disk or a bad copy crashed every later process, or gave a wrong answer; a flipped
    length in an index made every later process run out of memory reading it. A file
    that fails the check, was written for another function or signature (numba's key
    alone does not tell functions of the same bytecode apart), is not a regular file
    (a named pipe would block), past :data:`SEED_LIMIT`, or numba's own (unsealed: an
    older onnx-recurrent's, which reads ours as damaged and writes its own anew) is
    taken for missing: the kernel is compiled again and its files written anew.
    """

    def save(self, key, data):
        super().save(key, (self._index_name, key, data))

    def load(self, key):
        entry = super().load(key)
        if entry is None:
            return None
        *saved, data = entry  # not the function's or the key's: an index naming another's
        return data if saved == [self._index_name, key] else None

    def _load_index(self):
        payload = _unsealed(self._index_path)
        if payload is None:
            return {}  # missing, damaged, another format: compiled again, written anew
        version, stamp, overloads = pickle.loads(payload)
        return overloads if (version, stamp) == (self._version, self._source_stamp) else {}

    def _save_index(self, overloads):
        _write_sealed(self._index_path, (self._version, self._source_stamp, overloads))

    def _load_data(self, name):
        payload = _unsealed(os.path.join(self._cache_path, name))
        if payload is None:  # numba's load takes OSError for a file gone: a miss
            raise OSError(f"numba's cache file {name} is missing or fails its check")
        return pickle.loads(payload)

    def _save_data(self, name, data):
        _write_sealed(os.path.join(self._cache_path, name), data)


def _write_sealed(path: str, value: Any) -> None:
    """``value`` pickled as numba pickles it, its sha256 ahead, written whole at
    ``path`` (:func:`~.cache_dirs.replacing`; OSError where it cannot be)."""
    payload = serialize.dumps(value)
    with replacing(path) as f:
        f.write(SEAL + hashlib.sha256(payload).digest() + payload)


def _unsealed(path: str) -> memoryview | None:
    """The content of the sealed file ``path``; None where it is missing, not a regular
    file, past :data:`SEED_LIMIT`, unsealed, or fails its sha256 (warned once)."""
    try:
        sealed = read_regular(path, SEED_LIMIT)
    except OSError:
        return None
    if sealed is None or len(sealed) > SEED_LIMIT or not sealed.startswith(SEAL):
        return None
    head = len(SEAL) + 32
    payload = memoryview(sealed)[head:]
    if hashlib.sha256(payload).digest() != sealed[len(SEAL) : head]:
        _warn_damaged(os.path.basename(path))
        return None
    return payload


def _seal(function: Dispatcher) -> None:
    """Make the cache of numba's ``function`` (a dispatcher or a cfunc: the same
    ``_cache``) keep its data files sealed (:class:`_SealedCacheFile`)."""
    if not isinstance(function._cache, caching.NullCache):
        function._cache._cache_file.__class__ = _SealedCacheFile


@contextlib.contextmanager
def numba_cache_dir(root: str | None) -> Iterator[None]:
    """``numba.config.CACHE_DIR`` (``NUMBA_CACHE_DIR``) set to ``root`` for the block,
    then restored (None: left as it is).

    numba has no per-function cache directory: it reads this process-wide setting
    when it builds a function's cache (on ``cache=True``). For the block, another
    thread's numba function decorated with ``cache=True`` caches in ``root`` too;
    :func:`jit` and :func:`cfunc` hold it only while they decorate (a cfunc compiles
    then), and only where numba's own choice is not writable.
    """
    if root is None:
        yield
        return
    saved = config.CACHE_DIR
    config.CACHE_DIR = root
    try:
        yield
    finally:
        config.CACHE_DIR = saved


def prepare(dispatcher, signature: tuple) -> None:
    """Compile (or load from the cache) ``dispatcher`` for the argument types
    ``signature``, out of Ctrl-C's reach (:func:`~onnx_recurrent.threads.compiling`);
    from then on the dispatcher compiles nothing at call time: arguments of other
    types are converted to a prepared signature (an array to an ``'A'`` or read-only
    one), and a call that matches none raises TypeError.

    Parameters
    ----------
    dispatcher
        A function decorated by :func:`jit`.
    signature : tuple of numba types
        Its argument types.
    """
    signature = tuple(signature)
    if (dispatcher, signature) in _prepared:
        return
    if signature in dispatcher.signatures:
        _prepared.add((dispatcher, signature))
        return
    compiling(lambda: _compile(dispatcher, signature))


def _compile(dispatcher, signature: tuple) -> None:
    if signature in dispatcher.signatures:  # since the check, by a call Ctrl-C stopped
        _prepared.add((dispatcher, signature))
        return
    dispatcher.disable_compile(False)  # numba's switch for compiling at call time
    try:
        try:
            dispatcher.compile(signature)
        except MemoryError:
            raise  # no memory to load or compile it: not the cache's fault
        except Exception as e:
            if isinstance(dispatcher._cache, caching.NullCache):
                raise
            # a cache file cut short (a process killed while writing it, a full
            # disk) or one that cannot be written: numba raises EOFError, an
            # unpickling error or OSError, in every process, for this kernel or a
            # callee's. Each kernel whose files cannot be read has its index emptied
            # (compiled again and written anew, here and in later processes); what
            # still fails is compiled without the cache.
            _warn_fault(dispatcher, e)
            if _heal():
                try:
                    dispatcher.compile(signature)
                except MemoryError:
                    raise
                except Exception:
                    pass
            if signature not in dispatcher.signatures:
                dispatcher._cache = caching.NullCache()
                dispatcher.compile(signature)
    finally:
        if dispatcher.signatures:  # numba asserts there is one (it hid the error)
            dispatcher.disable_compile(True)
    _prepared.add((dispatcher, signature))


def _heal() -> bool:
    """Empty the cache index of each kernel decorated so far whose index or data files
    cannot be read (numba compiles it again and writes them anew); where the index
    cannot be written either, that kernel goes without a cache in this process.
    Whether any was found."""
    found = False
    for dispatcher in _cached:
        cache = dispatcher._cache
        if isinstance(cache, caching.NullCache):
            continue
        try:
            _load_all(dispatcher)
        except MemoryError:
            raise
        except Exception:
            found = True
            try:
                cache.flush()
            except Exception:
                dispatcher._cache = caching.NullCache()
    return found


def cache_state() -> tuple[bool, str | None]:
    """Whether the kernels decorated so far have compiled code in their cache (any of
    them: none on first use), and the cache directory (None: no cache)."""
    found, where = False, None
    for dispatcher in _cached:
        try:
            where = dispatcher.stats.cache_path
            found = found or bool(cache_index(dispatcher))
        except Exception:  # another numba: say it is cached rather than guess
            return True, where
    return found, where


def cache_index(dispatcher: Dispatcher) -> dict:
    """numba's cache index of ``dispatcher`` ({} when missing or stale).

    numba has no public API for whether a function has code in its cache: this reads
    its private index, guarded by tests/test_foreign_names.py.
    """
    return dispatcher._cache._cache_file._load_index()


def _load_all(dispatcher: Dispatcher) -> None:
    """Read every kernel in ``dispatcher``'s cache (numba's private files, as
    :func:`cache_index`): an error where one cannot be read."""
    for key in cache_index(dispatcher):
        dispatcher._cache._cache_file.load(key)


def _cache_root(func: Callable) -> str | None:
    """The cache root for ``func``'s source directory, decided on its first function;
    a warm cache that cannot be written (:func:`_seed`) copied there first."""
    source = os.path.abspath(inspect.getfile(func))
    directory = os.path.dirname(source)
    if directory in _cache_roots:
        return _cache_roots[directory]
    try:
        chosen = caching.FunctionCache(func).cache_path  # what numba does for cache=True
        root: str | None = ""
    except RuntimeError:
        root, ours = first_usable("numba")
        if root is None:
            _warn(_numba_dirs(source) + ours, stacklevel=4)
        chosen = None
    if root:
        chosen = _user_provided(func, source, root)
    # warm caches numba passes over as it cannot write them: the package's own
    # (installed by another user) and ours that cannot be written
    in_tree = os.path.join(directory, "__pycache__")
    shipped = [in_tree] if chosen != in_tree and not writable(in_tree) else []
    shipped += [
        _user_provided(func, source, r)
        for r in readable_roots("numba")
        if r != root and not writable(r)
    ]
    shipped = [d for d in shipped if d != chosen and _kernel_files(d)]
    if shipped and (chosen is None or not _seed(chosen, shipped, _stamps(func, directory))):
        warnings.warn(
            f"the kernels' cache in {shipped[0]} cannot be written, and numba uses "
            f"only a cache it can write: they are compiled again (1-3 minutes) and "
            f"cached in {chosen or 'none'}",
            CompileCacheWarning,
            stacklevel=4,
        )
    _cache_roots[directory] = root
    return root


def _user_provided(func: Callable, source: str, root: str) -> str:
    """The directory numba caches ``func`` in under ``NUMBA_CACHE_DIR=root``."""
    with numba_cache_dir(root):
        return caching.UserProvidedCacheLocator(func, source).get_cache_path()


def _kernel_files(directory: str) -> list[str]:
    """numba's cache index files in ``directory`` ([] where none)."""
    try:
        return sorted(n for n in os.listdir(directory) if n.endswith(".nbi"))
    except OSError:
        return []


def _fresh_data(index: str, stamp: Callable[[str], Any]) -> list[str] | None:
    """The data files the numba cache index ``index`` names, where it is fresh: this
    numba's, and stamped as ``stamp(module)`` stamps its module's source now (numba's
    own check); None where it is stale or cannot be read (numba would compile the
    kernel again)."""
    try:
        expected = stamp(os.path.basename(index).split(".", 1)[0])
        payload = _unsealed(index)
        version, found, overloads = pickle.loads(payload)  # type: ignore[arg-type]
    except Exception:  # missing, damaged, another format: not to be copied
        return None
    if version != numba.__version__ or found != expected:
        return None
    if not isinstance(overloads, dict) or not all(isinstance(v, str) for v in overloads.values()):
        return None
    return sorted(set(overloads.values()))


def _stamps(func: Callable, source_dir: str) -> Callable[[str], Any]:
    """``stamp(module)``: how numba stamps the source of ``module`` in ``source_dir``
    (its locators' ``get_source_stamp``), raising OSError where it has none."""

    @functools.cache
    def stamp(module: str) -> Any:
        source = os.path.join(source_dir, module + ".py")
        with numba_cache_dir(source_dir):
            return caching.UserProvidedCacheLocator(func, source).get_source_stamp()

    return stamp


def _seed(chosen: str, shipped: list[str], stamp: Callable[[str], Any]) -> bool:
    """Copy into ``chosen``, the directory numba caches in, the kernels it lacks fresh
    from ``shipped``: warm caches it cannot write (a container image's package
    installed by another user, a read-only mount), which numba passes over, compiling
    every kernel again (1-3 minutes a process). A kernel is copied where ``chosen``
    has no fresh index of it (:func:`_fresh_data`; an earlier install's is stale) and a
    shipped one is fresh: its data files first, then its index, each written whole
    (:func:`~.cache_dirs.write_atomic`), so a process beside this one reads a kernel's
    files or none. Whether every kernel fresh in a shipped cache now is in ``chosen``,
    and any is (a shipped cache wholly stale, another numba's: compiled again)."""
    try:
        os.makedirs(chosen, exist_ok=True)
    except OSError:
        return False
    names = {n for directory in shipped for n in _kernel_files(directory)}
    fresh = {n for n in names if _fresh_data(os.path.join(chosen, n), stamp) is not None}
    wanted: set[str] = set()  # fresh in a shipped cache
    for directory in shipped:
        for name in _kernel_files(directory):
            if name in fresh:
                continue
            data = _fresh_data(os.path.join(directory, name), stamp)
            if data is not None:
                wanted.add(name)
                if all(_copy(directory, chosen, n) for n in [*data, name]):
                    fresh.add(name)
    return bool(fresh) and wanted <= fresh


def _copy(source: str, target: str, name: str) -> bool:
    try:
        data = read_regular(os.path.join(source, name), SEED_LIMIT)
    except OSError:
        return False
    return data is not None and write_atomic(os.path.join(target, name), data)


def _numba_dirs(source: str) -> list[str]:
    """The directories numba tries for a function of ``source`` (for the warning)."""
    dirs = [config.CACHE_DIR] if config.CACHE_DIR else []
    dirs.append(os.path.join(os.path.dirname(source), "__pycache__"))
    try:
        from numba.misc.appdirs import AppDirs

        dirs.append(AppDirs(appname="numba", appauthor=False).user_cache_dir)
    except (ImportError, AttributeError):
        pass
    return dirs


def _warn_fault(function: Any, error: BaseException) -> None:
    """One :class:`CompileCacheWarning` a process for numba cache files that failed."""
    name = getattr(function, "__name__", None) or getattr(function, "py_func", function)
    warn_once(
        "fault",
        f"numba's compilation cache failed for {name} ({type(error).__name__}: {error}; "
        "a file cut short, or a full disk): the kernels whose cache files cannot be read "
        "are compiled again, and cached anew where the cache can be written.",
        stacklevel=4,
    )


def _warn_damaged(name: str) -> None:
    """One :class:`CompileCacheWarning` a process for a sealed cache file that fails."""
    warn_once(
        "damaged",
        f"numba's cache file {name} is damaged (it fails its sha256): its kernel is "
        "compiled again and the file written anew; check the disk if this recurs",
        stacklevel=2,
    )


def _warn(tried: list[str], stacklevel: int) -> None:
    warn_once(
        "uncached",
        "numba cannot write its compilation cache in any of "
        f"{', '.join(map(repr, tried))}: the kernels are compiled without caching, "
        "again in each process. Set NUMBA_CACHE_DIR to a writable directory to cache them.",
        stacklevel=stacklevel,
    )
