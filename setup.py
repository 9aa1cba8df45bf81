"""Build hook for the optional compiled modules (everything else is in ``pyproject.toml``).

``sim/core/compiled_pool.pyx`` (the compiled block pool), ``sim/core/compiled_hash.pyx`` (the fast
hash chain over runs), ``workloads/trace_scan.pyx`` (the trace line scanner) and
``workloads/bounds_scan.pyx`` (the policy loops of the offline references) are compiled with
Cython and the system C compiler by ``pip install -e .``. All are optional: if Cython or the
compiler fails, the install still succeeds; ``sim.core.pool_impl`` then says once that it falls
back to the Python pool, the hash uses its numpy code, traces the stdlib ``json`` path and the
offline references their Python loops (same results, slower).
In a checkout, ``python setup.py build_ext --inplace`` builds it next to its source.
"""

from __future__ import annotations

from setuptools import Extension, setup

_MODULES = {
    "sim.core.compiled_pool": "sim/core/compiled_pool.pyx",
    "sim.core.compiled_hash": "sim/core/compiled_hash.pyx",
    "workloads.trace_scan": "workloads/trace_scan.pyx",
    "workloads.bounds_scan": "workloads/bounds_scan.pyx",
}


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:  # no Cython: the pure-Python fallbacks are used
        print("apcsim: Cython is not available; building without the compiled modules")
        return []
    import numpy

    exts = [Extension(name, [src], optional=True, include_dirs=[numpy.get_include()],
                      define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")])
            for name, src in _MODULES.items()]
    try:
        return cythonize(exts, compiler_directives={"language_level": "3"}, quiet=True)
    except Exception as exc:  # a Cython error must not fail the install either
        print(f"apcsim: Cython failed ({exc}); building without the compiled modules")
        return []


setup(ext_modules=_extensions())
