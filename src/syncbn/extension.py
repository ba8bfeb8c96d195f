"""Build (once per node, cached on disk) and load the SyncBN C++/CUDA kernel extension.

`load_extension()` returns the compiled module with the eight ops of csrc/syncbn.h. The first call on
a machine compiles it with ninja into a cache directory (default `<repo>/build/torch_extensions`,
override with SYNCTRAIN_EXTENSIONS_DIR); every later process imports the cached library directly.

Design choices (why this is hand-written rather than a bare `torch.utils.cpp_extension.load`):
- Cache key. Each variant is built under its own name and directory, `syncbn_cpu_<isa>_<hash>` or
  `syncbn_cuda_<isa>_<archs>_<hash>` (archs: the CUDA arch list, "8.0;9.0+PTX" -> `sm80sm90ptx`),
  where the hash covers everything the library depends on (`_digest`): sources, headers, compile and
  link flags, the CUDA arch list, this file (the build code), the compiler and the linker it runs and,
  for CUDA, the toolkit's nvcc (each by resolved path and `--version`), PyTorch and Python. The CPU-only
  and the CUDA variant can therefore never collide, any change that could change the library (an edited
  source, an upgraded compiler, another toolkit) gets a fresh build, and the ahead-of-time build
  (`python -m src.syncbn.build`) produces exactly the directory this loader looks for. A finished build
  deletes the older builds of its own variant (the name up to the hash) only: ranks of one node that build
  for different GPU architectures or CPU capabilities keep each other's builds, and a build some process is
  importing is never deleted.
- CUDA only with a toolkit. With GPUs visible, the CUDA variant is chosen when it is already built or
  a usable nvcc matching torch.version.cuda is found (src/syncbn/toolkit.py); otherwise the CPU-only
  variant is, so CPU tensors still work, and `cuda_kernels_problem()` says why CUDA tensors cannot
  (the trainer's config validation raises it before training starts).
- Emulated CUDA variant. `load_emulated_cuda_extension()` builds csrc/cuda/*.cu with the host
  compiler against the SIMT emulation in csrc/simt/ (`syncbn_cudaemu_<hash>`): the CUDA kernels run,
  bounds-checked, on CPU tensors, so tests exercise them on machines without a GPU. It needs no nvcc,
  is never what `load_extension()` returns, and is what `src.syncbn.functions.kernel_ops()` returns
  when SYNCTRAIN_SYNCBN_KERNELS=cuda-emulated.
- CPU instruction set. `at::vec::Vectorized` picks its width at compile time from the
  CPU_CAPABILITY_* macros. `-march=native` would tie a Docker image's AOT build to the build host's
  CPU (SIGILL elsewhere), and mixing ISAs inside one library risks the linker keeping an AVX-512
  copy of a shared inline function. So we build one homogeneous library per capability (default,
  avx2, avx512, the same flags PyTorch uses for its own kernels) and pick the one matching
  `torch.backends.cpu.get_cpu_capability()` (which honours ATEN_CPU_CAPABILITY) at load time.
- OpenMP. `at::parallel_for` is an inline template that only runs in parallel when the extension is
  compiled with -fopenmp; the library then links libgomp.so.1, which resolves to the copy PyTorch
  already loaded (same soname), so there is one thread pool.
- One compiler per node. An fcntl lock (released by the kernel if the holder dies, unlike
  PyTorch's own lock file) serialises builds: other processes (torchrun ranks, pytest workers) wait,
  then import the finished library. A failed build leaves a marker so that processes that were
  waiting re-raise the same error instead of compiling again; nobody hangs.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

from src.errors import UserError

from . import toolkit

REPO_ROOT = Path(__file__).resolve().parents[2]
CSRC = REPO_ROOT / "csrc"
DEFAULT_CUDA_ARCH_LIST = "9.0"  # used by `build --cuda` on a machine without a GPU (small on purpose)
LOCK_TIMEOUT_S = float(os.environ.get("SYNCTRAIN_EXTENSIONS_LOCK_TIMEOUT", "3600"))

_BASE_CFLAGS = ["-O3", "-fopenmp", "-DNDEBUG"]
_LDFLAGS = ["-fopenmp"]
# Same per-capability flags PyTorch compiles its own vectorised CPU kernels with.
_ISA_CFLAGS = {
    "default": ["-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"],
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
}
CPU_CAPABILITIES = tuple(_ISA_CFLAGS)

_LOADED: dict[str, ModuleType] = {}
_LAST_BUILD: dict[str, object] = {}


class ExtensionBuildError(RuntimeError):
    """The SyncBN extension could not be built (missing tool or compile error)."""


class MissingBuildTool(ExtensionBuildError, UserError):
    """A tool the build needs is not installed (ninja, a C++ compiler, the Python headers, the CUDA toolkit): the
    user's to install, so one message without a traceback (src/errors.py), still an ExtensionBuildError."""


