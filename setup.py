"""Build the one C extension (capture/_speedups.c, linked with zlib); everything else is in pyproject.toml.

An editable install (`pip install -e .`) builds it in place, next to its source, so the work tree
imports it. Without a compiler the install fails loudly rather than silently running slower: the
pure-Python path stays importable as the fallback when the extension is missing at run time.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tributary.capture._speedups",
            sources=["capture/_speedups.c"],
            libraries=["z"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
