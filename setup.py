"""Build hook for the optional compiled modules (everything else is in ``pyproject.toml``).

Two kinds, both built by ``pip install -e .`` with the system C compiler, both optional: if a
build fails the install still succeeds and the same code runs interpreted (same results, slower).

* **Cython** (``.pyx`` sources): ``sim/core/compiled_pool.pyx`` (the compiled block pool),
  ``sim/core/compiled_hash.pyx`` (the fast hash chain over runs), ``sim/core/offload/chunk_table.pyx``
  (the CPU tier's LRU chunk table), ``workloads/trace_scan.pyx``
  (the trace line scanner), ``workloads/bounds_scan.pyx`` (the policy loops of the offline
  references), ``sim/cluster/compiled_index.pyx`` (the routers' KV-event index),
  ``sim/cluster/compiled_active.pyx`` (Dynamo's active blocks per worker) and
  ``sim/replay/compiled_window.pyx`` (a bulk decode window's step loop). Without them
  ``sim.core.pool_impl`` says once that it falls back to the Python pool, the hash uses its numpy
  code, traces the stdlib ``json`` path, the offline references their Python loops and the
  routers the Python index, the CPU tier the Python manager, and a bulk window its Python loop.
* **mypyc** (``sim.core.native_build.ENGINE_MODULES``): the engine's per-step modules -- the request, scheduler, KV
  manager and coordinator, the executor interface and the replay's step loop and decode window --
  compiled from their own typed ``.py`` source, which stays the code that runs without the build.
  mypyc makes their classes native (attributes in fixed slots instead of a ``__dict__``), which is
  where an interpreted step spends its time. They are one group with one shared library
  (``sim/_engine__mypyc``), so they are built all or none (``_AllOrNone``): a half-built group
  would not import. Compiled, the annotations are enforced at run time (an ``int`` argument must
  be an int), and instances take no attributes their class does not declare.

In a checkout, ``python setup.py build_ext --inplace`` builds them next to their sources.

Every build writes what it built, what failed and why to ``build/apcsim_compiled.json``, so that a
module that silently fell back to its interpreted code is seen: ``tests/test_compiled_build.py``
fails when one module failed where the others built (a code error, not a missing compiler), or when
Cython or mypyc rejected the sources before compiling.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_MODULES = {
    "sim.core.compiled_pool": "sim/core/compiled_pool.pyx",
    "sim.core.compiled_hash": "sim/core/compiled_hash.pyx",
    "workloads.trace_scan": "workloads/trace_scan.pyx",
    "workloads.bounds_scan": "workloads/bounds_scan.pyx",
    "sim.cluster.compiled_index": "sim/cluster/compiled_index.pyx",
    "sim.cluster.compiled_active": "sim/cluster/compiled_active.pyx",
    "sim.core.offload.chunk_table": "sim/core/offload/chunk_table.pyx",
    "workloads.convert.word_scan": "workloads/convert/word_scan.pyx",
    "sim.replay.compiled_window": "sim/replay/compiled_window.pyx",
}


def _mypyc_modules() -> list[str]:
    """The source paths of ``sim.core.native_build.ENGINE_MODULES``, the one list of the group
    (the file is run on its own, stdlib only: the build environment lacks the project's
    dependencies)."""
    names = runpy.run_path(str(Path(__file__).parent / "sim/core/native_build.py"))["ENGINE_MODULES"]
    return [name.replace(".", "/") + ".py" for name in names]


_MYPYC_GROUP = "sim._engine"  # its shared library is the module sim._engine__mypyc
_RECORD = Path(__file__).parent / "build" / "apcsim_compiled.json"  # read by tests/test_compiled_build.py
_PROBLEMS: list[str] = []  # sources Cython or mypyc rejected before any compiler ran


def _cython_extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:  # no Cython: the pure-Python fallbacks are used
        print("apcsim: Cython is not available; building without the Cython modules")
        return []
    import numpy

    exts = [Extension(name, [src], optional=True, include_dirs=[numpy.get_include()],
                      define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])
            for name, src in _MODULES.items()]
    try:
        return cythonize(exts, compiler_directives={"language_level": "3"}, quiet=True)
    except Exception as exc:  # a Cython error must not fail the install either
        print(f"apcsim: Cython failed ({exc}); building without the Cython modules")
        _PROBLEMS.append(f"Cython: {exc}")
        return []


def _mypyc_extensions() -> list[Extension]:
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("apcsim: mypyc is not available; the engine modules stay interpreted")
        return []
    try:
        # the build environment has only the build requirements: an import without them (pandas,
        # pydantic, ...) is typed Any, and the modules the group imports are not re-checked here
        # (the guards run mypy on the whole tree)
        exts = mypycify(["--ignore-missing-imports", "--follow-imports=silent", *_mypyc_modules()],
                        opt_level="3", group_name=_MYPYC_GROUP)
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error: the install goes on
        print(f"apcsim: mypyc failed ({exc!r}); the engine modules stay interpreted")
        _PROBLEMS.append(f"mypyc: {exc!r}")
        return []
    for ext in exts:
        ext.optional = True
        ext._apcsim_mypyc = True  # type: ignore[attr-defined]
    return exts


class _AllOrNone(build_ext):
    """``build_ext`` that removes every module of the mypyc group when one of them failed to
    build (an optional extension's failure is otherwise only a warning), so the group's modules
    are all compiled or all interpreted. It writes the build record (``_RECORD``) at the end."""

    def run(self) -> None:
        self._mypyc_failed = False
        self._built: list[str] = []
        self._failed: dict[str, str] = {}
        super().run()
        _RECORD.parent.mkdir(parents=True, exist_ok=True)
        _RECORD.write_text(json.dumps({"built": self._built, "failed": self._failed, "problems": _PROBLEMS},
                                      indent=1) + "\n")
        if self._mypyc_failed:
            for ext in self.extensions:
                if getattr(ext, "_apcsim_mypyc", False):
                    Path(self.get_ext_fullpath(ext.name)).unlink(missing_ok=True)
            print("apcsim: the mypyc group did not build; the engine modules stay interpreted")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # an optional one's error is then caught and warned about by build_ext
            self._failed[ext.name] = repr(exc)
            if getattr(ext, "_apcsim_mypyc", False):
                self._mypyc_failed = True
            raise
        self._built.append(ext.name)


setup(ext_modules=_cython_extensions() + _mypyc_extensions(), cmdclass={"build_ext": _AllOrNone})
