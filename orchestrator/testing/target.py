"""What the conformance suite runs against: a backend and how to write its environment file."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from orchestrator import (
    Environment,
    Policy,
    Runtime,
    Snapshot,
    get_runtime_class,
    load_environment,
    spawn_runtime,
)

PASSED = "ORCH_PASS"
"""The host variable the suite's file names in env_passthrough and the caller allows."""
SITE = "<h1>static site</h1>\n"
"""The multi-service profile's static asset (site/index.html)."""
SIDE_UID = 4321
"""The non-root sidecar's uid and gid (no entry in the image's passwd file)."""
SIDE_WORKDIR = "/home/side/work"
"""The non-root sidecar's workdir (not in the image: made for it)."""
STARTED = "started-in"
"""What the non-root sidecar's command writes, relative to its workdir, as it starts."""


@dataclass(frozen=True)
class Target:
    """One backend configuration under test."""

    backend: str
    """Registered backend name."""
    env_lines: tuple[str, ...] = ()
    """Extra lines of the environment file (image, user, resources ...)."""
    process_env: Mapping[str, str] = field(default_factory=dict)
    """Variables set while the runtime is spawned (e.g. ORCHESTRATOR_EXEC_MODE=plain)."""
    default_uid: str | None = None
    """What `id -u` prints when a command names no user; None: this process's uid."""
    label: str = ""
    """Test id; the backend name when empty."""
    service_image: str | None = None
    """An image with /bin/sh, coreutils and python3 for the multi-service profile's
    sidecars (orchestrator.testing.services); None: that profile is skipped."""
    deviations: Mapping[str, str] = field(default_factory=dict)
    """Rules this configuration does not keep, and why, beyond its backend's own (an
    isolation level of one backend, say)."""
    keeps: frozenset[str] = frozenset()
    """Rules its backend deviates from that this configuration keeps all the same (gVisor
    with no network keeps "fork-memory"): a check of one fails rather than skips."""
    front_door: Literal["blocking", "async"] = "blocking"
    """Which API the suite calls: the blocking one, or `orchestrator.aio` (through
    orchestrator.testing.door, which answers as the blocking API)."""

    @property
    def id(self) -> str:
        return self.label or self.backend

    def deviation(self, rule: str) -> str | None:
        """The backend's documented reason for not keeping `rule`, if it does not."""
        if rule in self.deviations:
            return self.deviations[rule]
        if rule in self.keeps:
            return None
        return get_runtime_class(self.backend).deviations.get(rule)

    def env_text(self, setup: tuple[str, ...] | None = None) -> str:
        """The suite's environment file: variables, a static asset, setup and eval commands."""
        setup = setup or (
            "echo setup-marker",
            "echo ran >> .setup-count",
            "cat {{static:data}}/hello.txt > .static-copy",
        )
        lines = [
            "version: 1",
            f"name: conf-{self.id}",
            f"backend: {self.backend}",  # any registered name, a plugin's too
            "env: {FILE_VAR: from-file, OVERRIDE: file}",
            f"env_passthrough: [{PASSED}]",
            "static_assets:",
            "  - {name: data, path: assets, save_path: data}",
            "setup:",
            f"  commands: [{', '.join(repr(c) for c in setup)}]",
            "  eval_commands: ['echo eval >> .eval-count']",
            "  resume_commands: ['echo resumed >> .resume-count']",
            "commands: {show: 'cat {{static:data}}/hello.txt'}",
            *self.env_lines,
        ]
        return "\n".join(lines) + "\n"

    def write_env(self, folder: Path, setup: tuple[str, ...] | None = None) -> Path:
        (folder / "assets").mkdir(parents=True, exist_ok=True)
        (folder / "assets" / "hello.txt").write_text("static hello\n")
        path = folder / "env.yaml"
        path.write_text(self.env_text(setup))
        return path

    def services_env_text(self) -> str:
        """The multi-service profile's file: a sidecar whose command reads the static assets
        as it starts and serves them, and a non-root sidecar that starts in its own workdir."""
        image = self.service_image
        web = (
            "cat /static/site/index.html > /tmp/at-start && "
            "exec python3 -m http.server --directory /static/site 8080"
        )
        probe = "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/index.html')"
        side = f"pwd > {STARTED} && id -u >> {STARTED} && exec sleep 86400"
        lines = [
            "version: 1",
            f"name: conf-svc-{self.id}",
            f"backend: {self.backend}",
            "static_assets:",
            "  - {name: site, path: site, save_path: site}",
            "services:",
            "  web:",
            f"    image: {image}",
            f"    command: [sh, -c, {json.dumps(web)}]",
            f"    healthcheck: {{test: [CMD, python3, -c, {json.dumps(probe)}], retries: 60}}",
            "  side:",
            f"    image: {image}",
            f"    user: '{SIDE_UID}:{SIDE_UID}'",
            f"    workdir: {SIDE_WORKDIR}",
            f"    command: [sh, -c, {json.dumps(side)}]",
            *self.env_lines,
        ]
        return "\n".join(lines) + "\n"

    def spawn_services(self, folder: Path) -> Runtime:
        """A runtime of the multi-service profile's file."""
        (folder / "site").mkdir(parents=True, exist_ok=True)
        (folder / "site" / "index.html").write_text(SITE)
        path = folder / "env.yaml"
        path.write_text(self.services_env_text())
        with self.environment():
            return self._spawn(load_environment(path), backend=self.backend, policy=self.policy())

    def _spawn(self, env: Environment, **kwargs: Any) -> Runtime:
        """spawn_runtime, through the target's front door."""
        if self.front_door == "blocking":
            return spawn_runtime(env, **kwargs)
        from orchestrator import aio
        from orchestrator.testing.door import through_async

        return through_async(lambda: aio.spawn(env, **kwargs))

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """Set `process_env` (and the suite's pass-through variables) for a spawn."""
        wanted = {
            **self.process_env,
            PASSED: "passed",
            "ORCH_NOPASS": "hidden",
        }
        old = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)
        try:
            yield
        finally:
            for key, value in old.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def policy(self) -> Policy:
        """The caller's policy: the process's (ORCHESTRATOR_*), plus the suite's pass-through
        variable, which only the caller can let through (the file alone passes none)."""
        base = Policy.from_env()
        return dataclasses.replace(base, allow_env=base.allow_env | {PASSED})

    def spawn(
        self,
        folder: Path,
        *,
        setup: tuple[str, ...] | None = None,
        is_evaluation: bool = False,
        disable_setup: bool = False,
        resume: Snapshot | None = None,
    ) -> Runtime:
        path = self.write_env(folder, setup)
        with self.environment():
            return self._spawn(
                load_environment(path),
                backend=self.backend,
                env_vars={"OVERRIDE": "spawn", "SPAWN_VAR": "1"},
                is_evaluation=is_evaluation,
                disable_setup=disable_setup,
                resume=resume,
                policy=self.policy(),
            )


STAT = (
    "import os, sys; s = os.lstat(sys.argv[2]); "
    "print(sys.argv[1].replace('%u', str(s.st_uid)).replace('%g', str(s.st_gid))"
    ".replace('%a', format(s.st_mode & 0o7777, 'o')))"
)
"""A file's owner and mode as `stat -c FORMAT` prints them (%u %g %a), read by Python's
os.lstat: coreutils 9's `stat` and `ls` ask for statx, which some gVisor builds refuse."""


def stat_argv(fmt: str, path: str) -> list[str]:
    return ["python3", "-c", STAT, fmt, path]
