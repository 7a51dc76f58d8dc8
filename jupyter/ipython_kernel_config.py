# Installed by `make` into the course's environment (.venv/etc/ipython/): every kernel starts
# the course's launch server as it starts (course_lib.launcher.warm_up), so the server imports
# torch while the learner reads the first cells, and the first launch does not wait for it.
# Without this file the server starts when course_lib is first imported.
c.IPKernelApp.exec_lines = [  # noqa: F821 - `c` is the config object IPython provides
    "try:\n"
    "    import course_lib.launcher as _course_launcher\n"
    "    _course_launcher.warm_up()\n"
    "    del _course_launcher\n"
    "except Exception:  # another project's kernel in this environment: nothing to warm up\n"
    "    pass\n",
]
