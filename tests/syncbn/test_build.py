"""The extension build: AOT entry point reused by the JIT loader, missing-tool errors, one compiler
per node, failed builds raising everywhere.

Compiling the real extension costs minutes of CPU, so it is compiled at most once per session (the
cached loader); the locking tests build a tiny pybind11 module through the same `build()` path.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from src.syncbn import extension, toolkit

REPO = Path(extension.__file__).resolve().parents[2]
TIMEOUT_S = 600  # a cold compile on a busy 2-core machine; a hang fails instead of blocking CI

TINY_SOURCE = """
#include <pybind11/pybind11.h>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", [] { return 42; }); }
"""
BROKEN_SOURCE = TINY_SOURCE.replace("return 42;", "return 42")  # missing ';': a compile error


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter at the repo root (one thread: the machine is shared)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built_extension() -> None:
    """The real extension in the default cache, loaded by the JIT loader as a user's process does (compiled
    only if no test built it yet). In a fresh interpreter: this worker may already hold a module an earlier
    test loaded from another cache (SYNCTRAIN_EXTENSIONS_DIR), and a process loads the extension once."""
    out = run_python("from src.syncbn.extension import load_extension; load_extension()")
    assert out.returncode == 0, out.stderr[-4000:]


def test_aot_entry_point_and_jit_loader_reuse_the_build(built_extension, tmp_path: Path):
    aot = subprocess.run([sys.executable, "-m", "src.syncbn.build"], cwd=REPO, capture_output=True,
                         text=True, timeout=TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert aot.returncode == 0, aot.stderr
    spec = extension.make_spec()
    assert f"up to date: {spec.build_dir}" in aot.stdout, aot.stdout
    # A fresh process loads the same library without compiling (and without ninja on PATH). The compiler and
    # its linker stay findable: their identities are part of the library's cache key.
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("c++", "ld"):
        (tools / name).symlink_to(shutil.which(name))
    code = ("import json; from src.syncbn.extension import load_extension, last_build_info;"
            "m = load_extension(); print(json.dumps(last_build_info())); print(m.__file__)")
    out = run_python(code, env={"PATH": str(tools)})
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.splitlines()[0])
    assert info["compiled"] is False and info["name"] == spec.name
    assert out.stdout.splitlines()[1] == str(spec.library)


def test_cpu_and_cuda_variants_never_share_a_cache_entry():
    if not extension.cuda_sources():
        pytest.skip("no CUDA sources yet")
    cpu, cuda = extension.make_spec(with_cuda=False), extension.make_spec(with_cuda=True)
    assert cpu.name.startswith("syncbn_cpu_") and cuda.name.startswith("syncbn_cuda_")
    assert cpu.build_dir != cuda.build_dir and "-DSYNCBN_WITH_CUDA" not in cpu.cflags
    assert cuda.cuda_arch_list  # pinned into the key, so an AOT build for 9.0 is found on a 9.0 GPU


def test_each_cpu_capability_has_its_own_variant():
    names = {extension.make_spec(with_cuda=False, cpu_capability=c).name for c in extension.CPU_CAPABILITIES}
    assert len(names) == len(extension.CPU_CAPABILITIES)


def _fake_build(spec: extension.BuildSpec) -> None:
    """A finished build of `spec` as the cache holds it (lock file, library, marker), compiled by nobody."""
    spec.build_dir.mkdir(parents=True)
    spec.library.write_text("")
    spec.ok_marker.write_text(f"{spec.name}\n")
    (spec.build_dir.parent / f"{spec.name}.lock").write_text("")


def _older(spec: extension.BuildSpec) -> extension.BuildSpec:
    """The same variant built from other sources: another hash."""
    name = f"{spec.name.rsplit('_', 1)[0]}_0123456789ab"
    return dataclasses.replace(spec, name=name, build_dir=spec.build_dir.parent / name)


def test_a_build_prunes_only_older_builds_of_its_own_variant(tmp_path, monkeypatch):
    """A node with two GPU models whose ranks each see one GPU builds one variant per architecture: a
    finished build deletes its own variant's older hashes, never another architecture's or CPU
    capability's build, nor the CPU-only or the emulated variant."""
    if not extension.cuda_sources():
        pytest.skip("no CUDA sources yet")
    monkeypatch.setenv("SYNCTRAIN_EXTENSIONS_DIR", str(tmp_path))
    specs = []
    for arch in ("8.0", "9.0"):
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch)
        specs += [extension.make_spec(with_cuda=True, cpu_capability=cap) for cap in ("avx2", "avx512")]
    built = specs[-1]
    assert built.name.startswith("syncbn_cuda_avx512_sm90_") and specs[1].name.startswith("syncbn_cuda_avx512_sm80_")
    specs.append(extension.make_spec(with_cuda=False, cpu_capability="avx512"))
    # part: gpu-tools
    specs.append(extension.make_emulated_spec())  # its sources are csrc/simt's
    # /part
    everything = specs + [_older(s) for s in specs]
    for spec in everything:
        _fake_build(spec)
    stale = _older(built)
    (tmp_path / f"{stale.name}.failed").write_text("an old failure")
    extension._prune_stale_variants(built)
    for spec in everything:
        kept = spec.name != stale.name
        assert spec.build_dir.exists() == kept and (tmp_path / f"{spec.name}.lock").exists() == kept, spec.name
    assert not (tmp_path / f"{stale.name}.failed").exists()