@dataclass(frozen=True)
class BuildSpec:
    """Everything that identifies one compiled variant of the extension."""

    name: str
    build_dir: Path
    sources: tuple[str, ...]
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    with_cuda: bool
    cpu_capability: str
    cuda_arch_list: str | None
    env: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def library(self) -> Path:
        """Path of the compiled Python module."""
        return self.build_dir / f"{self.name}{_lib_suffix()}"

    @property
    def ok_marker(self) -> Path:
        """Written after a successful build: the library is complete."""
        return self.build_dir / "BUILD_OK"


def _lib_suffix() -> str:
    return ".pyd" if sys.platform == "win32" else ".so"


def extensions_dir() -> Path:
    """Cache directory for compiled variants (SYNCTRAIN_EXTENSIONS_DIR or <repo>/build/torch_extensions)."""
    env = os.environ.get("SYNCTRAIN_EXTENSIONS_DIR")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "build" / "torch_extensions"


def default_cpu_capability() -> str:
    """The ISA variant for this machine: SYNCTRAIN_CPU_CAPABILITY, else PyTorch's own detection."""
    forced = os.environ.get("SYNCTRAIN_CPU_CAPABILITY")
    if forced:
        if forced not in _ISA_CFLAGS:
            raise ValueError(f"SYNCTRAIN_CPU_CAPABILITY={forced!r}; expected one of {CPU_CAPABILITIES}")
        return forced
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "default"  # Vectorized uses NEON/SVE/VSX from compiler macros on other CPUs
    cap = torch.backends.cpu.get_cpu_capability().upper()
    if cap.startswith("AVX512"):
        return "avx512"
    if cap.startswith("AVX2"):
        return "avx2"
    return "default"


def cuda_sources() -> list[Path]:
    """CUDA kernel sources (csrc/cuda/*.cu and host-side *.cpp), empty before they exist."""
    d = CSRC / "cuda"
    return sorted(d.glob("*.cu")) + sorted(d.glob("*.cpp")) if d.is_dir() else []


def cuda_arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST if set, else the visible GPUs' archs, else DEFAULT_CUDA_ARCH_LIST."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return ";".join(f"{a}.{b}" for a, b in sorted(caps))
    return DEFAULT_CUDA_ARCH_LIST


def _arch_tag(arch_list: str) -> str:
    """The CUDA arch list as part of a variant's name (a module name: letters and digits only).

    "8.0;9.0+PTX" -> "sm80sm90ptx", "9.0a" -> "sm90a"; entries separated by ';' or spaces, as
    TORCH_CUDA_ARCH_LIST allows.
    """
    entries = [e for e in re.split(r"[;\s]+", arch_list) if e]
    return "".join("sm" + re.sub(r"[^0-9a-z]", "", e.lower()) for e in entries)


def _variant_of(name: str) -> str:
    """A build's name without its hash: kind, CPU capability and (CUDA) architectures."""
    return name.rsplit("_", 1)[0]


def _headers(*folders: str) -> list[Path]:
    """Headers directly in csrc/ and in the given subfolders: what one variant compiles against."""
    dirs = [CSRC, *(CSRC / f for f in folders)]
    return sorted(p for d in dirs for p in d.glob("*") if p.suffix in (".h", ".cuh", ".hpp"))


def _digest(sources: list[Path], headers: list[Path], flags: list[list[str]], extra: list[str],
            cxx: str | None = None, cuda_home: str | None = None) -> str:
    """12 hex digits of everything the built library depends on, so that a change to any of them builds anew:
    the sources and headers, the compile and link `flags`, `extra` (the CUDA arch list), the build code (this
    file), the compiler and its linker, the CUDA toolkit at `cuda_home` (CUDA builds), PyTorch and Python."""
    digest = hashlib.sha256()
    for p in sorted(set(sources)) + headers:
        digest.update(str(p.relative_to(CSRC)).encode())
        digest.update(p.read_bytes())
    digest.update(Path(__file__).read_bytes())  # how flags are chosen and the build is run
    for part in (*flags, extra, build_toolchain(cxx, cuda_home)):
        digest.update(repr(part).encode())
    return digest.hexdigest()[:12]


