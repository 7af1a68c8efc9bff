"""One Compose service mapped onto a v1 target (the file's top level for the main sandbox, or
a service): each of its keys mapped, refused with its reason and fix, or ignored with its
reason (those that bring files in by `storage`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.spec.compose import storage
from orchestrator.spec.compose.model import FIX_SHAPE, KEEP_ALIVE
from orchestrator.spec.compose.target import Target
from orchestrator.spec.compose.values import (
    IGNORED,
    PORT_KEYS,
    REFUSED,
    duration,
    env_pairs,
    port_maps,
    size,
    words,
)
from orchestrator.spec.compose.variables import Loc


class Container(Target):
    """Maps one Compose service onto a v1 target (the file's top level, or a service)."""

    def run(self) -> None:
        handlers: dict[str, Callable[[Any], None]] = {
            "image": self._image,
            "build": lambda v: storage.build(self, v),
            "command": self._command,
            "entrypoint": self._entrypoint,
            "environment": self._environment,
            "env_file": lambda v: storage.env_file(self, v),
            "working_dir": lambda v: self.simple("working_dir", ("workdir",), v),
            "user": lambda v: self.simple("user", ("user",), str(v)),
            "ports": self._ports,
            "volumes": lambda v: storage.volumes(self, v),
            "tmpfs": lambda v: storage.tmpfs(self, v),
            "healthcheck": self._healthcheck,
            "depends_on": self._depends_on,
            "networks": lambda v: self.fate(("networks",), "mapped", self._net_why()),
            "network_mode": self._network_mode,
            "init": lambda v: self.fate(
                ("init",), "mapped", "every container runs an init as PID 1 already"
            ),
            "mem_limit": lambda v: self.simple("mem_limit", ("resources", "memory"), size(v)),
            "cpus": lambda v: self.simple("cpus", ("resources", "cpus"), v),
            "pids_limit": self._pids,
            "deploy": self._deploy,
            "privileged": lambda v: self.simple("privileged", ("privileged",), v),
            "cap_add": lambda v: self.simple("cap_add", ("cap_add",), v),
            "cap_drop": lambda v: self.fate(
                ("cap_drop",), "mapped", "every container drops all but a small set"
            ),
            "devices": lambda v: self.simple("devices", ("devices",), v),
            "pid": lambda v: self._namespace("pid", v),
            "ipc": lambda v: self._namespace("ipc", v),
            "uts": lambda v: self._namespace("uts", v),
            "security_opt": self._security_opt,
            "runtime": self._runtime,
            "profiles": lambda v: self.fate(("profiles",), "mapped", "no profile: it starts"),
            "x-local": lambda v: self.fate(("x-local",), "mapped", "images are never pulled"),
            "expose": lambda v: self.fate(
                ("expose",),
                "mapped",
                "every port is reachable inside the environment, as under Compose",
            ),
            "x-default": lambda v: self.fate(("x-default",), "mapped", "chooses the main sandbox"),
        }
        for key, value in self.svc.items():
            key = str(key)
            if key in handlers:
                try:
                    handlers[key](value)
                except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
                    # a value of another shape than Compose's (a file is anyone's to write)
                    self.refuse((key,), f"`{key}` cannot be read: {exc}", FIX_SHAPE)
            elif key in REFUSED:
                message, fix = REFUSED[key]
                self.refuse((key,), f"`{key}`: {message}", fix)
            elif key in IGNORED:
                self.fate((key,), "ignored", IGNORED[key])
            elif key.startswith("x-"):
                self.fate((key,), "ignored", "an extension field")
            else:
                self.fate((key,), "ignored", "not a Compose key this loader knows")
        if self.main:
            self._main_defaults()
        else:
            self._service_egress()

    def _image(self, value: Any) -> None:
        if "build" in self.svc:
            self.fate(
                ("image",),
                "ignored",
                "with `build`, the built image is tagged by its content, not this name",
            )
            return
        self.simple("image", ("image",), value)

    def _command(self, value: Any) -> None:
        if not self.main:
            self.simple("command", ("command",), words(value))
            return
        text = " ".join(value) if isinstance(value, list) else str(value)
        if KEEP_ALIVE.match(text.strip()):
            self.fate(("command",), "mapped", "the sandbox's executor keeps it alive")
        else:
            self.fate(
                ("command",),
                "ignored",
                f"the main sandbox runs the executor, not `{text[:80]}`; start it in "
                "a service, or in setup.commands",
            )

    def _entrypoint(self, value: Any) -> None:
        if not self.main:
            self.simple("entrypoint", ("entrypoint",), words(value))
        else:
            self.fate(
                ("entrypoint",), "ignored", "the main sandbox runs the executor as its entrypoint"
            )

    def _environment(self, value: Any) -> None:
        if not isinstance(value, dict | list):
            self.put(("env",), value, ("environment",))
            return
        env, passed = env_pairs(value)
        self.out.setdefault("env", {}).update(env)
        self.m.where[(*self.target, "env")] = (*self.src, "environment")
        self.fate(("environment",), "mapped")
        if passed and self.main:
            self.put(("env_passthrough",), passed, ("environment",))
        elif passed:
            self.fate(
                ("environment",),
                "ignored",
                f"{', '.join(passed)}: a service takes no host variable; give a value",
            )

    def _ports(self, value: Any) -> None:
        ports, bad = port_maps(value if isinstance(value, list) else [value], self.m.ports_left)
        self.m.ports_left -= len(ports)
        for i, item in enumerate(value if isinstance(value, list) else []):
            for extra in sorted(set(item) - PORT_KEYS) if isinstance(item, dict) else []:
                self.fate(("ports", i, extra), "ignored", "changes nothing on one machine")
        v1 = ("network", "ports") if self.main else ("ports",)
        self.put(v1, ports, ("ports",))
        for i, p in enumerate(ports):
            if isinstance(p, dict) and "host_ip" not in p:
                self.m.where[(*self.target, *v1, i)] = (*self.src, "ports")
        self.fate(
            ("ports",),
            "mapped",
            "published on 127.0.0.1 unless an address is written (Compose: every address); "
            "one other machines reach needs the caller's ORCHESTRATOR_ALLOW_PUBLIC_PORTS=1"
            if not bad
            else "",
        )

    def _healthcheck(self, value: Any) -> None:
        if self.main:
            self.fate(
                ("healthcheck",), "ignored", "the main sandbox is ready when its executor answers"
            )
            return
        if not isinstance(value, dict):
            self.put(("healthcheck",), value, ("healthcheck",))
            return
        if value.get("disable"):
            self.fate(("healthcheck",), "mapped", "disabled")
            return
        out: dict[str, Any] = {}
        for key, v in value.items():
            if key == "test":
                out["test"] = v
            elif key in ("interval", "timeout", "start_period"):
                out[key] = duration(v)
            elif key == "retries":
                out["retries"] = v
            else:
                self.fate(
                    ("healthcheck", key),
                    "ignored",
                    "interval, timeout, retries and start_period are kept",
                )
                continue
            self.m.where[(*self.target, "healthcheck", key)] = (*self.src, "healthcheck", key)
        if isinstance(out.get("test"), list) and out["test"][:1] == ["NONE"]:
            self.fate(("healthcheck",), "mapped", "disabled")
            return
        self.put(("healthcheck",), out, ("healthcheck",))
        self.fate(("healthcheck",), "mapped")

    def _depends_on(self, value: Any) -> None:
        conditions: dict[str, str] = {}
        if isinstance(value, list):
            conditions = {str(v): "service_started" for v in value}
        elif isinstance(value, dict):
            for dep, spec in value.items():
                cond = spec.get("condition", "service_started") if isinstance(spec, dict) else None
                conditions[str(dep)] = str(cond or "service_started")
        self.m.depends[self.name] = conditions
        why = "the main sandbox waits for every service (running, healthy, or a job done)"
        self.fate(("depends_on",), "mapped", why if self.main else "")

    def _network_mode(self, value: Any) -> None:
        mode = str(value)
        if mode in ("none", "host", "bridge", "default"):
            mode = "bridge" if mode == "default" else mode
            if self.main:
                self.put(("network", "mode"), mode, ("network_mode",))
                self.fate(("network_mode",), "mapped")
            elif mode == "none":
                self.put(("egress",), "none", ("network_mode",))
                self.fate(
                    ("network_mode",), "mapped", "no egress; other services still reach it by name"
                )
            elif mode == "host":
                self.refuse(
                    ("network_mode",),
                    "a service on the host's network",
                    "remove it: publish ports instead",
                )
            else:
                self.fate(("network_mode",), "mapped")
        else:
            self.fate(
                ("network_mode",),
                "ignored",
                f"{mode}: every container has its own place on the environment's network",
            )

    def _net_why(self) -> str:
        return (
            "every service shares the environment's one network; its egress follows "
            "whether its networks are `internal`"
        )

    def _egress(self) -> str | None:
        """`none` when every network this service is on is internal (Compose gives it no way
        out), else `all`; None when it has its own network_mode."""
        if "network_mode" in self.svc:
            return None
        names = self.svc.get("networks") or ["default"]
        names = list(names) if isinstance(names, dict | list) else ["default"]
        internal = [bool((self.networks.get(str(n)) or {}).get("internal")) for n in names]
        return "none" if internal and all(internal) else "all"

    def _main_defaults(self) -> None:
        self.out.setdefault("workspace", {"mount": False})
        egress = self._egress()
        if egress is not None:
            self.out.setdefault("network", {})["egress"] = egress
            if "networks" in self.svc:
                self.m.where[("network", "egress")] = (*self.src, "networks")
        if "user" not in self.svc:
            self.out["user"] = "image"  # the image's USER, as Compose runs it
        if "working_dir" not in self.svc:
            self.out["workdir"] = None  # the image's WORKDIR, as Compose starts commands

    def _service_egress(self) -> None:
        egress = self._egress()
        if egress is not None:
            self.out["egress"] = egress
            if "networks" in self.svc:
                self.m.where[(*self.target, "egress")] = (*self.src, "networks")

    def _pids(self, value: Any) -> None:
        if value in (-1, 0, "-1", "0"):
            self.fate(("pids_limit",), "ignored", "no limit")
            return
        self.simple("pids_limit", ("resources", "pids"), value)

    def _namespace(self, key: str, value: Any) -> None:
        mode = str(value)
        if mode == "host":
            self.simple(key, (key,), "host")
        elif mode in ("", "private", "shareable"):
            self.fate((key,), "mapped", "private")
        else:
            self.fate((key,), "ignored", f"{mode}: each container keeps its own namespace")

    def _security_opt(self, value: Any) -> None:
        for i, opt in enumerate(value or []):
            text = str(opt).replace("=", ":", 1)
            if text in ("no-new-privileges", "no-new-privileges:true"):
                self.fate(("security_opt", i), "mapped", "every container has it already")
            else:
                self.refuse(
                    ("security_opt", i),
                    f"`{opt}` changes the sandbox's confinement",
                    "remove it: every container runs under the engine's default "
                    "seccomp and AppArmor profiles, with no-new-privileges",
                )

    def _runtime(self, value: Any) -> None:
        if str(value) == "runsc":
            self.simple("runtime", ("isolation",), "gvisor")
        elif str(value) == "runc":
            self.simple("runtime", ("isolation",), "runc")
        else:
            self.refuse(
                ("runtime",),
                f"runtime {value!r} is not one this tool manages",
                "write `runc` or `runsc` (gVisor)",
            )

    def _deploy(self, value: Any) -> None:
        if not isinstance(value, dict):
            self.fate(("deploy",), "ignored", "not a mapping")
            return
        for key, v in value.items():
            if key != "resources" or not isinstance(v, dict):
                self.fate(("deploy", key), "ignored", "of `deploy`, only resource limits are kept")
                continue
            for kind, limits in v.items():
                if kind != "limits" or not isinstance(limits, dict):
                    self.fate(
                        ("deploy", "resources", kind),
                        "ignored",
                        "only limits are set, not reservations",
                    )
                    continue
                for lim, amount in limits.items():
                    key3: Loc = ("deploy", "resources", "limits", lim)
                    if lim == "memory":
                        self.put(("resources", "memory"), size(amount), key3)
                    elif lim == "cpus":
                        self.put(("resources", "cpus"), amount, key3)
                    elif lim == "pids":
                        self.put(("resources", "pids"), amount, key3)
                    else:
                        self.fate(key3, "ignored", "memory, cpus and pids are limited")
                        continue
                    self.fate(key3, "mapped")
