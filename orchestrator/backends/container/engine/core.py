"""One container engine: its address, what it is (docker or podman), and how it is reached:
the docker CLI (`argv`, `run`), the Engine API on this machine's socket (`api`), and
python-on-whales' client for Compose (made on first use). The operations every module asks
of an engine are written over these (containers.py, swarm.py, sockets.py); this is the one
place that spells a docker command line.

python-on-whales is imported on a client's first use, never before: importing it costs a
process about a third of a second of CPU, which `orchestrator ps` and `exec` (plain docker CLI
calls and the executor's channel) never need to pay."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from orchestrator.backends.container.engine import api, cli
from orchestrator.backends.container.engine.api import EngineFacts
from orchestrator.backends.container.engine.bounds import backstop, bounded, engine_timeout
from orchestrator.backends.container.engine.exec_target import ExecTarget
from orchestrator.errors import BackendUnavailable, DockerError
from orchestrator.settings import engine_host

if TYPE_CHECKING:
    from python_on_whales import DockerClient

E = TypeVar("E", bound="EngineCore")
_made: dict[tuple[type, str, float | None, str | None], Any] = {}
_made_lock = threading.Lock()


LISTING_LIMIT = 16 << 20
"""Bytes an API listing may answer with (hundreds of environments' objects fit many times);
a longer one (labels nobody asked for, in bulk: anyone on the engine may add them) is
api.TooLong, and its caller asks the docker CLI instead, which prints only the labels asked
for."""


class EngineCore:
    """An engine at one address, fixed when made: later calls reach the same engine
    whatever the process's variables say by then."""

    def __init__(self, address: str, *, timeout: float | None = None) -> None:
        self.address = address
        """The engine's address as `docker --host` takes it ("": the docker CLI's default)."""
        self.timeout = timeout
        """Seconds a call may take (None: ORCHESTRATOR_ENGINE_TIMEOUT, read at each call)."""
        self.socket = api.local_socket(address)
        """Its Unix socket on this machine, where the API may be asked directly (None: the
        CLI only; see api.local_socket)."""
        self._whales: dict[float, DockerClient] = {}
        self._lock = threading.Lock()

    @classmethod
    def at(cls: type[E], address: str = "", *, timeout: float | None = None) -> E:
        """The engine at `address` (else the process's: settings.engine_host), made once
        per address, bound and socket in a process."""
        address = address or engine_host()
        key = (cls, address, timeout, api.local_socket(address))
        with _made_lock:
            made = _made.get(key)
            if made is None:
                made = _made[key] = cls(address, timeout=timeout)
        assert isinstance(made, cls)
        return made

    def within(self: E, seconds: float) -> E:
        """This engine, each call bounded at `seconds` (a probe that must not wait long)."""
        return type(self).at(self.address, timeout=seconds)

    def __repr__(self) -> str:
        return f"Engine({self.address or 'default'!r})"

    @property
    def bound(self) -> float:
        """Seconds one call may take."""
        return engine_timeout() if self.timeout is None else self.timeout

    # ----- the CLI ---------------------------------------------------------------------------
    def argv(self, *words: str, bounded: bool = True, seconds: float | None = None) -> list[str]:
        """The docker command line of `words` for this engine; `bounded` (at `seconds`, else
        the engine's bound): under coreutils `timeout`. Unbounded only for a call that lasts
        as long as what it runs (an executor, a tether, a shell), whose caller keeps the
        deadline."""
        line = ["docker", *(["--host", self.address] if self.address else []), *words]
        return _bounded(line, seconds or self.bound) if bounded else line

    def run(
        self,
        *words: str,
        action: str,
        input: bytes | None = None,
        seconds: float | None = None,
        retry: bool = False,
    ) -> str:
        """One bounded docker CLI call: its stdout (one trailing newline dropped); a typed
        DockerError when it fails; `retry`: an idempotent call, tried once more when the
        engine did not answer in time."""
        bound = seconds or self.bound
        argv = self.argv(*words, seconds=bound)
        return cli.engine_call(
            action, lambda: cli.run(argv, input=input, backstop=backstop(bound)), retry=retry
        )

    def listing(
        self, *words: str, action: str, gone: tuple[type[DockerError], ...], retry: bool = True
    ) -> str:
        """A listing call, made again when the engine fails it over an object of a kind in
        `gone` removed while it listed (see cli.listing)."""
        bound = self.bound
        argv = self.argv(*words, seconds=bound)
        return cli.listing(
            action, lambda: cli.run(argv, backstop=backstop(bound)), gone, retry=retry
        )

    def output(self, *words: str, limit: float | None, both: bool = True) -> Iterator[bytes]:
        """A call's output as it comes (both streams; stdout alone unless `both`), ended when
        the caller stops reading and after `limit` seconds (None: a call that follows, ended
        by its caller)."""
        return cli.output(self.argv(*words, bounded=False), limit, both=both)

    def exec_target(self, container: str) -> ExecTarget:
        """One container of this engine, for `docker exec` command lines."""
        return ExecTarget(self, container)

    def exec(
        self,
        container: str,
        command: list[str],
        *,
        action: str,
        user: str | None = None,
        workdir: str | None = None,
        input: bytes | None = None,
        seconds: float | None = None,
    ) -> str:
        """Run `command` in `container` to its end (bounded; never retried: an exec is not
        idempotent): its stdout, or a DockerError with its exit code and stderr, never typed
        by what it printed (the command's words are not the engine's: cli.run_command)."""
        bound = seconds or self.bound
        argv = self.exec_target(container).argv(
            command, user=user, workdir=workdir, stdin=input is not None, seconds=bound
        )
        return cli.run_command(action, argv, bound=bound, input=input)

    # ----- the API on this machine's socket --------------------------------------------------
    def api(
        self,
        method: str,
        path: str,
        *,
        action: str,
        body: Any = None,
        query: dict[str, str] | list[tuple[str, str]] | None = None,
        seconds: float | None = None,
        limit: int = api.MAX_ANSWER,
        upload: BinaryIO | None = None,
    ) -> Any:
        """One Engine API call on the engine's local socket, bounded: its JSON answer (None
        when empty; `limit`: its most bytes); failures typed as the CLI's are. Only for an
        engine with a `socket`. `upload`: a file sent as the body (api.call)."""
        if self.socket is None:
            raise BackendUnavailable(
                f"the engine at {self.address or 'the default address'} is not on this "
                "machine's socket: its API is asked through the docker CLI"
            )
        return api.call(
            action,
            self.socket,
            method,
            path,
            body=body,
            query=query,
            timeout=seconds or self.bound,
            limit=limit,
            upload=upload,
        )

    def listed(
        self,
        url: str,
        label: str,
        *,
        action: str,
        gone: tuple[type[DockerError], ...],
        retry: bool,
        query: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """The objects of the API listing at `url` that carry `label` (KEY or KEY=VALUE), as
        the API gives them (objects only), in one answer of at most LISTING_LIMIT bytes
        (api.TooLong past it); made again, as the CLI's listings are (cli.listing), when the
        engine trips over an object of a kind in `gone` removed meanwhile. Only on a local
        socket."""
        asked = {"filters": json.dumps({"label": [label]}), **(query or {})}
        got = cli.listing(
            action,
            lambda: self.api("GET", url, query=asked, action=action, limit=LISTING_LIMIT),
            gone,
            retry=retry,
        )
        if isinstance(got, dict):  # (volumes come in an object)
            got = got.get("Volumes")
        return [item for item in got if isinstance(item, dict)] if isinstance(got, list) else []

    # ----- what it is ------------------------------------------------------------------------
    def facts(self) -> EngineFacts:
        """What the engine is (docker or podman, rootless, cgroup v1), asked once per address
        and socket in a process (api.engine_facts)."""
        return api.engine_facts(self.address, self._component_names, self.bound)

    @property
    def kind(self) -> str:
        """ "docker" or "podman" (Podman's Docker-compatible API)."""
        return self.facts().kind

    def _component_names(self) -> list[str]:
        """The names of the engine's components, as its `docker version` lists them."""
        said = self.run(
            "version",
            "--format",
            "{{json .Server.Components}}",
            action="asking what the engine is",
            retry=True,
        )
        try:
            listed = json.loads(said or "null") or []
        except ValueError:
            listed = []
        return [str(c.get("Name") or "") for c in listed if isinstance(c, dict)]

    # ----- python-on-whales, for Compose and the typed objects it gives -------------------
    @property
    def whales(self) -> DockerClient:
        """python-on-whales' client of this engine, every call bounded (imported now; one
        per bound)."""
        bound = self.bound
        with self._lock:
            client = self._whales.get(bound)
            if client is None:
                client = self._whales[bound] = self.compose_client(bound)
        return client

    def compose_client(self, seconds: float | None = None, **compose: Any) -> DockerClient:
        """A python-on-whales client of this engine for one Compose project (`compose`: its
        files, name and folder), every call bounded at `seconds` (else the engine's)."""
        from python_on_whales import DockerClient

        call = _bounded(["docker"], seconds or self.bound)
        return DockerClient(client_call=call, host=self.address or None, **compose)


_bounded = bounded  # (`argv` takes a flag of that name)