def build_toolchain(cxx: str | None = None, cuda_home: str | None = None) -> tuple[str, ...]:
    """What compiles and links the extension, as text: the C++ compiler (`cxx`, default $CXX or c++) and the
    linker it runs, each as resolved path and `--version`; nvcc under `cuda_home` likewise; PyTorch (version,
    commit, CUDA version, install folder) and Python (version, extension-module suffix, headers folder).

    The compiler is found on PATH, also when only loading: a process that cannot find the compiler a library
    was built with does not use that library (it would build its own, and say that a compiler is missing).
    """
    cxx = cxx or os.environ.get("CXX", "c++")
    parts = [*_tool_identity(cxx), *_tool_identity(_linker_of(cxx))]
    if cuda_home:
        parts += [*_tool_identity(str(Path(cuda_home) / "bin" / "nvcc"))]
    parts += [torch.__version__, str(torch.version.git_version), str(torch.version.cuda),
              str(Path(torch.__file__).resolve().parent), sys.version, str(sysconfig.get_config_var("EXT_SUFFIX")),
              str(python_include_dir())]
    return tuple(parts)


def _tool_identity(command: str) -> tuple[str, str]:
    """(resolved path, `--version` output) of a command; ("<name>", "not found") when it is not there (the build
    then stops with check_build_tools' message, which names it)."""
    found = shutil.which(command)
    if found is None:
        return command, "not found"
    path = os.path.realpath(found)
    stat = os.stat(path)
    return path, _version_output(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _version_output(path: str, mtime_ns: int, size: int) -> str:
    """`path --version` (cached per file state: a compiler replaced in place is asked again)."""
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"--version failed: {exc}"
    return (run.stdout + run.stderr).strip()


def _linker_of(cxx: str) -> str:
    """The linker `cxx` runs for the final link (`-print-prog-name=ld`, as GCC and Clang answer), else "ld"."""
    found = shutil.which(cxx)
    if found is None:
        return "ld"
    path = os.path.realpath(found)
    stat = os.stat(path)
    return _ask_linker(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=None)
def _ask_linker(compiler: str, mtime_ns: int, size: int) -> str:
    try:
        run = subprocess.run([compiler, "-print-prog-name=ld"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "ld"
    return run.stdout.strip() or "ld"


def _is_built(spec: BuildSpec) -> bool:
    return spec.ok_marker.exists() and spec.library.exists()


def make_spec(with_cuda: bool | None = None, cpu_capability: str | None = None) -> BuildSpec:
    """Describe the variant to build/load: CUDA when GPUs are visible and it is built or buildable here."""
    if with_cuda is None:
        with_cuda = (torch.cuda.is_available() and bool(cuda_sources())
                     and (_is_built(make_spec(True, cpu_capability)) or toolkit.find_cuda_toolkit().toolkit is not None))
    cap = cpu_capability or default_cpu_capability()
    if cap not in _ISA_CFLAGS:
        raise ValueError(f"cpu_capability={cap!r}; expected one of {CPU_CAPABILITIES}")
    sources = [CSRC / "bindings.cpp", *sorted((CSRC / "cpu").glob("*.cpp"))]
    cflags = list(_BASE_CFLAGS) + _ISA_CFLAGS[cap]
    cuda_cflags: list[str] = []
    arch: str | None = None
    env: dict[str, str] = {}
    if with_cuda:
        if not cuda_sources():
            raise ExtensionBuildError(f"CUDA build requested but {CSRC / 'cuda'} has no .cu sources")
        sources += cuda_sources()
        cflags.append("-DSYNCBN_WITH_CUDA")
        cuda_cflags = ["-O3", "-DSYNCBN_WITH_CUDA"]
        arch = cuda_arch_list()
        env["TORCH_CUDA_ARCH_LIST"] = arch
        found = toolkit.find_cuda_toolkit().toolkit
        if found is not None:
            env["CUDA_HOME"] = str(found.root)
    # Only headers this variant compiles against: CUDA-side edits must not rebuild the CPU variant.
    headers = _headers("cpu", *(["cuda"] if with_cuda else []))
    # The architectures are in the name, not only in the hash: pruning keeps other variants' builds.
    variant = f"syncbn_cuda_{cap}_{_arch_tag(arch)}" if arch else f"syncbn_cpu_{cap}"
    key = _digest(sources, headers, [cflags, cuda_cflags, _LDFLAGS], [arch or ""], cuda_home=env.get("CUDA_HOME"))
    name = f"{variant}_{key}"
    return BuildSpec(name=name, build_dir=extensions_dir() / name, sources=tuple(map(str, sources)),
                     cflags=tuple(cflags), cuda_cflags=tuple(cuda_cflags), ldflags=tuple(_LDFLAGS),
                     with_cuda=with_cuda, cpu_capability=cap, cuda_arch_list=arch, env=env)


def make_emulated_spec(fault: bool = False) -> BuildSpec:
    """The CUDA kernels compiled by the host compiler against the SIMT emulation (csrc/simt/); no nvcc.

    fault=True: the variant built with SYNCTRAIN_SELFCHECK_FAULT, whose batch_norm_backward_reduce returns
    one wrong value on purpose (channel 0's sum(dy * xhat) doubled), for the self-check's own test.
    """
    sources = [*sorted((CSRC / "simt").glob("*.cpp")), *sorted((CSRC / "simt").glob("*.cu")),
               *sorted((CSRC / "cuda").glob("*.cu"))]
    # -x c++: the .cu files are C++ to the host compiler (cpp_extension hands them to it because the
    # variant is built without CUDA). No -DNDEBUG: the emulation's own asserts stay on. -ffp-contract=off: every
    # a * b + c rounds twice, as the kernels' __fmul_rn / __fmaf_rn spell it out where it matters (reduce.cuh).
    # -std=c++20: the emulation is C++20 (std::source_location, <bit>), and PyTorch 2.11 compiles extensions as
    # C++17 (2.13 and later as C++20; the last -std on the line wins).
    cflags = ["-O2", "-DSYNCBN_SIMT", "-x", "c++", "-Wno-unknown-pragmas", "-ffp-contract=off", "-std=c++20"]
    if fault:
        cflags.append("-DSYNCTRAIN_SELFCHECK_FAULT")
    # The compiler goes through csrc/simt/instrumented_cxx.sh, which adds -fsanitize=thread (without its
    # runtime) to the kernel sources (*.cu) only: their loads and stores call the race detector's hooks.
    wrapper = CSRC / "simt" / "instrumented_cxx.sh"
    env = {"CXX": str(wrapper), "SYNCTRAIN_SIMT_CXX": os.environ.get("SYNCTRAIN_SIMT_CXX") or os.environ.get("CXX") or "c++"}
    kind = "cudaemufault" if fault else "cudaemu"
    key = _digest([*sources, wrapper], _headers("cuda", "simt"), [cflags], [], cxx=env["SYNCTRAIN_SIMT_CXX"])
    name = f"syncbn_{kind}_{key}"
    return BuildSpec(name=name, build_dir=extensions_dir() / name, sources=tuple(map(str, sources)),
                     cflags=tuple(cflags), cuda_cflags=(), ldflags=(), with_cuda=False,
                     cpu_capability="default", cuda_arch_list=None, env=env)


def python_include_dir() -> Path:
    """Where this interpreter's C headers (Python.h) are: the folder torch.utils.cpp_extension puts on the
    compile line (the posix_prefix scheme, not a distribution's /usr/local install scheme)."""
    return Path(sysconfig.get_path("include", scheme="posix_prefix"))


def check_build_tools(spec: BuildSpec) -> None:
    """Raise MissingBuildTool naming the missing tool and how to install it."""
    if toolkit.environment_tool("ninja") is None:
        raise MissingBuildTool(
            f"Building the SyncBN extension needs ninja, which is neither in this Python environment "
            f"({sysconfig.get_path('scripts')}) nor on PATH. Install it into this environment: "
            f"`{sys.executable} -m pip install ninja` (requirements.txt lists it; `make setup` installs it).")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise MissingBuildTool(
            f"Building the SyncBN extension needs a C++ compiler, but {cxx!r} (from $CXX, default "
            "'c++') is not on PATH. Install one, e.g. `apt-get install g++` (Debian/Ubuntu) or "
            "`dnf install gcc-c++`, or point CXX at an existing compiler.")
    include = python_include_dir()
    if not (include / "Python.h").is_file():  # else a bare "Python.h: No such file" deep in the compile log
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        raise MissingBuildTool(
            f"Building the SyncBN extension needs the Python {version} headers (Python.h, for its Python "
            f"module), but {include} has no Python.h. Install them: `apt-get install python{version}-dev` "
            f"(Debian/Ubuntu; python3-dev when python3 is {version}) or `dnf install python3-devel`.")
    if spec.with_cuda:
        search = toolkit.find_cuda_toolkit()
        if search.toolkit is None:
            raise MissingBuildTool(f"Building {spec.name}: {toolkit.missing_toolkit_message(search)}")


def _import_library(spec: BuildSpec) -> ModuleType:
    mod_spec = importlib.util.spec_from_file_location(spec.name, spec.library)
    if mod_spec is None or mod_spec.loader is None:
        raise ExtensionBuildError(f"cannot import the SyncBN extension from {spec.library}")
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _wait_for_flock(fd: int, operation: int, path: Path, timeout_s: float) -> None:
    """flock(fd, operation), polling until timeout_s (then closes fd and raises TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise TimeoutError(
                    f"waited {timeout_s:.0f} s for another process building the SyncBN extension (lock "
                    f"{path}); raise SYNCTRAIN_EXTENSIONS_LOCK_TIMEOUT or check for a stuck compiler") from None
            time.sleep(0.2)


class _NodeLock:
    """Exclusive fcntl lock on a file; waits (polling, with a timeout) instead of failing. `on_wait` is called
    with the holder's process id (as it wrote it into the file) when the lock is busy, before waiting."""

    def __init__(self, path: Path, timeout_s: float, on_wait: Callable[[str], None] | None = None) -> None:
        self.path, self.timeout_s, self.fd, self.on_wait = path, timeout_s, -1, on_wait

    def __enter__(self) -> "_NodeLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if self.on_wait is not None:
                self.on_wait(os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?")
            _wait_for_flock(self.fd, fcntl.LOCK_EX, self.path, self.timeout_s)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()}\n".encode())
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _compile(spec: BuildSpec, verbose: bool, import_module: bool) -> ModuleType | None:
    """Run the ninja build for `spec` (the caller holds the node lock), showing ninja's steps (all of its output
    with `verbose`); import it if asked. A failed build's error carries the end of the compiler's output."""
    if verbose:
        return _run_cpp_extension(spec, import_module, quiet=False)
    started = time.monotonic()
    steps = _NinjaSteps(lambda step: _say(f"  {step} ({time.monotonic() - started:.0f} s)"))
    try:
        with steps:
            return _run_cpp_extension(spec, import_module, quiet=True)
    except Exception as exc:  # noqa: BLE001 - re-raised with what the compiler said (all read once the pipe closed)
        output = "".join(line for line in steps.lines if not _NINJA_STEP.match(line.strip())).strip()
        raise ExtensionBuildError(f"{exc}:\n{output[-6000:]}") from exc


def _run_cpp_extension(spec: BuildSpec, import_module: bool, quiet: bool) -> ModuleType | None:
    """torch.utils.cpp_extension's build of `spec` (and import, if asked), in its verbose mode: it hands ninja's
    output to file descriptor 1 (which _NinjaSteps reads) instead of keeping it until the end. quiet: without
    the INFO lines it logs beside that."""
    chatter = logging.getLogger("torch.utils.cpp_extension")
    chatter_level = chatter.level
    if not spec.with_cuda:  # its import warns "No CUDA runtime is found" on GPU-less machines: no matter here
        chatter.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        chatter.setLevel(chatter_level)

    spec.build_dir.mkdir(parents=True, exist_ok=True)
    # PyTorch's own lock file: we hold the node lock, so any existing one is stale (a killed build)
    # and would make cpp_extension wait forever.
    (spec.build_dir / "lock").unlink(missing_ok=True)
    # torch.utils.cpp_extension runs `ninja` from PATH: put the one check_build_tools found first, so the
    # environment's own ninja is used even when the environment is not activated.
    ninja_dir = os.path.dirname(toolkit.environment_tool("ninja") or "")
    env = {**spec.env, "PATH": os.pathsep.join(filter(None, [ninja_dir, os.environ.get("PATH")]))}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # cpp_extension read CUDA_HOME once, at import, by its own guess (which a wrapper-script nvcc
    # misleads): build with the toolkit root src/syncbn/toolkit.py found.
    saved_cuda_home = cpp_extension.CUDA_HOME
    if "CUDA_HOME" in spec.env:
        cpp_extension.CUDA_HOME = spec.env["CUDA_HOME"]
    if quiet:  # "Building extension module ...", "Loading extension module ...": our own lines say so
        chatter.setLevel(logging.WARNING)
    try:
        kwargs = dict(extra_cflags=list(spec.cflags), extra_cuda_cflags=list(spec.cuda_cflags),
                      extra_ldflags=list(spec.ldflags), build_directory=str(spec.build_dir),
                      verbose=True, with_cuda=spec.with_cuda)
        build_only = getattr(cpp_extension, "_write_ninja_file_and_build_library", None)
        if not import_module and build_only is not None:
            # Compile without importing (e.g. the CUDA variant on a machine without a GPU).
            build_only(spec.name, list(spec.sources), kwargs["extra_cflags"],
                       kwargs["extra_cuda_cflags"], None, kwargs["extra_ldflags"], None,
                       str(spec.build_dir), True, spec.with_cuda, False)
            return None
        return cpp_extension.load(spec.name, list(spec.sources), **kwargs)
    finally:
        cpp_extension.CUDA_HOME = saved_cuda_home
        chatter.setLevel(chatter_level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# CPU seconds to compile each kind of variant, and the share of its largest file (which bounds the wall time however
# many cores run ninja's jobs): the C++ variant about 300 s (bindings.cpp, with the torch and pybind11 headers, a
# third), the CUDA variant 205 s more per architecture (backward_elemt.cu an eighth; docs/gpu.md, "build"), the
# emulated variant 93 s (docs/gpu.md). Measured on 2-vCPU machines; for the message's "about", not a promise.
_BUILD_CPU_S = {"cpu": (300.0, 1 / 3), "cuda": (205.0, 1 / 8), "cudaemu": (93.0, 1 / 3)}


def _say(text: str) -> None:
    """A build message on stderr from whichever process builds or waits (with its rank under torchrun)."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE", "1")
    print(f"[rank {rank}] {text}" if rank is not None and world != "1" else text, file=sys.stderr, flush=True)


def _announcement(spec: BuildSpec, retry: bool) -> str:
    """What is about to be compiled, why, about how long it takes here, and where it is cached."""
    variant = _variant_of(spec.name)
    if "cudaemu" in variant:
        what, kind = "the CUDA kernels for the CPU emulation (tests)", "cudaemu"
    elif spec.with_cuda:
        what, kind = f"the SyncBN C++ and CUDA kernels (GPU architectures {spec.cuda_arch_list})", "cuda"
    else:
        what, kind = f"the SyncBN C++ kernels ({spec.cpu_capability} CPU code)", "cpu"
    older = [d for d in spec.build_dir.parent.glob(f"{variant}_*") if d.is_dir() and d.name != spec.name]
    why = ("its last build failed" if retry else
           "the sources, the compiler or PyTorch changed since the cached build" if older else
           "their first use on this machine")
    cpu_s, largest = _BUILD_CPU_S[kind]
    if kind == "cuda":  # the C++ sources once, the CUDA ones per architecture
        cpu_s = _BUILD_CPU_S["cpu"][0] + cpu_s * len(re.split(r"[;\s]+", (spec.cuda_arch_list or "").strip()))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = min(cores, int(os.environ.get("MAX_JOBS") or cores))
    minutes = max(cpu_s / max(jobs, 1), cpu_s * largest) / 60
    about = f"about {max(0.5, round(minutes * 2) / 2):g} min" if minutes >= 0.5 else "under a minute"
    return (f"Compiling {what}: {why}. It takes {about} on {jobs} core(s), once: the result is cached in "
            f"{spec.build_dir} (SYNCTRAIN_EXTENSIONS_DIR moves the cache; python -m src.syncbn.build builds "
            "ahead of time)")


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")


class _NinjaSteps:
    """While open, file descriptor 1 (where a verbose cpp_extension build sends ninja's output) goes to a pipe: each
    `[k/n]` step ninja finishes (its status line, printed as a step ends when the output is not a terminal) is
    passed to `show` as "[k/n] compiled <source>" or "[k/n] linked <library>", and every line is kept in `lines`
    (the compiler's messages, for an error)."""

    def __init__(self, show: Callable[[str], None]) -> None:
        self.show, self.lines = show, []
        self._saved, self._reader = -1, None

    def __enter__(self) -> "_NinjaSteps":
        sys.stdout.flush()
        read_end, write_end = os.pipe()
        self._saved = os.dup(1)
        os.dup2(write_end, 1)
        os.close(write_end)
        self._reader = threading.Thread(target=self._pump, args=(read_end,), name="ninja-steps", daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        os.dup2(self._saved, 1)  # closes the pipe's last write end held here: the reader sees the end
        os.close(self._saved)
        if self._reader is not None:
            self._reader.join(timeout=30)

    def _pump(self, read_end: int) -> None:
        with os.fdopen(read_end, "r", errors="replace") as pipe:
            for line in pipe:
                self.lines.append(line)
                step = _NINJA_STEP.match(line.strip())
                if step:
                    self.show(f"[{step[1]}/{step[2]}] {_step_name(step[3])}")


def _step_name(command: str) -> str:
    """"compiled csrc/cpu/stats.cpp" or "linked syncbn_cpu_....so" for one of ninja's command lines."""
    source = re.search(r"\s-c\s+(\S+)", command)
    if source:
        path = Path(source[1].strip("'\""))
        return f"compiled {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path.name}"
    output = re.search(r"\s-o\s+(\S+)", command)
    return f"linked {Path(output[1]).name}" if output else command.split()[0]


def _prune_stale_variants(spec: BuildSpec) -> None:
    """Delete the older builds of `spec`'s own variant (same kind, CPU capability and CUDA architectures;
    other hashes: edited sources, another PyTorch) that no process is building or importing now.

    Only the same variant: on a node with several GPU models, ranks that each see one GPU build one
    variant per architecture, and deleting each other's builds would make every job compile again.
    """
    variant = _variant_of(spec.name)
    for lock in spec.build_dir.parent.glob(f"{variant}_*.lock"):
        name = lock.name[: -len(".lock")]
        if name == spec.name or _variant_of(name) != variant:
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            # Busy -> a process is building it (exclusive) or importing it (shared, _import_built): keep.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        # A process that already imported an old library keeps its mapping; deleting is safe.
        shutil.rmtree(lock.parent / name, ignore_errors=True)
        (lock.parent / f"{name}.failed").unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
        os.close(fd)


def build(spec: BuildSpec, *, import_module: bool = True, verbose: bool | None = None) -> ModuleType | None:
    """Build `spec` under the node lock unless a finished build exists; import it if asked.

    A process that compiles says so on stderr first (what, why, about how long, where it is cached), then shows
    ninja's steps; one that waits for another's build says whom it waits for.
    """
    if verbose is None:
        verbose = os.environ.get("SYNCTRAIN_EXTENSIONS_VERBOSE", "0") == "1"
    failed_marker = spec.build_dir.parent / f"{spec.name}.failed"
    waited_since = time.time()
    t0 = time.monotonic()
    lock = spec.build_dir.parent / f"{spec.name}.lock"
    with _NodeLock(lock, LOCK_TIMEOUT_S, on_wait=lambda pid: _say(
            f"waiting for process {pid}, which is building the SyncBN kernels {spec.name} (lock {lock})")):
        if spec.ok_marker.exists() and spec.library.exists():
            _LAST_BUILD.update(name=spec.name, build_dir=str(spec.build_dir), compiled=False,
                               seconds=time.monotonic() - t0)
            return _import_library(spec) if import_module else None
        if failed_marker.exists() and failed_marker.stat().st_mtime >= waited_since:
            # Another process failed while we waited for the lock: same sources, same error.
            raise ExtensionBuildError(failed_marker.read_text())
        check_build_tools(spec)
        _say(_announcement(spec, retry=failed_marker.exists()))
        try:
            module = _compile(spec, verbose, import_module)
        except Exception as exc:  # noqa: BLE001 - re-raised with context for every waiting rank
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            message = (f"Building the SyncBN extension {spec.name} in {spec.build_dir} failed:\n"
                       f"{detail[-6000:]}\nRerun with SYNCTRAIN_EXTENSIONS_VERBOSE=1 for the full "
                       "compiler output.")
            failed_marker.write_text(message)
            raise ExtensionBuildError(message) from exc
        spec.ok_marker.write_text(f"{spec.name}\n")
        failed_marker.unlink(missing_ok=True)
        _prune_stale_variants(spec)
        _LAST_BUILD.update(name=spec.name, build_dir=str(spec.build_dir), compiled=True,
                           seconds=time.monotonic() - t0)
        _say(f"SyncBN kernels built in {time.monotonic() - t0:.0f} s; every later process loads them from "
             f"{spec.build_dir}")
        return module


def _import_built(spec: BuildSpec) -> ModuleType | None:
    """Import a finished build holding its lock file shared, so that pruning (which needs the lock
    exclusively and never waits for it) cannot delete the library while it is being loaded. None if
    the build was deleted (or its lock file replaced) before the lock was ours: build() then decides.
    After the import the process keeps its mapping of the library, so the lock is released."""
    lock = spec.build_dir.parent / f"{spec.name}.lock"
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # no lock file (pruning finds builds by theirs, so none deletes it) or unreadable
        return _import_library(spec)
    _wait_for_flock(fd, fcntl.LOCK_SH, lock, LOCK_TIMEOUT_S)
    try:
        try:
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except OSError:
            current = False
        return _import_library(spec) if current and _is_built(spec) else None
    finally:
        os.close(fd)  # releases the lock


def _load(spec: BuildSpec) -> ModuleType:
    module = _LOADED.get(spec.name)
    if module is None:
        # Fast path: a finished build needs neither the node lock nor ninja nor a compiler.
        module = _import_built(spec) if _is_built(spec) else None
        if module is not None:
            _LAST_BUILD.update(name=spec.name, build_dir=str(spec.build_dir), compiled=False, seconds=0.0)
        else:
            module = build(spec)
        _LOADED[spec.name] = module
    return module


def load_extension(with_cuda: bool | None = None) -> ModuleType:
    """The compiled SyncBN ops for this machine (built on first use, then cached per process)."""
    return _load(make_spec(with_cuda=with_cuda))


def cuda_kernels_problem() -> str | None:
    """Why our SyncBN cannot run on this machine's GPUs (None: it can, or there are no GPUs)."""
    if not torch.cuda.is_available() or make_spec().with_cuda:
        return None
    if not cuda_sources():
        return f"this checkout has no CUDA sources in {CSRC / 'cuda'}. " + toolkit.install_advice()
    return toolkit.missing_toolkit_message(toolkit.find_cuda_toolkit())


def load_emulated_cuda_extension(device: str | Mapping[str, int] = "h100", *, fault: bool = False) -> ModuleType:
    """The CUDA kernels run on the CPU by the SIMT emulation, emulating `device`; ops take CPU tensors.

    `device`: a preset ("h100" = "h200": 132 SMs, "a100": 108, "orin": 16 SMs x 1536 threads), a preset
    with overrides ("orin,sm_count=2"), or a mapping of overrides on top of h100 ({"sm_count": 4}).
    The keys are those of `module.device()`. The module is one per process: loading it again with
    another device switches every later launch to that device. Built on first use (host compiler,
    about 70 s of CPU time), cached like the other variants. Besides the eight ops the module has
    `set_device`, `device`, `record_launches` / `launches` (kernel names and geometry), `counters`
    and `probes` (kernels that test the emulator itself). fault=True: the deliberately faulty variant
    (make_emulated_spec), a separate build used only to show that the self-check catches a wrong result.
    """
    module = _load(make_emulated_spec(fault))
    if not isinstance(device, str):
        device = ",".join(f"{k}={int(v)}" for k, v in device.items())
    module.set_device(device)
    return module


_EMULATED_FROM_ENV: ModuleType | None = None


def emulated_cuda_ops() -> ModuleType:
    """The emulated kernels on the device SYNCTRAIN_SIMT_DEVICE names (default h100), loaded once."""
    global _EMULATED_FROM_ENV
    if _EMULATED_FROM_ENV is None:
        _EMULATED_FROM_ENV = load_emulated_cuda_extension(os.environ.get("SYNCTRAIN_SIMT_DEVICE") or "h100")
    return _EMULATED_FROM_ENV


def last_build_info() -> dict[str, object]:
    """What the last load/build in this process did: name, build_dir, compiled (bool), seconds."""
    return dict(_LAST_BUILD)
