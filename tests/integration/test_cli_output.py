"""What the CLI prints, as a user's shell sees it: `[section]`-style text stays literal (rich would read
it as markup and drop it), and output through a pipe keeps long lines whole (rich wraps at 80
columns when it is not on a terminal). Real `tributary` processes, stdout a pipe, COLUMNS unset."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import run_process
from tributary.api.devdb.embedded import free_port
from tributary.capture.status import SourceState, SourceStatus, write_status
from tributary.log.local import Log, TopicConfig

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LONG = "a_source_with_a_name_long_enough_that_one_line_about_it_passes_eighty_columns"


def tributary(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tributary ARGS` with stdout and stderr pipes, no COLUMNS, no TRIBUTARY_* from outside."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRIBUTARY_") and k not in ("COLUMNS", "LINES")}
    return run_process(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", *args],
        what=f"tributary {' '.join(args[:1])}",
        cwd=cwd,
        env={**clean, **(env or {})},
    )


def test_help_shows_bracketed_text_literally(tmp_path: Path) -> None:
    serve = tributary("serve", "--help", cwd=tmp_path)
    assert serve.returncode == 0, serve.stderr
    assert "[api] host" in serve.stdout and "[api] port" in serve.stdout, serve.stdout
    assert "\\[" not in serve.stdout, serve.stdout
    init = tributary("init", "--help", cwd=tmp_path)
    assert "[service] dsn" in " ".join(init.stdout.split()), init.stdout
    assert "[[sources]]" in " ".join(init.stdout.split()), init.stdout


def test_user_error_text_with_brackets_is_printed_literally(tmp_path: Path) -> None:
    # no [service] dsn and no embedded cluster: init says so (a UserError's text) and that no
    # [[sources]] are configured, both through rich
    proc = tributary("init", cwd=tmp_path, env={"TRIBUTARY_PG_DATA_DIR": str(tmp_path / "pg")})
    assert proc.returncode == 0, proc.stderr
    assert "set [service] dsn in tributary.toml" in proc.stdout, proc.stdout
    assert "no [[sources]] configured" in proc.stdout, proc.stdout


def test_capture_status_through_a_pipe_keeps_lines_whole(tmp_path: Path) -> None:
    log_root = tmp_path / "log"
    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/none"  # nothing listens: the slot lag is unknown
    (tmp_path / "tributary.toml").write_text(
        f'[log]\nroot = "{log_root}"\n[capture]\ncapture_eventstore = false\n'
        f'[[sources]]\nname = "{LONG}"\ndsn = "{dsn}"\n'
    )
    status = SourceStatus(name=LONG, slot="tributary_long", state=SourceState.FAILED, changes=12_345)
    status.error = "[x] the server went away"
    write_status(log_root, pid=1, updated_ms=int(time.time() * 1000), sources=[status])
    proc = tributary("capture", "status", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith(f"{LONG} failed slot=tributary_long"), proc.stdout
    assert "changes=12,345" in lines[0] and lines[0].endswith("[x] the server went away"), proc.stdout


def test_log_topics_through_a_pipe_keeps_lines_whole(tmp_path: Path) -> None:
    topic = f"{LONG}.public.orders"
    with Log.open(tmp_path / "log", writer=True) as log:
        log.create_topic(topic, TopicConfig(partitions=1))
        log.append(topic, 0, [(b'{"id":1}', b'{"op":"c"}', 0, None)])
        log.commit()
    proc = tributary("log", "topics", "--root", str(tmp_path / "log"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1 and proc.stdout.startswith(f"{topic}\tpartitions=1"), proc.stdout
    reference = tributary("config", "reference", cwd=tmp_path)
    longest = max(reference.stdout.splitlines(), key=len)
    assert len(longest) > 80, reference.stdout  # a long line of the reference reaches the pipe whole
    assert longest in (ROOT / "README.md").read_text(), longest
