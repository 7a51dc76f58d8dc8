# The notebooks here are student submissions that tests/test_chapter_exercises.py grades
# (some deliberately wrong), not lessons: `make test` (pytest --nbval over tests/) must not
# run them as notebooks.
collect_ignore_glob = ["*.ipynb", "*/*.ipynb"]
