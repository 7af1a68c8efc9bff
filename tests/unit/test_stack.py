"""The swarm stack compiler: what Swarm cannot do is a spec error naming the field, and the
security policy holds as on Compose (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from orchestrator import PolicyError, SpecError, load_environment, load_environment_text
from orchestrator.backends.swarm.compile import StackOptions, compile_stack

BASE = "version: 1\nname: st\nbackend: swarm\n"


def _fields(text: str) -> set[str]:
    with pytest.raises(SpecError) as info:
        compile_stack(load_environment_text(BASE + text), StackOptions(project="p"))
    return {issue.field for issue in info.value.issues}


def test_what_swarm_cannot_do_names_its_field() -> None:
    assert _fields("build: {context: .}\n") == {"build"}
    assert _fields("image: i\nmounts: [{source: /srv, target: /srv}]\n") == {"mounts"}
    assert _fields("image: i\nnetwork: {ports: [{container: 8080}]}\n") == {"network.ports"}
    assert _fields("image: i\nresources: {pids: 64, disk: 1g}\n") == {
        "resources.pids",
        "resources.disk",
    }
    assert _fields("image: i\nkeep_after_cleanup: true\n") == {"keep_after_cleanup"}
    assert _fields("image: i\nservices: {db: {image: d, ports: [{container: 5432}]}}\n") == {
        "services.db.ports"
    }


def test_limits_placement_and_labels_become_swarms() -> None:
    env = load_environment_text(
        BASE + "image: i\nuser: '1000:1000'\nresources: {memory: 256m, cpus: 0.5, tmp: 64m}\n"
        "placement: ['node.role==worker']\nnetwork: {outbound: true}\n"
        "services: {db: {image: d, placement: ['node.labels.db==true']}}\n"
    )
    stack = compile_stack(env, StackOptions(project="p", labels={"org.orchestrator.x": "1"}))
    text = stack.stack_yaml
    assert 'memory: "256m"' in text and 'cpus: "0.5"' in text and "/tmp:size=64m" in text
    assert '- "node.role==worker"' in text and '- "node.labels.db==true"' in text
    assert "internal: false" in text and "restart_policy: {condition: none}" in text
    assert '"org.orchestrator.user": "1000:1000"' in text
    assert any("no-new-privileges" in w for w in stack.warnings)


def test_the_policy_holds(tmp_path: Path) -> None:
    (tmp_path / "env.yaml").write_text(
        BASE + "image: i\nprivileged: true\nstatic_assets: [{name: s, path: /etc, save_path: s}]\n"
    )
    with pytest.raises(PolicyError) as info:
        compile_stack(load_environment(tmp_path / "env.yaml"), StackOptions(project="p"))
    fields = {issue.field for issue in info.value.issues}
    assert {"privileged", "static_assets.0"} <= fields


def test_static_assets_and_a_workdir_are_in_place_before_a_service_command(
    tmp_path: Path,
) -> None:
    """Swarm starts a service before anything can be copied into it: a service that shows
    the static assets, or has a workdir, waits for the runtime (the gate), then runs the
    image's entrypoint and its command; the others start as they are."""
    from orchestrator.backends.container.copyin import GATE

    (tmp_path / "site").mkdir()
    (tmp_path / "env.yaml").write_text(
        BASE + "image: i\nstatic_assets: [{name: site, path: site, save_path: site}]\n"
        "services:\n"
        "  web: {image: p, command: [python3, -m, http.server, --directory, /static/site]}\n"
        "  side: {image: p, user: '4321:4321', workdir: /home/side, static_assets: false}\n"
        "  plain: {image: p, static_assets: false}\n"
    )
    opts = StackOptions(project="p", labels={"org.orchestrator.managed": "1"})
    text = compile_stack(load_environment(tmp_path / "env.yaml"), opts)
    doc = YAML(typ="safe").load(text.stack_yaml)
    web, side, plain = (doc["services"][n] for n in ("web", "side", "plain"))
    gate = ["/bin/sh", "-c", GATE.replace("$", "$$"), "orchestrator-gate"]
    assert web["entrypoint"] == gate and web["command"][:2] == ["python3", "-m"]
    assert side["entrypoint"] == gate and side["command"] == []
    assert side["working_dir"] == "/home/side" and side["user"] == "0:0"  # the gate drops
    assert "entrypoint" not in plain and "working_dir" not in plain
    assert text.user == doc["services"]["main"]["labels"]["org.orchestrator.user"]


def test_a_services_entrypoint_replaces_the_images() -> None:
    env = load_environment_text(
        BASE + "image: i\nservices:\n  s: {image: d, entrypoint: 'sh -c', command: ['echo hi']}\n"
        "  g: {image: d, entrypoint: [sh, -c], workdir: /w}\n"
    )
    text = compile_stack(env, StackOptions(project="p")).stack_yaml
    assert 'entrypoint: ["sh", "-c"]' in text  # a string is split as Compose splits it
    assert text.count("entrypoint:") == 3  # the main sandbox's, s's, and g's gate


def test_a_named_volume_is_refused_on_swarm() -> None:
    assert _fields("image: i\nvolumes: [{volume: v, target: /v}]\n") == {"volumes"}


def test_the_images_user_and_workdir_are_refused_on_swarm() -> None:
    assert _fields("image: i\nuser: image\nworkdir: null\nworkspace: {mount: false}\n") == {
        "user",
        "workdir",
    }


def test_a_swarm_needs_the_callers_consent_to_pull(tmp_path: Path) -> None:
    """A Swarm's nodes pull each task's image from the registry its name says (issue 37,
    item 8): a spawn there is refused, naming the field and the fix, before anything is
    asked of a Swarm, unless the caller allows pulls."""
    from orchestrator import spawn_runtime

    path = tmp_path / "sw.yaml"
    path.write_text("version: 1\nname: sw\nimage: registry.example.invalid/x:1\nworkdir: /w\n")
    with pytest.raises(PolicyError, match="ORCHESTRATOR_ALLOW_PULL=1") as err:
        spawn_runtime(load_environment(path), backend="swarm")
    assert "image" in str(err.value)


def test_every_service_of_a_stack_keeps_16_mb_of_output_at_most() -> None:
    """A sandbox writing to its first process's stdout filled a node's disk through its
    log (as it once could the host's through Compose): each service's log is capped."""
    env = load_environment_text(BASE + "image: i\nservices: {db: {image: d}}\n")
    doc = YAML(typ="safe").load(compile_stack(env, StackOptions(project="p", labels={})).stack_yaml)
    for name, service in doc["services"].items():
        assert service["logging"] == {
            "driver": "json-file",
            "options": {"max-size": "8m", "max-file": "2"},
        }, name
