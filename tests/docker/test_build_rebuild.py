"""Builds follow what they are built from (issue 21, items 1 and 10): an edit of the
Dockerfile, of a file of the context or of a build arg rebuilds; nothing changed builds
nothing; `--build` rebuilds through the engine's cache, `--no-build` builds nothing and says
which image is missing; spawns starting together build once. The builder's output is a live
tail under a spinner on a real terminal (tmux), plain lines on stderr otherwise."""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import BuildChoice, spawn_runtime
from orchestrator.backends.docker.buildplan import build_tags
from orchestrator.spec.loader import load_environment
from tests.conftest import BUSYBOX_IMAGE

CLI = [sys.executable, "-m", "orchestrator"]


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


def orch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=os.environ.copy()
    )


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A folder with env.yaml (name unique to the test) building from its Dockerfile; every
    image built for it (orchestrator-build/<name>-main:*) is removed after, by tag."""
    name = f"rb{uuid.uuid4().hex[:8]}"
    (tmp_path / "env.yaml").write_text(f"version: 1\nname: {name}\nbuild: {{context: .}}\n")
    (tmp_path / "Dockerfile").write_text(f"FROM {BUSYBOX_IMAGE}\nENV BUILT=yes\n")
    try:
        yield tmp_path
    finally:
        for base in (f"orchestrator-build/{name}-main", f"orchestrator-test/{name}-base"):
            listed = docker("image", "ls", base, "--format", "{{.Repository}}:{{.Tag}}")
            for tag in listed.stdout.split():
                docker("image", "rm", "-f", tag)


def run_echo(project: Path, *flags: str, what: str = "$BUILT") -> subprocess.CompletedProcess[str]:
    return orch("run", *flags, str(project / "env.yaml"), "--", f"echo {what}")


def image_of(project: Path) -> tuple[str, str]:
    """(tag, image id) of the project's build as the file stands now."""
    [tag] = build_tags(load_environment(project / "env.yaml"))
    found = docker("image", "inspect", "--format", "{{.Id}} {{.Created}}", tag)
    return tag, found.stdout.strip()


def test_an_edited_dockerfile_is_built_and_runs(project: Path) -> None:
    first = run_echo(project)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "yes\n"
    (project / "Dockerfile").write_text(f"FROM {BUSYBOX_IMAGE}\nENV BUILT=v2\n")
    second = run_echo(project)
    assert second.returncode == 0, second.stderr
    assert second.stdout == "v2\n"


def test_an_edited_context_file_and_build_arg_are_built(project: Path) -> None:
    (project / "Dockerfile").write_text(
        f"FROM {BUSYBOX_IMAGE}\nARG FLAVOUR=plain\nCOPY data.txt /data.txt\n"
        "RUN echo $FLAVOUR > /flavour\n"
    )
    (project / "data.txt").write_text("one\n")
    assert run_echo(project, what="$(cat /data.txt)").stdout == "one\n"
    (project / "data.txt").write_text("two\n")
    assert run_echo(project, what="$(cat /data.txt)").stdout == "two\n"
    env = project / "env.yaml"
    env.write_text(env.read_text().replace("{context: .}", "{context: ., args: {FLAVOUR: hot}}"))
    assert run_echo(project, what="$(cat /flavour)").stdout == "hot\n"


def test_a_files_own_labels_cannot_pass_its_build_off_as_a_snapshot(project: Path) -> None:
    """A Dockerfile's LABEL lines naming our state folder, a record and a tag made the
    image look like a snapshot image of ours to the reap (which then judged, and could
    remove, it): a build sets those labels empty, last."""
    from orchestrator.backends.container.identity import (
        LABEL_SNAPSHOT_RECORD,
        LABEL_SNAPSHOT_STATE,
        LABEL_SNAPSHOT_TAG,
    )
    from orchestrator.paths import state_dir

    forged = {
        LABEL_SNAPSHOT_STATE: str(state_dir().resolve()),
        LABEL_SNAPSHOT_RECORD: "/nowhere/gone.json",
        LABEL_SNAPSHOT_TAG: "orchestrator-snapshot:0123456789ab",
    }
    lines = "".join(f"LABEL {k}={json.dumps(v)}\n" for k, v in forged.items())
    (project / "Dockerfile").write_text(f"FROM {BUSYBOX_IMAGE}\n{lines}ENV BUILT=yes\n")
    done = run_echo(project)
    assert done.returncode == 0 and done.stdout == "yes\n", done.stderr
    tag, _ = image_of(project)
    got = docker("image", "inspect", "--format", "{{json .Config.Labels}}", tag)
    labels = json.loads(got.stdout)
    assert all(labels.get(k) == "" for k in forged), labels