def test_a_build_being_imported_is_not_pruned(tmp_path, monkeypatch):
    """A process importing a finished build holds its lock shared: a newer build of the same variant that
    finishes meanwhile leaves it alone; once imported (the process keeps its mapping), the next one deletes it."""
    monkeypatch.setenv("SYNCTRAIN_EXTENSIONS_DIR", str(tmp_path))
    new = extension.make_spec(with_cuda=False, cpu_capability="avx512")
    old = _older(new)
    _fake_build(old)
    present_while_importing = []

    def import_while_a_newer_build_finishes(spec: extension.BuildSpec) -> SimpleNamespace:
        extension._prune_stale_variants(new)
        present_while_importing.append(spec.library.exists())
        return SimpleNamespace(__file__=str(spec.library))

    monkeypatch.setattr(extension, "_import_library", import_while_a_newer_build_finishes)
    monkeypatch.setattr(extension, "_LOADED", {})
    monkeypatch.setattr(extension, "_LAST_BUILD", {})
    assert extension._load(old).__file__ == str(old.library)
    assert present_while_importing == [True]
    extension._prune_stale_variants(new)
    assert not old.build_dir.exists()


def _tool_dir(tmp_path: Path, tools: list[str]) -> str:
    """A PATH entry holding only `tools` (symlinks to the real ones)."""
    d = tmp_path / "bin"
    d.mkdir()
    for tool in tools:
        real = toolkit.environment_tool(tool)  # this environment's ninja where PATH has none
        if real is None:
            pytest.skip(f"{tool} is not installed here")
        (d / tool).symlink_to(real)
    return str(d)


def test_missing_compiler_is_a_clear_error(tmp_path):
    env = {"PATH": _tool_dir(tmp_path, ["ninja"]), "SYNCTRAIN_EXTENSIONS_DIR": str(tmp_path / "cache")}
    env_clean = {k: v for k, v in os.environ.items() if k != "CXX"}
    out = subprocess.run(
        [sys.executable, "-c", "from src.syncbn.extension import load_extension; load_extension(with_cuda=False)"],
        cwd=REPO, env={**env_clean, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True,
        timeout=TIMEOUT_S)
    assert out.returncode != 0
    assert "MissingBuildTool" in out.stderr and "needs a C++ compiler" in out.stderr, out.stderr
    assert "apt-get install g++" in out.stderr, out.stderr


def test_missing_ninja_is_a_clear_error(tmp_path, monkeypatch):
    """Neither the environment's scripts folder nor PATH has ninja: the error says how to install it there."""
    empty = tmp_path / "env_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", _tool_dir(tmp_path, ["c++"]))
    monkeypatch.setattr(sysconfig, "get_path", lambda *args, **kwargs: str(empty))
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    with pytest.raises(extension.ExtensionBuildError, match="needs ninja") as raised:
        extension.check_build_tools(extension.make_spec(with_cuda=False))
    assert f"{empty / 'python'} -m pip install ninja" in str(raised.value)


def test_ninja_of_the_environment_builds_without_it_on_path(tmp_path):
    """`.venv/bin/python` unactivated, no ninja on PATH (a machine without ninja-build): the build uses the
    ninja that requirements.txt installed into the environment."""
    if toolkit.environment_tool("ninja") in (None, shutil.which("ninja")):
        pytest.skip("this environment has no ninja of its own (it comes from requirements.txt)")
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    path = _tool_dir(tmp_path, ["c++", "as", "ld"])
    out = run_python(_tiny_build_code(source, tmp_path / "cache"), env={"PATH": path})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"compiled": True, "answer": 42}


