"""`network.egress`: entries, the caller's narrowing, and what each setting compiles to
(which networks each container joins, its resolvers, the gateway's rules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ruamel.yaml import YAML

from orchestrator.backends.docker.network import (
    FORWARDER,
    FRONT_URL,
    GATEWAY,
    PROXY_URL,
    RULES_FILE,
    gateway_rules,
    squid_rules,
)
from orchestrator.backends.docker.render import CompileOptions, compile_project
from orchestrator.backends.swarm.compile import StackOptions, compile_stack
from orchestrator.errors import SpecError
from orchestrator.spec import egress
from orchestrator.spec.egress import DEFAULT_PORTS, Rule, narrow, parse, parse_rule
from orchestrator.spec.loader import load_environment_text
from orchestrator.spec.policy import Policy

BASE = "version: 1\nname: eg\nimage: img\n"


def compiled(text: str, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], Any]:
    env = load_environment_text(text, base_dir=tmp_path)
    opts = CompileOptions(
        project="orch-eg-1",
        workspace=tmp_path,
        subnet="10.213.0.0/27",
        host_env={},
        leave_by=kw.pop("leave_by", ""),
        resolvers=kw.pop("resolvers", ()),
        **kw,
    )
    c = compile_project(env, opts)
    return YAML(typ="safe").load(c.compose_yaml), c


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("example.com", Rule("name", "example.com", DEFAULT_PORTS)),
        ("Example.COM.", Rule("name", "example.com", DEFAULT_PORTS)),
        ("*.example.com", Rule("suffix", "example.com", DEFAULT_PORTS)),
        ("example.com:8443", Rule("name", "example.com", (8443,))),
        ("10.0.0.0/8", Rule("net", "10.0.0.0/8", ())),
        ("10.1.2.3:5432", Rule("net", "10.1.2.3/32", (5432,))),
    ],
)
def test_entries_parse(text: str, rule: Rule) -> None:
    assert parse_rule(text) == rule


@pytest.mark.parametrize("text", ["[2001:db8::/32]:443", "2001:db8::1", "::/0"])
def test_ipv6_entries_are_refused_saying_why(text: str) -> None:
    """The gateway reaches the outside over IPv4 only: an IPv6 entry never matched anything
    (and a request for an IPv6 address aborted its Squid), so it is refused, saying why."""
    with pytest.raises(ValueError, match="IPv4 only"):
        parse_rule(text)


@pytest.mark.parametrize(
    "text",
    ["", "*", "*.", "a*.example.com", "ex ample.com", "example.com:0", "example.com:70000",
     "http://example.com", "example.com/path", "[::1", "a..b", "-a.com:x"],
)  # fmt: skip
def test_bad_entries_are_refused_naming_them(text: str) -> None:
    with pytest.raises(ValueError, match=r"allowlist entry|port|none, all"):
        parse_rule(text) if text else parse(text)


def test_file_errors_name_the_field_and_line(tmp_path: Path) -> None:
    text = BASE + "network:\n  egress:\n    - ok.example\n    - 'bad host'\n"
    with pytest.raises(SpecError) as err:
        load_environment_text(text, base_dir=tmp_path)
    assert "network.egress" in str(err.value) and "'bad host'" in str(err.value)


def test_outbound_is_the_old_shorthand_and_not_both(tmp_path: Path) -> None:
    on = load_environment_text(BASE + "network: {outbound: true}\n", base_dir=tmp_path)
    off = load_environment_text(BASE + "network: {outbound: false}\n", base_dir=tmp_path)
    assert (on.spec.network.egress_setting(), off.spec.network.egress_setting()) == ("all", "none")
    with pytest.raises(SpecError, match="give `egress` only"):
        load_environment_text(BASE + "network: {outbound: true, egress: none}\n")


def test_the_caller_narrows_never_widens() -> None:
    asked = parse(["a.example.com", "*.pypi.example", "10.1.0.0/16:5432", "other.test"])
    allowed = parse(["*.example.com", "*.pypi.example:443", "10.0.0.0/8"])
    got, notes = narrow(asked, allowed)
    assert got == parse(["a.example.com", "10.1.0.0/16:5432"])
    assert "other.test" in notes[0] and "*.pypi.example" in notes[0]  # 80 is not allowed
    assert narrow("all", allowed)[0] == allowed
    assert narrow(asked, "none")[0] == "none"
    assert narrow("none", "all") == ("none", [])
    assert narrow(asked, "all") == (asked, [])


names = st.from_regex(r"[a-c]{1,2}(\.[a-c]{1,2}){0,2}", fullmatch=True)
entries = st.builds(
    lambda wild, name, port: ("*." if wild else "") + name + (f":{port}" if port else ""),
    st.booleans(),
    names,
    st.sampled_from([None, 80, 443, 8080]),
)


@given(st.lists(entries, min_size=1, max_size=5), st.lists(entries, min_size=1, max_size=5))
def test_narrowing_only_ever_keeps_what_both_allow(file: list[str], caller: list[str]) -> None:
    asked, allowed = parse(file), parse(caller)
    got, _ = narrow(asked, allowed)
    if got == "none":
        return
    assert isinstance(got, tuple) and isinstance(allowed, tuple) and isinstance(asked, tuple)
    for rule in got:
        assert rule in asked  # never more than the file asked
        assert any(a.covers(rule) for a in allowed)  # never more than the caller allows


def test_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRATOR_EGRESS", "none")
    assert Policy.from_env().egress == "none"
    monkeypatch.setenv("ORCHESTRATOR_EGRESS", "allowed.test, *.pypi.example:443")
    assert Policy.from_env().egress == parse(["allowed.test", "*.pypi.example:443"])
    monkeypatch.setenv("ORCHESTRATOR_EGRESS", "not a host")
    with pytest.raises(Exception, match="ORCHESTRATOR_EGRESS"):
        Policy.from_env()


def test_none_keeps_every_container_in_and_pins_dns(tmp_path: Path) -> None:
    text = BASE + "services:\n  db: {image: db}\n"
    doc, c = compiled(text, tmp_path)
    assert doc["networks"]["default"]["internal"] is True
    assert set(doc["networks"]) == {"default"}
    for name in ("main", "db"):
        assert doc["services"][name]["dns"] == ["127.0.0.1"]
        assert "HTTP_PROXY" not in doc["services"][name].get("environment", {})
    assert not c.infra


def test_all_everywhere_is_one_routed_network(tmp_path: Path) -> None:
    text = BASE + "network: {egress: all, ports: [{container: 80}]}\nservices:\n  db: {image: db}\n"
    doc, c = compiled(text, tmp_path, resolvers=("10.9.9.9",))
    assert doc["networks"]["default"]["internal"] is False
    assert doc["services"]["main"]["ports"] == ["127.0.0.1::80/tcp"]  # no forwarder needed
    assert doc["services"]["main"]["dns"] == ["10.9.9.9"]
    assert not c.infra


def test_allowlist_puts_a_gateway_between_the_sandbox_and_the_outside(tmp_path: Path) -> None:
    text = BASE + "network: {egress: [allowed.test, '*.allowed.test:443']}\n"
    doc, c = compiled(text, tmp_path)
    main, gw = doc["services"]["main"], doc["services"][GATEWAY]
    assert c.infra == (GATEWAY,)
    assert main.get("networks", ["default"]) == ["default"]  # never on the way out itself
    assert main["dns"] == ["127.0.0.1"]
    assert main["environment"]["HTTPS_PROXY"] == PROXY_URL
    assert main["environment"]["HTTP_PROXY"] == main["environment"]["http_proxy"] == FRONT_URL
    assert gw["networks"] == ["default", "egress"]
    assert doc["networks"]["egress"]["internal"] is False
    assert doc["networks"]["default"]["internal"] is True
    assert gw["cap_drop"] == ["ALL"] and "NET_ADMIN" not in gw["cap_add"]
    listed = egress.parse(["allowed.test", "*.allowed.test:443"])
    assert isinstance(listed, tuple) and c.files[RULES_FILE] == squid_rules(listed)
    assert gw["volumes"][0]["read_only"] is True
    assert [b.service for b in c.builds] == [GATEWAY]


def test_a_closed_container_never_shares_a_network_with_the_gateway(tmp_path: Path) -> None:
    text = BASE + (
        "network: {egress: none}\n"
        "services:\n  web: {image: w, egress: [allowed.test]}\n  db: {image: d}\n"
    )
    doc, _ = compiled(text, tmp_path)
    services = doc["services"]
    gw_nets = set(services[GATEWAY]["networks"])
    for closed in ("main", "db"):
        assert not gw_nets & set(services[closed].get("networks", ["default"]))
    assert "proxy" in services["web"]["networks"] and "proxy" in gw_nets
    assert doc["networks"]["proxy"]["internal"] is True
    assert "HTTP_PROXY" not in services["main"].get("environment", {})


def test_two_allowlists_are_a_spec_error_naming_the_field(tmp_path: Path) -> None:
    text = BASE + "network: {egress: [a.test]}\nservices:\n  web: {image: w, egress: [b.test]}\n"
    with pytest.raises(SpecError, match=r"services\.web\.egress"):
        compiled(text, tmp_path)


def test_published_ports_go_through_the_forwarder(tmp_path: Path) -> None:
    text = BASE + (
        "network: {ports: [{container: 80}]}\n"
        "services:\n  web: {image: w, ports: [{container: 80, host: 9000}]}\n"
    )
    doc, c = compiled(text, tmp_path)
    fwd = doc["services"]["orchestrator-ports"]
    assert fwd["command"] == ["forward", "tcp:80:main:80", "tcp:40000:web:80"]
    assert fwd["ports"] == ["127.0.0.1::80/tcp", "127.0.0.1:9000:40000/tcp"]
    assert fwd["labels"]["org.orchestrator.forwards"] == "80/tcp=main:80,40000/tcp=web:80"
    assert "ports" not in doc["services"]["main"] and "ports" not in doc["services"]["web"]
    assert doc["networks"]["default"]["internal"] is True
    assert c.published


def test_leaving_by_a_given_network_never_publishes_on_it(tmp_path: Path) -> None:
    text = BASE + "network: {egress: [a.test], ports: [{container: 80}]}\n"
    doc, c = compiled(text, tmp_path, leave_by="corp-net", resolvers=("10.1.1.1",))
    assert "egress" not in doc["networks"]  # joined after create, with no alias (below)
    assert c.late_networks == {GATEWAY: ("corp-net",)}
    assert doc["services"][GATEWAY]["dns"] == ["10.1.1.1"]
    assert "ingress" in doc["services"]["orchestrator-ports"]["networks"]
    said = [line.strip() for line in c.compose_yaml.splitlines() if "corp-net" in line]
    assert said == [
        '# then, created and not yet started, it joins "corp-net" with no alias (docs/network.md)'
    ]  # the render says it, in a comment Compose ignores


def test_the_caller_policy_applies_at_compile(tmp_path: Path) -> None:
    text = BASE + "network: {egress: all}\nservices:\n  db: {image: d}\n"
    doc, c = compiled(text, tmp_path, policy=Policy(egress=parse(["allowed.test"])))
    assert doc["networks"]["default"]["internal"] is True
    assert GATEWAY in doc["services"]
    assert c.egress == {"main": "allowed.test", "db": "allowed.test"}


def test_rules_match_names_without_lookups_and_never_the_host() -> None:
    listed = parse(["allowed.test", "*.pypi.example:443", "10.0.0.0/8:5432"])
    assert isinstance(listed, tuple)
    rules = squid_rules(listed)
    assert "dstdomain -n allowed.test" in rules
    assert r"dstdom_regex -n -i \.pypi\.example$" in rules
    assert "http_access allow orch_ipliteral" in rules  # a range matches addresses only
    for line in rules.splitlines():
        if line.startswith("http_access allow orch_e"):  # a name: nor a network it is on
            assert line.endswith("!orch_never !orch_host !orch_local")
        elif line.startswith("http_access allow orch_ipliteral"):  # a range: as asked
            assert line.endswith("!orch_never !orch_host")
    # the plain-HTTP front's copy: names and suffixes with their ports, never a range
    fronts = [line.split()[1:] for line in rules.splitlines() if line.startswith("#@front")]
    assert fronts == [["name", "allowed.test", "80", "443"], ["suffix", "pypi.example", "443"]]
    assert "#@front any" in gateway_rules("all") and "#@front" not in gateway_rules("none")


def test_reserved_service_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="orchestrator-"):
        load_environment_text(BASE + "services:\n  orchestrator-egress: {image: x}\n")


def test_swarm_refuses_an_allowlist_naming_the_field(tmp_path: Path) -> None:
    text = BASE + "backend: swarm\nnetwork: {egress: [a.test]}\n"
    env = load_environment_text(text.replace("backend: swarm\n", ""), base_dir=tmp_path)
    with pytest.raises(SpecError, match=r"network\.egress"):
        compile_stack(env, StackOptions(project="orch-eg-1", labels={}))


def test_local_refuses_an_allowlist(tmp_path: Path) -> None:
    from orchestrator.backends.local import LocalRuntime

    env = load_environment_text(
        "version: 1\nname: eg\nbackend: local\nnetwork: {egress: [a.test]}\n", base_dir=tmp_path
    )
    with pytest.raises(SpecError, match="local backend"):
        LocalRuntime.check(env, Policy())


def test_a_lone_sandbox_narrowed_to_none_is_told_so(tmp_path: Path) -> None:
    text = BASE + "network: {egress: [example.com, other.org]}\n"
    doc, c = compiled(text, tmp_path, policy=Policy(egress="none"))
    assert doc["services"]["main"]["network_mode"] == "none"
    assert any("network.egress" in w and "allows no egress" in w for w in c.warnings)


def test_a_policy_takes_entries_as_written() -> None:
    assert Policy(egress=["allowed.test"]).egress == parse(["allowed.test"])
    with pytest.raises(ValueError, match="not an allowlist entry"):
        Policy(egress=["not a host"])


def test_a_range_never_opens_the_host_or_metadata_unless_named_inside_them() -> None:
    wide = parse(["0.0.0.0/0", "169.254.169.254"])
    assert isinstance(wide, tuple)
    lines = [x for x in squid_rules(wide).splitlines() if x.startswith("http_access")]
    guarded = {line.endswith("!orch_never !orch_host") for line in lines}
    assert guarded == {True, False}  # 0.0.0.0/0 guarded, the metadata address as asked
    [plain] = [line for line in lines if not line.endswith("!orch_host")]
    rule = next(r for r in wide if r.value == "169.254.169.254/32")
    assert f"orch_e{wide.index(rule)} " in plain + " "


def test_the_gateway_is_waited_for_once_not_health_checked_forever(tmp_path: Path) -> None:
    doc, _ = compiled(BASE + "network: {egress: [a.test]}\n", tmp_path)
    assert "healthcheck" not in doc["services"][GATEWAY]
    for name in (GATEWAY,):
        assert doc["services"][name]["sysctls"]["net.ipv4.ip_forward"] == "0"


def test_all_leaves_by_the_network_the_caller_names(tmp_path: Path) -> None:
    doc, c = compiled(BASE + "network: {egress: all}\n", tmp_path, leave_by="corp-net")
    assert "networks" not in doc["services"]["main"]  # default alone, in the Compose file
    assert c.late_networks == {"main": ("corp-net",)}  # then the shared one, with no alias
    assert "egress" not in doc["networks"]
    assert doc["networks"]["default"]["internal"] is True


def test_the_gateway_listens_where_its_clients_reach_it(tmp_path: Path) -> None:
    text = BASE + "network: {egress: [a.test]}\nservices:\n  db: {image: d, egress: none}\n"
    doc, _ = compiled(text, tmp_path)
    gateway = doc["services"][GATEWAY]
    assert gateway["networks"] == ["proxy", "egress"]
    assert gateway["command"] == ["proxy", doc["networks"]["proxy"]["ipam"]["config"][0]["subnet"]]
    doc, _ = compiled(BASE + "network: {egress: [a.test]}\n", tmp_path)
    assert doc["services"][GATEWAY]["command"] == ["proxy", "10.213.0.0/27"]  # default's


@pytest.mark.parametrize(("egress", "pinned"), [("none", True), ("all", False)])
def test_swarm_pins_dns_unless_all(tmp_path: Path, egress: str, pinned: bool) -> None:
    text = BASE + f"network: {{egress: {egress}}}\nservices:\n  db: {{image: d}}\n"
    env = load_environment_text(text, base_dir=tmp_path)
    doc = YAML(typ="safe").load(compile_stack(env, StackOptions(project="orch-eg-1")).stack_yaml)
    assert doc["networks"]["sandbox"]["internal"] is pinned
    for service in doc["services"].values():
        assert (service.get("dns") == ["127.0.0.1"]) is pinned


def test_swarm_refuses_mixed_egress_naming_the_service(tmp_path: Path) -> None:
    text = BASE + "network: {egress: all}\nservices:\n  db: {image: d, egress: none}\n"
    env = load_environment_text(text, base_dir=tmp_path)
    with pytest.raises(SpecError, match=r"services\.db\.egress"):
        compile_stack(env, StackOptions(project="orch-eg-1"))


@pytest.mark.parametrize(
    "entry",
    [
        "fe80::1%lo\nhttp_access allow all\n#",  # a zone id carried a line of its own
        "2001:db8::1%1\nhttp_access allow all",
        "allowed.test\nhttp_access allow all",
        "allowed.test http_access",
        "allowed.test#x",
        "fe80::1%eth0",
        "[fe80::1%eth0]:443",
    ],
)
def test_an_entry_can_never_write_a_rule_of_its_own(entry: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        parse_rule(entry)
    text = BASE + "network:\n  egress: [allowed.test, " + json.dumps(entry) + "]\n"
    with pytest.raises(SpecError, match=r"network\.egress"):
        load_environment_text(text, base_dir=tmp_path)
    # nor through the caller's policy, whose range would have covered it
    with pytest.raises(ValueError):
        Policy(egress=["allowed.test", entry])


def test_the_rules_refuse_a_value_no_parse_makes() -> None:
    with pytest.raises(ValueError, match="not an allowlist value"):
        squid_rules([Rule("net", "fe80::1%lo\nhttp_access allow all", ())])


def test_net_raw_needs_the_callers_opt_in(tmp_path: Path) -> None:
    text = BASE + "user: root\ncap_add: [NET_RAW]\n"
    with pytest.raises(SpecError, match="NET_RAW"):
        compiled(text, tmp_path)
    doc, c = compiled(text, tmp_path, policy=Policy(allow_caps=frozenset({"NET_RAW"})))
    assert "NET_RAW" in doc["services"]["main"]["cap_add"]
    assert any("raw frames" in w for w in c.warnings)


def test_a_bad_resolver_setting_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.backends.docker.network import egress_dns
    from orchestrator.errors import UsageError

    monkeypatch.setenv("ORCHESTRATOR_EGRESS_DNS", "10.0.0.1, resolver.example")
    with pytest.raises(UsageError, match="ORCHESTRATOR_EGRESS_DNS"):
        egress_dns()


def test_no_container_of_ours_is_started_again_by_the_engine(tmp_path: Path) -> None:
    """(Found by a hostile review) With a restart policy, the engine also starts a gateway we
    stopped (SIGKILL: a failure to it) once its daemon starts again, alone, for good; and a
    forwarder started again would publish other host ports than those reported. Squid, the
    front and each socat start again inside their container instead (templates/gateway)."""
    text = BASE + "network: {egress: [example.com], ports: [{container: 80}]}\n"
    text += "services:\n  db: {image: db}\n"
    doc, _ = compiled(text, tmp_path)
    assert {GATEWAY, FORWARDER, "main", "db"} <= set(doc["services"])
    assert not [name for name, svc in doc["services"].items() if "restart" in svc]


def test_ports_read_from_the_engines_listing_are_those_compose_reads() -> None:
    """Project.ports() reads the engine's API listing (one call, no Compose process): the
    forwarder's ports are reported as the container ports they stand for, unpublished and
    malformed entries are skipped, and both address families are kept, as before."""
    from orchestrator.backends.container.engine.containers import api_published_ports
    from orchestrator.backends.container.layout import FORWARDS_LABEL
    from orchestrator.spec.published import PublishedPort

    items: list[dict[str, Any]] = [
        {
            "Names": ["/p-orchestrator-ports-1"],
            "Labels": {
                "com.docker.compose.service": "orchestrator-ports",
                FORWARDS_LABEL: "20000/tcp=main:8000,20001/udp=db:53",
            },
            "Ports": [
                {"IP": "127.0.0.1", "PrivatePort": 20000, "PublicPort": 49153, "Type": "tcp"},
                {"IP": "::1", "PrivatePort": 20000, "PublicPort": 49153, "Type": "tcp"},
                {"IP": "127.0.0.1", "PrivatePort": 20001, "PublicPort": 49154, "Type": "udp"},
                {"PrivatePort": 9999, "Type": "tcp"},  # exposed, not published
                {"IP": "127.0.0.1", "PrivatePort": "x", "PublicPort": 1, "Type": "tcp"},
                "junk",
            ],
        },
        {"Names": ["/p-main-1"], "Labels": None, "Ports": None},
    ]
    assert api_published_ports(items) == [
        PublishedPort("main", 8000, "tcp", "127.0.0.1", 49153),
        PublishedPort("main", 8000, "tcp", "::1", 49153),
        PublishedPort("db", 53, "udp", "127.0.0.1", 49154),
    ]
