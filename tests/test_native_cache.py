"""The init kernels' cache on a home shared by different CPUs (torchtitan_lite/init/native.py):
each CPU loads its own build, a cached start runs no compiler, a failed build is tried once per
machine, and an ISA the CPU lacks is never loaded. Each "process" is a reset of the module's state
with the cache left on disk; the compiler is a script on PATH that logs every run."""

import contextlib
import io
import os
import shutil

import pytest
import torch

from torchtitan_lite.init import native
from torchtitan_lite.init.keyed import InitKey
from torchtitan_lite.init.sampling import trunc_normal_

REAL_CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(REAL_CC is None, reason="no C compiler")
CPU_A = "flags : fpu sse sse2 avx avx2\nmodel : 1\nvendor_id : GenuineIntel"
CPU_B = "flags : fpu sse sse2 avx avx2 avx512f\nmodel : 2\nvendor_id : GenuineIntel"


@pytest.fixture
def cc(tmp_path, monkeypatch):
    """A ``cc`` first on PATH that logs its arguments and runs the real compiler, unless
    ``CC_MODE`` is ``fail`` (every run fails) or ``no-native`` (``-march=native`` fails); the
    kernel cache in ``tmp_path``. Returns the log's path."""
    folder, log = tmp_path / "bin", tmp_path / "cc.log"
    folder.mkdir()
    (folder / "cc").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'if [ "$CC_MODE" = fail ]; then echo "cc: error: told to fail" >&2; exit 1; fi\n'
        'case "$CC_MODE $*" in "no-native "*-march=native*)'
        ' echo "cc: error: no native" >&2; exit 1;; esac\n'
        f'exec {REAL_CC} "$@"\n'
    )
    (folder / "cc").chmod(0o755)
    log.touch()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CC_MODE", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(native, "_STATE", dict(native._STATE))
    return log


def start(monkeypatch, cpu=CPU_A, mode=None):
    """A new process's first ``native.library()`` on the CPU ``cpu``: ``(library, path, the
    warning lines, ``warning: `` stripped)``."""
    monkeypatch.setattr(native, "cpu_identity", lambda: cpu)
    if mode is None:
        monkeypatch.delenv("CC_MODE", raising=False)
    else:
        monkeypatch.setenv("CC_MODE", mode)
    native._STATE.update(library=None, path=None, tried=False, build_seconds=0.0)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        lib = native.library()
    said = [line.removeprefix("warning: ") for line in printed.getvalue().splitlines()]
    return lib, native._STATE["path"], said


def runs(log):
    return log.read_text().splitlines()


def test_a_cached_start_runs_no_compiler(cc, monkeypatch):
    lib, path, said = start(monkeypatch)
    assert lib is not None and said == [] and len(runs(cc)) == 1
    assert "-march=native" in runs(cc)[0]
    # The same cc now fails on every run: a start that ran it could not load the kernels.
    lib, again, said = start(monkeypatch, mode="fail")
    assert lib is not None and again == path and said == [] and len(runs(cc)) == 1
    assert native.build_seconds() == 0.0


def test_two_cpus_sharing_one_cache_never_load_each_others_build(cc, monkeypatch):
    _, path_a, _ = start(monkeypatch, CPU_A)
    _, path_b, _ = start(monkeypatch, CPU_B)
    assert path_a != path_b and len(runs(cc)) == 2
    _, again_a, _ = start(monkeypatch, CPU_A, mode="fail")
    _, again_b, _ = start(monkeypatch, CPU_B, mode="fail")
    assert (again_a, again_b) == (path_a, path_b) and len(runs(cc)) == 2
    assert sorted(p.name for p in path_a.parent.glob("*.so")) == sorted([path_a.name, path_b.name])


def test_a_failed_native_build_is_tried_once_per_machine(cc, monkeypatch):
    lib, path, said = start(monkeypatch, mode="no-native")
    assert lib is not None and said == []
    assert ["-march=native" in line for line in runs(cc)] == [True, False]
    assert len(list(path.parent.glob("*.failed"))) == 1
    lib, again, said = start(monkeypatch, mode="no-native")
    assert lib is not None and again == path and said == [] and len(runs(cc)) == 2


def test_a_failed_build_is_tried_once_then_eager_ops_with_one_warning(cc, monkeypatch):
    lib, _, said = start(monkeypatch, mode="fail")
    assert lib is None and len(runs(cc)) == 2
    assert len(said) == 1 and "cc: error: told to fail" in said[0] and "\n" not in said[0]
    # The next process (the compiler fixed or not) tries no build and warns once.
    lib, _, said = start(monkeypatch)
    assert lib is None and len(runs(cc)) == 2
    assert len(said) == 1 and "an earlier build; delete" in said[0] and "\n" not in said[0]


def test_avx2_kernels_are_not_built_for_a_cpu_without_avx2(cc, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    lib, path_avx2, said = start(monkeypatch, CPU_A)
    assert lib is not None and said == [] and "-mavx2" in runs(cc)[0]
    lib, path, said = start(monkeypatch, "flags : fpu sse sse2\nmodel : 3")
    assert lib is not None and path != path_avx2 and "-mavx2" not in runs(cc)[1]
    assert said == [
        "init: ATEN_CPU_CAPABILITY=avx2 but this CPU has no avx2 (/proc/cpuinfo); the init "
        "kernels are built without vector ISA flags (the same values)"
    ]
    key = InitKey(0, "w")
    native_values = trunc_normal_(torch.empty(1000), 0.0, 1.0, -2.0, 2.0, key=key, compiled=None)
    eager = trunc_normal_(torch.empty(1000), 0.0, 1.0, -2.0, 2.0, key=key, compiled=False)
    assert torch.equal(native_values.view(torch.int32), eager.view(torch.int32))


def test_the_cpu_identity_holds_what_march_native_resolves_from():
    identity = native.cpu_identity()
    if identity is None:
        pytest.skip("no /proc/cpuinfo")
    fields = {line.split(" :")[0] for line in identity.splitlines()}
    assert fields <= set(native.CPU_FIELDS) and ("flags" in fields or "Features" in fields)
    assert "sse2" in native._cpu_flags(identity) or os.uname().machine != "x86_64"
