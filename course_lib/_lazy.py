"""Package names imported on first use (PEP 562), shared by course_lib and course_lib.grading.

A process that needs only a light part of the library, such as the grader's pytest plugin
``course_lib.grading.verdicts``, then does not pay for importing torch.
"""

import importlib
import sys


def lazy_names(package: str, where: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for ``package``: each name in ``where`` comes from the
    (relative) module it maps to, imported the first time the name is used."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        namespace[name] = value  # found directly from now on
        return value

    def __dir__():
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
