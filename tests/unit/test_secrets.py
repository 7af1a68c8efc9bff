"""Secrets (issue 41, item 2), without an engine: the caller's values are read only from a
file that is theirs alone, checked without ever being quoted; a file's `secrets` compile into
placeholders of the value's length, a gateway that mounts the relay's folder, and files whose
values stay out of what `render` shows; what cannot hold (no gateway on the way, a host the
allowlist lacks, another backend, a remote engine) is refused naming the field."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from ruamel.yaml import YAML

from orchestrator.backends.docker.relay import BUNDLE, SECRETS_DIR, SECRETS_MOUNT
from orchestrator.backends.docker.render import CompileOptions, compile_project
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.errors import SpecError, UsageError
from orchestrator.spec.loader import load_environment_text
from orchestrator.spec.policy import Policy, secrets_from_file

VALUE = "sk-unit-" + "Wx9" * 8
BASE = "version: 1\nname: sec\nimage: img\n"
LISTED = BASE + "network: {egress: [api.example.test]}\n"
SECRETS = "secrets:\n  API_KEY: {hosts: [api.example.test]}\n"


def compiled(text: str, tmp_path: Path, policy: Policy, **kw: Any) -> tuple[dict[str, Any], Any]:
    env = load_environment_text(text, base_dir=tmp_path)
    opts = CompileOptions(
        project="orch-sec-1",
        workspace=tmp_path,
        subnet="10.213.0.0/27",
        host_env={},
        policy=policy,
        **kw,
    )
    c = compile_project(env, opts)
    return YAML(typ="safe").load(c.compose_yaml), c


def test_a_files_secret_becomes_a_placeholder_and_its_value_stays_out_of_render(
    tmp_path: Path,
) -> None:
    policy = Policy(
        secrets={"API_KEY": (VALUE, ["api.example.test"]), "UNUSED_KEY": (VALUE, ["a.test"])}
    )
    doc, c = compiled(LISTED + SECRETS, tmp_path, policy)
    env = doc["services"]["main"]["environment"]
    placeholder = env["API_KEY"]
    assert len(placeholder) == len(VALUE) and placeholder != VALUE and placeholder.isalnum()
    assert "UNUSED_KEY" not in env  # the caller's other values go nowhere
    assert env["SSL_CERT_FILE"] == BUNDLE and env["REQUESTS_CA_BUNDLE"] == BUNDLE
    gateway = doc["services"]["orchestrator-egress"]
    assert any(v["target"] == SECRETS_MOUNT and v["read_only"] for v in gateway["volumes"])
    assert not any(SECRETS_MOUNT in str(v) for v in doc["services"]["main"].get("volumes", []))
    shown = c.compose_yaml + "".join(c.files.values()) + repr(c) + repr(policy)
    assert VALUE not in shown
    assert "ca-bundle.pem" in c.files["sandbox/entry.sh"]
    c.write(tmp_path / "project")
    folder = tmp_path / "project" / SECRETS_DIR
    assert folder.stat().st_mode & 0o777 == 0o711
    values = json.loads((folder / "values.json").read_text())
    assert values["secrets"] == [
        {"placeholder": placeholder, "value": VALUE, "hosts": ["api.example.test"]}
    ]
    for name, mode in (("values.json", 0o600), ("mitmproxy-ca.pem", 0o600), ("hosts", 0o644)):
        assert (folder / name).stat().st_mode & 0o777 == mode, name
    cert = x509.load_pem_x509_certificate((tmp_path / "project/sandbox/egress-ca.crt").read_bytes())
    limits = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    assert [n.value for n in limits.permitted_subtrees or []] == ["api.example.test"]
    assert b"PRIVATE KEY" not in (tmp_path / "project/sandbox/egress-ca.crt").read_bytes()


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (BASE + SECRETS, "secrets", "not an allowlist"),
        (BASE + "network: {egress: all}\n" + SECRETS, "secrets", "not an allowlist"),
        (
            BASE + "network: {egress: [other.example.test]}\n" + SECRETS,
            "secrets.API_KEY.hosts",
            "not in network.egress",
        ),
        (
            BASE + "network: {egress: ['api.example.test:8443']}\n" + SECRETS,
            "secrets.API_KEY.hosts",
            "port 443",
        ),
    ],
)
def test_a_secret_that_could_not_reach_its_host_through_the_gateway_is_refused(
    tmp_path: Path, text: str, field: str, words: str
) -> None:
    with pytest.raises(SpecError) as caught:
        compiled(text, tmp_path, Policy(secrets={"API_KEY": (VALUE, ["api.example.test"])}))
    said = str(caught.value)
    assert field in said and words in said and VALUE not in said, said


def test_the_callers_policy_narrowing_the_allowlist_refuses_the_secret_too(
    tmp_path: Path,
) -> None:
    policy = Policy(
        secrets={"API_KEY": (VALUE, ["api.example.test"])}, egress=("other.example.test",)
    )
    with pytest.raises(SpecError, match=r"secrets: .*after the caller's policy"):
        compiled(LISTED + SECRETS, tmp_path, policy)
    both = BASE + "network: {egress: [api.example.test, other.example.test]}\n" + SECRETS
    with pytest.raises(SpecError, match=r"secrets\.API_KEY\.hosts"):
        compiled(both, tmp_path, policy)


def test_a_secret_without_a_value_is_a_warning_and_no_variable(tmp_path: Path) -> None:
    doc, c = compiled(LISTED + SECRETS, tmp_path, Policy())
    assert "API_KEY" not in (doc["services"]["main"].get("environment") or {})
    assert any("secrets.API_KEY" in w and "no value" in w for w in c.warnings)
    assert "orchestrator-egress" in doc["services"] and c.secrets is None


def test_remote_engines_swarm_and_env_clashes_are_refused(tmp_path: Path) -> None:
    policy = Policy(secrets={"API_KEY": (VALUE, ["api.example.test"])})
    with pytest.raises(SpecError, match="secrets"):
        compiled(LISTED + SECRETS, tmp_path, policy, remote=True)
    env = load_environment_text(LISTED + SECRETS, base_dir=tmp_path)
    with pytest.raises(SpecError, match="swarm backend has no egress gateway to put"):
        compile_stack(env, StackOptions(project="orch-sec-1", policy=policy))
    with pytest.raises(SpecError, match="both a secret and an `env` variable"):
        load_environment_text(LISTED + SECRETS + "env: {API_KEY: x}\n", base_dir=tmp_path)
    with pytest.raises(SpecError):
        load_environment_text(BASE + "secrets:\n  API_KEY: {hosts: ['*.example.test']}\n")


def write_secrets(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    path = tmp_path / "secrets.env"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_the_secrets_file_is_read_as_name_value_lines_and_never_quoted(tmp_path: Path) -> None:
    text = f"# mine\n\nAPI_KEY@a.test={VALUE}\nOTHER_KEY @ b.test, a.test ={VALUE}\n"
    assert secrets_from_file(write_secrets(tmp_path, text)) == (
        ("API_KEY", VALUE, ("a.test",)),
        ("OTHER_KEY", VALUE, ("a.test", "b.test")),
    )
    assert secrets_from_file("") == ()
    for text, words in [
        (f"API_KEY@a.test {VALUE}\n", "line 1: not NAME@HOST,HOST=VALUE"),
        (f"API_KEY={VALUE}\n", "line 1: not NAME@HOST,HOST=VALUE"),
        ("API_KEY@a.test=short-value-1\n", "16 to 4096"),
        (f"1KEY@a.test={VALUE}\n", "not a variable name"),
        (f"API_KEY@a.test={VALUE}\tx\n", "letters, digits and -._~"),
        (f'API_KEY@a.test={VALUE}"\\\n', "letters, digits and -._~"),
        (f"API_KEY@a.test={VALUE}/+=\n", "letters, digits and -._~"),
        (f"API_KEY@*.a.test={VALUE}\n", "name the hosts"),
    ]:
        with pytest.raises(UsageError) as caught:
            secrets_from_file(write_secrets(tmp_path, text))
        assert words in str(caught.value) and VALUE not in str(caught.value), caught.value
    with pytest.raises(UsageError, match="chmod 600"):
        secrets_from_file(write_secrets(tmp_path, f"API_KEY@a.test={VALUE}\n", 0o640))
    link = tmp_path / "link.env"
    link.symlink_to(tmp_path / "secrets.env")
    with pytest.raises(UsageError, match="cannot open"):
        secrets_from_file(str(link))
    with pytest.raises(UsageError, match="cannot open"):
        secrets_from_file(str(tmp_path / "missing.env"))


def test_policy_from_env_reads_the_file_and_its_repr_shows_no_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "ORCHESTRATOR_SECRETS_FILE", write_secrets(tmp_path, f"API_KEY@a.test={VALUE}\n")
    )
    policy = Policy.from_env()
    assert policy.secret("API_KEY") == (VALUE, ("a.test",))
    assert VALUE not in repr(policy) and VALUE not in str(policy)
    with pytest.raises(UsageError) as caught:
        Policy(secrets={"API_KEY": ("x" * 15, ["a.test"])})
    assert "x" * 15 not in str(caught.value)
    assert os.environ["ORCHESTRATOR_SECRETS_FILE"].endswith("secrets.env")


def test_the_gateways_trust_must_be_a_readable_pem_file(tmp_path: Path) -> None:
    for content, words in [(None, "cannot read"), ("not a certificate\n", "not a PEM file")]:
        path = tmp_path / "trust.pem"
        if content is not None:
            path.write_text(content)
        policy = Policy(secrets={"API_KEY": (VALUE, ["api.example.test"])}, gateway_trust=str(path))
        with pytest.raises(UsageError, match=f"ORCHESTRATOR_GATEWAY_TRUST: .*{words}"):
            compiled(LISTED + SECRETS, tmp_path, policy)


def test_the_file_narrows_where_a_secret_goes_never_widens_it_nor_takes_a_reserved_name(
    tmp_path: Path,
) -> None:
    caller = Policy(secrets={"API_KEY": (VALUE, ["other.example.test"])})
    with pytest.raises(SpecError) as caught:
        compiled(LISTED + SECRETS, tmp_path, caller)
    said = str(caught.value)
    assert "secrets.API_KEY.hosts" in said and "never widen" in said and VALUE not in said
    for name in ("HTTPS_PROXY", "SSL_CERT_FILE", "LD_PRELOAD", "ORCHESTRATOR_X"):
        text = LISTED + f"secrets:\n  {name}: {{hosts: [api.example.test]}}\n"
        policy = Policy(secrets={name: (VALUE, ["api.example.test"])})
        with pytest.raises(SpecError, match=f"secrets.{name}: .*sets itself"):
            compiled(text, tmp_path, policy)
