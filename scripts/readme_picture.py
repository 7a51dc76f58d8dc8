"""Write the README's picture: a stored figure of a lesson, copied byte for byte from the executed notebook.

    .venv/bin/python scripts/readme_picture.py          (tests/test_docs.py checks that the copy is current)

The picture is chapter 01's all-gather, drawn per rank before and after, from the output the
lesson stored when it ran on real ranks: nothing in it is drawn by hand.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LESSON = REPO / "notebooks" / "01_collectives.ipynb"
DEFINES = "def run_all_gather():"  # the cell whose figure it is
PICTURE = REPO / "docs" / "img" / "01_all_gather.png"


def stored_figure(lesson: Path = LESSON, defines: str = DEFINES) -> bytes:
    for cell in json.loads(lesson.read_text())["cells"]:
        if cell["cell_type"] == "code" and defines in "".join(cell["source"]):
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    return base64.b64decode(output["data"]["image/png"])
    raise LookupError(f"no stored figure in the cell of {lesson.name} that has {defines!r}")


def main() -> None:
    PICTURE.parent.mkdir(parents=True, exist_ok=True)
    PICTURE.write_bytes(stored_figure())
    print(f"{LESSON.relative_to(REPO)} -> {PICTURE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