def _tiny_build_code(source: Path, cache: Path) -> str:
    return f"""
import json
from pathlib import Path
from src.syncbn import extension
spec = extension.BuildSpec(name="syncbn_test_tiny", build_dir=Path({str(cache)!r}) / "syncbn_test_tiny",
    sources=({str(source)!r},), cflags=("-O0",), cuda_cflags=(), ldflags=(), with_cuda=False,
    cpu_capability="default", cuda_arch_list=None)
m = extension.build(spec)
print(json.dumps({{"compiled": extension.last_build_info()["compiled"], "answer": m.answer()}}))
"""


def _run_concurrently(code: str, n: int = 2) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=TIMEOUT_S)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def test_concurrent_loads_build_once(tmp_path):
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    results = _run_concurrently(_tiny_build_code(source, tmp_path / "cache"))
    for r in results:
        assert r.returncode == 0, r.stderr
    infos = [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]
    assert [i["answer"] for i in infos] == [42, 42]
    assert sorted(i["compiled"] for i in infos) == [False, True]  # exactly one process compiled
    # The one that compiled said what, why and where, then ninja's steps as they ended; the other said nothing
    # of a build (it may have waited for it, which it says: test_a_process_waiting_for_a_build_says_whom_for).
    built, loaded = (r.stderr for _, r in sorted(zip([i["compiled"] for i in infos], results), reverse=True))
    assert "Compiling the SyncBN C++ kernels (default CPU code): their first use on this machine." in built, built
    assert f"the result is cached in {tmp_path / 'cache' / 'syncbn_test_tiny'}" in built
    assert re.search(r"\[1/2\] compiled tiny\.cpp \(\d+ s\)\n.*\[2/2\] linked syncbn_test_tiny\.so", built), built
    assert "SyncBN kernels built in" in built and "Compiling" not in loaded and "[1/2]" not in loaded, loaded


def test_a_process_waiting_for_a_build_says_whom_for(tmp_path, capsys, monkeypatch):
    """While another process holds a variant's lock (here: this test, as far as flock can tell), a loader says so
    once, then waits; it takes the finished build when the lock is free."""
    spec = extension.BuildSpec(name="syncbn_test_wait", build_dir=tmp_path / "syncbn_test_wait", sources=(),
                               cflags=(), cuda_cflags=(), ldflags=(), with_cuda=False, cpu_capability="default",
                               cuda_arch_list=None)
    spec.build_dir.mkdir()
    monkeypatch.setattr(extension, "_LAST_BUILD", {})
    lock = tmp_path / "syncbn_test_wait.lock"
    done = threading.Event()
    with extension._NodeLock(lock, timeout_s=60):  # a builder: its pid is in the lock file
        waiter = threading.Thread(target=lambda: (extension.build(spec, import_module=False), done.set()))
        waiter.start()
        said, deadline = "", time.monotonic() + 60
        while "waiting for process" not in said and time.monotonic() < deadline:
            time.sleep(0.05)
            said += capsys.readouterr().err
        spec.ok_marker.write_text("syncbn_test_wait\n")  # what the builder leaves when it is done
        spec.library.write_bytes(b"")
        assert not done.is_set()
    waiter.join(timeout=60)
    assert said == (f"waiting for process {os.getpid()}, which is building the SyncBN kernels syncbn_test_wait "
                    f"(lock {lock})\n")
    assert done.is_set() and extension.last_build_info()["compiled"] is False




def test_failed_build_raises_on_every_process(tmp_path):
    source = tmp_path / "broken.cpp"
    source.write_text(BROKEN_SOURCE)
    results = _run_concurrently(_tiny_build_code(source, tmp_path / "cache"))
    for r in results:
        assert r.returncode != 0
        assert "ExtensionBuildError" in r.stderr and "Building the SyncBN extension syncbn_test_tiny" in r.stderr, r.stderr


def test_missing_python_headers_name_the_package_to_install(tmp_path, monkeypatch):
    # A fresh Debian/Ubuntu machine has python3 but not python3-dev: without the check the user gets
    # "fatal error: Python.h: No such file or directory" from inside the ninja log.
    monkeypatch.setattr(extension, "python_include_dir", lambda: tmp_path)
    with pytest.raises(extension.ExtensionBuildError) as info:
        extension.check_build_tools(extension.make_spec(with_cuda=False))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"{tmp_path} has no Python.h" in str(info.value)
    assert f"apt-get install python{version}-dev" in str(info.value) and "python3-dev" in str(info.value)
    (tmp_path / "Python.h").write_text("")
    extension.check_build_tools(extension.make_spec(with_cuda=False))  # present: no complaint


def test_python_include_dir_holds_this_interpreters_headers():
    assert (extension.python_include_dir() / "Python.h").is_file()
