"""Secrets the sandbox uses but never sees (docs/network.md, "Secrets").

A file names where each secret may go (`secrets: {NAME: {hosts: [...]}}`), within the
hosts the caller gives with each value (`Policy.secrets`, ORCHESTRATOR_SECRETS_FILE). The
sandbox's variable NAME holds a placeholder of the value's length; the egress gateway's
relay (templates/gateway/relay.py) ends TLS for those hosts alone, with a CA made for this
environment, puts the value in place of the placeholder in the header values of requests
to them, and puts the placeholder back in their answers.

Where the values are: in this process, and in the project folder's `gateway/secrets`
(0711, the values 0600, mounted read-only into the gateway alone). Never in the Compose
file, `render`, the sandbox's folder, a log or an error: `Secrets.__repr__` hides them, and
no message here names one. The CA's key lives beside them; the sandbox gets its certificate,
which is good for the secrets' hosts alone (a name constraint), so a key that leaked could
vouch for no other site."""

from __future__ import annotations

import json
import os
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import settings
from orchestrator.backends.container.layout import SANDBOX_DIR, SANDBOX_MOUNT
from orchestrator.backends.docker.network import NO_PROXY_VARS, PROXY_VARS
from orchestrator.errors import SpecIssue, UsageError
from orchestrator.paths import make_folders, read_regular, write_file
from orchestrator.spec.egress import Egress, Rule
from orchestrator.spec.loader import Environment
from orchestrator.spec.policy import Policy
from orchestrator.spec.resolve import MAIN

SECRETS_DIR = "gateway/secrets"
"""The relay's files, relative to the project folder (mounted into the gateway alone)."""
SECRETS_MOUNT = "/etc/orchestrator-gateway/secrets"
CA_FILE = f"{SANDBOX_DIR}/egress-ca.crt"
"""The environment's CA certificate, in the sandbox's own folder (no key)."""
CA_MOUNT = f"{SANDBOX_MOUNT}/egress-ca.crt"
BUNDLE = "/etc/orchestrator/ca-bundle.pem"
"""Where the sandbox's start writes the image's own CAs and the environment's together."""
TRUST_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
"""The variables that name the bundle: Python's ssl and requests, curl, git."""
_ALPHABET = string.ascii_letters + string.digits
RESERVED_VARS = frozenset(
    {*PROXY_VARS, *NO_PROXY_VARS, *TRUST_VARS, "NODE_EXTRA_CA_CERTS", "PATH", "HOME"}
)
"""Variables a secret may not take: the environment's own (a placeholder in HTTPS_PROXY
would cut the sandbox off), and those every program reads."""


@dataclass(frozen=True)
class Secret:
    name: str
    placeholder: str
    value: str = field(repr=False)
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class Secrets:
    """The secrets an environment's gateway holds, and the certificates it trusts."""

    items: tuple[Secret, ...]
    trust: str = field(default="", repr=False)
    """PEM certificates the relay trusts besides Debian's (ORCHESTRATOR_GATEWAY_TRUST)."""

    @property
    def hosts(self) -> list[str]:
        return sorted({h for s in self.items for h in s.hosts})

    def sandbox_env(self, own: dict[str, str]) -> dict[str, str]:
        """What the sandbox's environment gains: each placeholder, and the bundle that
        trusts the relay (unless the file names its own)."""
        out = {s.name: s.placeholder for s in self.items}
        for var in TRUST_VARS:
            if var not in own:
                out[var] = BUNDLE
        if "NODE_EXTRA_CA_CERTS" not in own:
            out["NODE_EXTRA_CA_CERTS"] = CA_MOUNT
        return out

    def write(self, directory: Path, project: str) -> None:
        """The relay's files and the sandbox's CA certificate, in the project folder; a
        new CA each time (a restart of the gateway and the sandbox takes both)."""
        key, cert = _make_ca(project, self.hosts)
        folder = directory / SECRETS_DIR
        make_folders(folder.parent)
        make_folders(folder, 0o711)  # the gateway's root passes, to read as the owner
        os.chmod(folder, 0o711)
        values = {
            "secrets": [
                {"placeholder": s.placeholder, "value": s.value, "hosts": list(s.hosts)}
                for s in self.items
            ]
        }
        write_file(folder / "values.json", json.dumps(values))
        write_file(folder / "mitmproxy-ca.pem", key + cert)
        write_file(folder / "hosts", "".join(f"{h}\n" for h in self.hosts), 0o644)
        write_file(folder / "upstream-ca.pem", self.trust, 0o644)
        write_file(directory / CA_FILE, cert, 0o644)


