"""A clean copy of the checkout, for tests that build from it (wheels): what a fresh clone holds,
never the build/ folders, compiled modules or stray files a working checkout gathers. Building in
the checkout itself once shipped modules from a stale build/lib, and two builds at once (parallel
test workers) would share one build/ folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["clean_copy"]

# what a checkout gathers that a clone lacks, when there is no git to list the tracked files
_UNTRACKED = (".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", "test-artifacts", ".tributary")


def clean_copy(project: Path, into: Path) -> Path:
    """The files git tracks under `project` (its working-tree content), copied to `into`/`project`'s
    name; without git, the folder minus what a checkout gathers. Returns the copy's root."""
    target = into / project.name
    listed = subprocess.run(
        ["git", "-C", str(project), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        shutil.copytree(project, target, ignore=shutil.ignore_patterns(*_UNTRACKED), symlinks=True)
        return target
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = project / name
        if not source.is_file():  # deleted in the working tree but still in the index
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name, follow_symlinks=False)
    return target