def test_nothing_changed_builds_nothing(project: Path) -> None:
    first = run_echo(project)
    assert first.returncode == 0, first.stderr
    tag, before = image_of(project)
    assert before, f"{tag} was not built"
    again = run_echo(project)
    assert again.returncode == 0 and again.stdout == "yes\n", again.stderr
    assert image_of(project) == (tag, before)  # the same image, not made again
    assert "building" not in again.stderr and "Step 1/" not in again.stderr


def test_no_build_with_the_image_missing_is_a_usage_error_naming_it(project: Path) -> None:
    [tag] = build_tags(load_environment(project / "env.yaml"))
    refused = run_echo(project, "--no-build")
    assert refused.returncode == 2, refused.stderr
    assert tag in refused.stderr and "--no-build" in refused.stderr
    assert "Traceback" not in refused.stderr
    up = orch("up", str(project / "env.yaml"), "--no-build")
    assert up.returncode == 2 and tag in up.stderr and up.stdout == ""
    assert docker("image", "inspect", tag).returncode != 0  # and nothing was built
    assert run_echo(project).returncode == 0  # built now: --no-build takes it
    assert run_echo(project, "--no-build").stdout == "yes\n"


def moved_base(project: Path, request: pytest.FixtureRequest) -> tuple[str, str, str]:
    """Build the project from a base image, then move the base's tag to a new image: a change
    no file here shows. Returns (tag, "id created") of the project's build from the old base,
    and the old base's id.
    The old base, untagged, is removed after the test, by id (a rebuild leaves it: it might
    be the user's)."""
    name = load_environment(project / "env.yaml").name
    base = f"orchestrator-test/{name}-base:1"

    def make_base(value: str) -> None:
        made = subprocess.run(
            ["docker", "build", "-q", "-t", base, "-"],
            input=f"FROM {BUSYBOX_IMAGE}\nRUN echo {value} > /base\n",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr

    make_base("old")
    old = docker("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    request.addfinalizer(lambda: docker("image", "rm", old) and None)
    (project / "Dockerfile").write_text(f"FROM {base}\n")
    assert run_echo(project, what="$(cat /base)").stdout == "old\n"
    make_base("new")
    assert run_echo(project, what="$(cat /base)").stdout == "old\n"  # unchanged here
    return (*image_of(project), old)


def test_build_rebuilds_what_the_fingerprint_cannot_see(
    project: Path, request: pytest.FixtureRequest
) -> None:
    """A base image moved under the same tag changes no file here: only --build sees it.
    The image the rebuild took the tag from is removed, not left behind untagged (one more
    per rebuild); its untagged parent, the old base, is not ours to remove."""
    tag, replaced, old = moved_base(project, request)
    rebuilt = run_echo(project, "--build", what="$(cat /base)")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert rebuilt.stdout == "new\n"
    assert image_of(project)[1] != replaced
    gone = replaced.split()[0]
    assert docker("image", "inspect", gone).returncode != 0, f"{tag} left {gone} behind"
    assert docker("image", "inspect", old).returncode == 0  # the base: the user's


def test_a_rebuild_keeps_the_replaced_image_when_someone_tagged_it(
    project: Path, request: pytest.FixtureRequest
) -> None:
    """Nor is it removed while another tag names it: the user's tag keeps its image."""
    tag, replaced, _ = moved_base(project, request)
    mine = tag.replace("orchestrator-build/", "orchestrator-test/").replace("-main:", "-base:")
    assert docker("tag", tag, mine).returncode == 0
    assert run_echo(project, "--build", what="$(cat /base)").stdout == "new\n"
    kept = docker("image", "inspect", "--format", "{{.Id}} {{.Created}}", mine)
    assert kept.stdout.strip() == replaced


def test_up_with_several_builds_once_and_keeps_stdout_for_ids(project: Path) -> None:
    (project / "Dockerfile").write_text(
        f"FROM {BUSYBOX_IMAGE}\nRUN printf 'ok \\033[31mred\\033]0;title\\007\\n'\n"
    )
    up = orch("up", str(project / "env.yaml"), "-n", "3")
    ids = up.stdout.split()
    try:
        assert up.returncode == 0, up.stderr
        assert len(ids) == 3 and all(i.startswith("orch-") for i in ids), up.stdout
        assert up.stderr.count("building orchestrator-build/") == 1  # once, not per spawn
        assert "Step 1/" in up.stderr or "FROM" in up.stderr  # the builder's lines, plain
        assert "\x1b" not in up.stderr  # not a terminal: no control codes, not even its own
    finally:
        for ident in ids:
            orch("down", ident)


def _builds(caplog: pytest.LogCaptureFixture) -> int:
    """How many builds began since the log was last cleared."""
    return len([m for m in caplog.messages if m.startswith("building ")])


def test_spawns_starting_together_build_once(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without `prepare` (a pool's members, a caller's threads): one build, the others wait
    and take its image."""
    caplog.set_level(logging.INFO, logger="orchestrator.build")
    results: list[object] = []

    def one() -> None:
        try:
            with spawn_runtime(project / "env.yaml") as rt:
                results.append(rt.execute("echo $BUILT").stdout)
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results == ["yes\n"] * 3
    assert _builds(caplog) == 1


def test_a_terminal_shows_the_build_under_the_spinner_not_through_it(project: Path) -> None:
    """On a real terminal (tmux): while it builds, the spinner's line holds nothing of the
    builder and the builder's lines show under it; once up, none of them is left."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    (project / "Dockerfile").write_text(
        f"FROM {BUSYBOX_IMAGE}\n"
        "RUN for i in 1 2 3 4 5 6 7 8 9 10; do echo tick$i; sleep 0.3; done\n"
    )
    sock = f"orch-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    passed = {k: os.environ[k] for k in ("ORCHESTRATOR_STATE_DIR", "PYTHONPATH") if k in os.environ}
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in passed.items())
    up = shlex.join([*CLI, "up", str(project / "env.yaml")])
    script = f"env -u COLUMNS -u LINES {env} {up}; echo __done__ $?; sleep 60"
    subprocess.run([*tmux, "new-session", "-d", "-x", "100", "-y", "40", script], check=True)
    screens: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while True:
            shown = subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True, timeout=10
            ).stdout
            screens.append(shown)
            if "__done__" in shown:
                break
            assert time.monotonic() < deadline, f"no end:\n{shown}"
            time.sleep(0.2)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)
        for ident in re.findall(r"^(orch-\S+)$", screens[-1] if screens else "", re.M):
            orch("down", ident)
    final = screens[-1]
    assert "__done__ 0" in final, final
    spinner_lines = [
        line for screen in screens for line in screen.splitlines() if "preparing " in line
    ]
    assert spinner_lines, "no spinner was shown"
    for line in spinner_lines:  # the spinner, its text and time: nothing of the builder
        assert "tick" not in line and "Step" not in line and "Sending" not in line, line
    for line in (line for screen in screens for line in screen.splitlines()):
        if "starting " in line or "preparing " in line:  # log lines go above a live display
            assert "warning" not in line, line
    assert any("tick" in s.split("preparing ", 1)[1] for s in screens if "preparing " in s), (
        "the builder's lines were not shown under the spinner"
    )
    assert "tick" not in final and "Step 1/" not in final, final  # replaced, then removed


def test_json_and_ids_stay_on_stdout_when_building(project: Path) -> None:
    up = orch("up", str(project / "env.yaml"), "--json")
    try:
        assert up.returncode == 0, up.stderr
        record = json.loads(up.stdout)
        assert record["id"].startswith("orch-")
    finally:
        for ident in re.findall(r'"id": "(orch-[^"]+)"', up.stdout):
            orch("down", ident)


def test_a_context_too_large_to_hash_is_built_through_the_cache_once_per_process(
    project: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from orchestrator import prepare
    from orchestrator.backends.docker import fingerprint

    monkeypatch.setattr(fingerprint, "WALK_FILES", 1)  # this context is "too large" now
    caplog.set_level(logging.INFO, logger="orchestrator.build")

    def builds(build: BuildChoice = "auto") -> int:
        caplog.clear()
        prepare(project / "env.yaml", build=build)
        return _builds(caplog)

    assert builds() == 1  # not known to be up to date: the engine builds it
    assert builds() == 0  # once per process
    assert builds(build="always") == 1
    assert builds(build="never") == 0