def placeholder(value: str) -> str:
    """A stand-in of the value's length: random letters and digits, so a body that holds
    one keeps its length when the relay puts the value back."""
    raw = os.urandom(len(value))
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in raw)


def plan_secrets(
    env: Environment,
    policy: Policy,
    *,
    proxied: Sequence[str],
    egress: Egress | None,
    remote: bool,
) -> tuple[Secrets | None, list[SpecIssue], list[str]]:
    """The environment's secrets with the caller's values, or the issues that refuse them:
    the sandbox must reach every secret's host through the gateway (its `network.egress` an
    allowlist naming it, for port 443). A secret the caller gives no value for is a warning,
    and its variable is not set."""
    asked = env.spec.secrets
    if not asked:
        return None, [], []
    issues: list[SpecIssue] = []
    if remote:
        issues.append(
            SpecIssue(
                env.source,
                field="secrets",
                message="the secrets' values go to the egress gateway through a folder of "
                "this machine, and the engine (ORCHESTRATOR_DOCKER_HOST) may be another one",
                fix="run it on this machine's engine, or drop `secrets`",
            )
        )
        return None, issues, []
    if MAIN not in proxied or not isinstance(egress, tuple):
        issues.append(
            SpecIssue(
                env.source,
                field="secrets",
                message="the egress gateway puts the secrets' values in, and the sandbox does "
                "not go through it: its network.egress is not an allowlist (after the "
                "caller's policy)",
                fix="give network.egress an allowlist that names each secret's hosts",
            )
        )
        return None, issues, []
    items: list[Secret] = []
    warnings: list[str] = []
    for name, use in asked.items():
        if name in RESERVED_VARS or name.startswith(("ORCHESTRATOR_", "LD_")):
            issues.append(
                SpecIssue(
                    env.source,
                    field=f"secrets.{name}",
                    message=f"{name} is a variable the environment sets itself (its proxy, "
                    "the CAs it trusts, or orchestrator's own)",
                    fix="give the secret another name",
                )
            )
        held = policy.secret(name)
        for host in use.hosts:
            if held is not None and host not in held[1]:
                issues.append(
                    SpecIssue(
                        env.source,
                        field=f"secrets.{name}.hosts",
                        message=f"the caller lets {name} go to {', '.join(held[1])} alone, "
                        f"not to {host}: the file may narrow where a secret goes, never widen it",
                        fix=f"drop {host} here (or the caller adds it: NAME@HOST,...=VALUE)",
                    )
                )
            if not any(rule.covers(Rule("name", host, (443,))) for rule in egress):
                issues.append(
                    SpecIssue(
                        env.source,
                        field=f"secrets.{name}.hosts",
                        message=f"{host} is not in network.egress for port 443 (after the "
                        "caller's policy): the secret could never reach it",
                        fix=f"add {host} to network.egress, or drop it here",
                    )
                )
        if held is None:
            warnings.append(
                f"secrets.{name}: the caller gives no value for it "
                f"({settings.SECRETS_FILE.name}): the sandbox gets no {name} variable"
            )
            continue
        items.append(Secret(name, placeholder(held[0]), held[0], tuple(use.hosts)))
    if issues:
        return None, issues, warnings
    if not items:
        return None, [], warnings
    return Secrets(tuple(items), _trust(policy.gateway_trust)), [], warnings


TRUST_LIMIT = 1024 * 1024
"""The most of ORCHESTRATOR_GATEWAY_TRUST read (PEM certificates)."""


def _trust(path: str) -> str:
    """The PEM certificates of the caller's ORCHESTRATOR_GATEWAY_TRUST ("": none); a
    UsageError naming the setting when they cannot be read."""
    if not path:
        return ""
    name = settings.GATEWAY_TRUST.name
    raw = read_regular(Path(path), TRUST_LIMIT, follow=True)
    if raw is None:
        raise UsageError(f"{name}: cannot read {path} (a regular file of certificates)")
    if len(raw) > TRUST_LIMIT or not raw.isascii() or b"-----BEGIN CERTIFICATE-----" not in raw:
        raise UsageError(f"{name}: {path} is not a PEM file of certificates (at most 1 MiB)")
    return raw.decode("ascii")


def _make_ca(project: str, hosts: Sequence[str]) -> tuple[str, str]:
    """A new CA (key and certificate, PEM) good for `hosts` alone."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "orchestrator"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"egress gateway of {project}"[:64]),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=800))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(
            x509.NameConstraints(
                permitted_subtrees=[x509.DNSName(h) for h in hosts], excluded_subtrees=None
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    return key_pem, cert.public_bytes(serialization.Encoding.PEM).decode()
