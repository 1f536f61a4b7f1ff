"""Configuration for a NATS cluster of your own (TLS, credentials) and for deploying it
with Pulse on systemd hosts: `pulse nats-config`.

For the hosts given, ``write_cluster`` writes into one directory:

    ca.pem, ca-key.pem         a private CA (the key 0600: keep it offline)
    secrets.json               every password below (0600)
    client-credentials.json    what a Pulse host presents (0600; PULSE_NATS_CREDS)
    <node>/nats.conf           a node's configuration (0600: it holds passwords)
    <node>/server-cert.pem     the node's certificate (its host name or IP), signed by the CA
    <node>/server-key.pem      its private key (0600);  <node>/ca.pem  a copy of the CA
    leaf-<name>/nats.conf      a leaf node's configuration (0600), with <leaf>/ca.pem

With ``--systemd`` (a ``Layout``), each host's directory also holds what installs it
(``ops.deploy.systemd``; ops/deploy/README.md walks an operator through it):

    <host>/pulse-nats.service  nats-server -c <install dir>/nats.conf, hardened
    <host>/pulse.service       pulse --replicas 3 up, reading <host>/pulse.env
    <host>/pulse.env           PULSE_DATA_DIR, PULSE_NATS_URL (every node), _CREDS, _CA
    <host>/client-credentials.json, ca.pem   what pulse.env points at (0600)
    <host>/install.sh          run as root on the host: users, files, owners, services

A host is given as ``--hosts a,b,c`` (same ports everywhere) or one ``--node
name=a,host=10.0.0.5,client=4222,...`` each; ``check_hosts`` refuses a list that does
not fit together (a name twice, a port out of range, two services on one host and
port), naming the host and the field, before anything is written.

Every node requires TLS and the client user and password on its client port, TLS (both
ways: each node shows its certificate to the others) and the route user and password on
its cluster port, and TLS and the leaf user and password on its leaf-node port; its
monitoring port listens on loopback only. A leaf node connects to the cluster over TLS
with the leaf credentials and takes local clients on loopback with the client
credentials; it runs no JetStream of its own: it carries core NATS traffic between its
host and the cluster (tests/test_nats_auth.py checks that), while Pulse hosts connect to
the cluster nodes themselves (the cluster's JetStream API is not reached through such a
leaf node; a leaf with a JetStream domain of its own and sourced streams is not what
Pulse does today). JetStream stores under ``<install dir>/store`` (with ``--systemd``,
/var/lib/pulse-nats) with ``sync_interval: always``, like Pulse's embedded server.

Passwords are in clear in the configurations (nats-server also takes bcrypt hashes for
client passwords, but a route's password must be in clear in the other nodes' route
URLs anyway); hence mode 0600 for every file holding one. Rerun on the same directory,
it keeps the CA and the passwords and writes fresh certificates and configurations: add
``--leaf NAME`` later without re-keying the cluster.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eventlog.errors import ValidationError
from eventlog.streams import check_durability, durability_tag
from ops.deploy import systemd
from ops.deploy.systemd import AppHost, Layout, check_host

if TYPE_CHECKING:  # (imported where used: `pulse --help` goes without them)
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    from eventlog.embedded import NatsCredentials

CLIENT_USER, ROUTE_USER, LEAF_USER = "pulse", "route", "leaf"
PORTS = {"client": "client_port", "cluster": "cluster_port", "leaf": "leaf_port",
         "monitor": "monitor_port"}  # a node's ports: --node field -> Node field  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


@dataclass(frozen=True)
class Node:
    """A cluster node: ``host`` is how clients, the other nodes and leaf nodes reach it
    (a DNS name or an IP address; it goes into the node's certificate)."""

    name: str
    host: str
    client_port: int = 4222
    cluster_port: int = 6222
    leaf_port: int = 7422
    monitor_port: int = 8222
    listen: str = "0.0.0.0"  # a cluster node serves other hosts
    # fsync: every write synced before it is acknowledged; replicated: synced on the
    # server's interval (eventlog.streams); the node is tagged with it
    durability: str = "fsync"


@dataclass(frozen=True)
class Leaf:
    """A leaf node: serves the clients of its own host (on ``listen``) from the cluster."""

    name: str
    client_port: int = 4222
    monitor_port: int = 8222
    listen: str = "127.0.0.1"


@dataclass
class Written:
    """What ``write_cluster`` wrote, and how a Pulse host connects."""

    out: Path
    ca: Path
    client_credentials: Path
    nodes: dict[str, Path] = field(default_factory=dict)  # name -> nats.conf
    leaves: dict[str, Path] = field(default_factory=dict)
    urls: list[str] = field(default_factory=list)  # tls://host:client_port of every node
    hosts: dict[str, Path] = field(default_factory=dict)  # with a layout: name -> install.sh
    replicas: int = 1  # what `pulse up --replicas` should say on this cluster
    durability: str = "fsync"  # and `pulse up --durability`


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _q(value: str) -> str:
    return json.dumps(value)


def _tls(directory: str, *, verify: bool = False, server: bool = True) -> list[str]:
    lines = ["  tls {"]
    if server:
        lines += [
            f"    cert_file: {_q(directory + '/server-cert.pem')}",
            f"    key_file: {_q(directory + '/server-key.pem')}",
        ]
    lines.append(f"    ca_file: {_q(directory + '/ca.pem')}")
    if verify:
        lines.append("    verify: true")
    return [*lines, "    timeout: 2", "  }"]


def node_config(
    node: Node,
    nodes: Sequence[Node],
    secrets_: dict[str, NatsCredentials],
    *,
    directory: str,
    store_dir: str,
    cluster_name: str,
) -> str:
    """The nats.conf of ``node`` (files under ``directory`` on its host)."""
    from eventlog.streams import DEFAULT_MAX_MSG_SIZE

    client, route, leaf = secrets_["client"], secrets_["route"], secrets_["leaf"]
    routes = [
        f"nats-route://{route.user}:{route.password}@{_hostport(peer.host, peer.cluster_port)}"
        for peer in nodes
        if peer.name != node.name
    ]
    tls = _tls(directory)
    return "\n".join(
        [
            f"# Pulse NATS node {node.name} of cluster {cluster_name}: pulse nats-config wrote it",
            f"server_name: {_q(node.name)}",
            f"host: {_q(node.listen)}",
            f"port: {node.client_port}",
            f"client_advertise: {_q(_hostport(node.host, node.client_port))}",
            f"http: {_q(_hostport('127.0.0.1', node.monitor_port))}",
            f"max_payload: {DEFAULT_MAX_MSG_SIZE}",
            *[line.removeprefix("  ") for line in tls],
            "authorization {",
            f"  user: {_q(client.user)}",
            f"  password: {_q(client.password)}",
            "}",
            f"server_tags: [{_q(durability_tag(node.durability))}]",
            "jetstream {",
            f"  store_dir: {_q(store_dir)}",
            # (not changed by a reload: a node of another durability is restarted)
            *(["  sync_interval: always"] if node.durability == "fsync" else []),
            "}",
            "cluster {",
            f"  name: {_q(cluster_name)}",
            f"  listen: {_q(_hostport(node.listen, node.cluster_port))}",
            f"  advertise: {_q(_hostport(node.host, node.cluster_port))}",
            *_tls(directory, verify=True),
            f"  authorization {{ user: {_q(route.user)}, password: {_q(route.password)} }}",
            f"  routes: [{', '.join(_q(r) for r in routes)}]",
            "}",
            "leafnodes {",
            f"  listen: {_q(_hostport(node.listen, node.leaf_port))}",
            f"  advertise: {_q(_hostport(node.host, node.leaf_port))}",
            *tls,
            f"  authorization {{ user: {_q(leaf.user)}, password: {_q(leaf.password)} }}",
            "}",
            "",
        ]
    )


def leaf_config(
    leaf: Leaf, nodes: Sequence[Node], secrets_: dict[str, NatsCredentials], *, directory: str
) -> str:
    """The nats.conf of a leaf node that joins the cluster of ``nodes``."""
    from eventlog.streams import DEFAULT_MAX_MSG_SIZE

    client, hub = secrets_["client"], secrets_["leaf"]
    urls = [f"tls://{hub.user}:{hub.password}@{_hostport(n.host, n.leaf_port)}" for n in nodes]
    return "\n".join(
        [
            f"# Pulse NATS leaf node {leaf.name}: pulse nats-config wrote it",
            f"server_name: {_q(leaf.name)}",
            f"host: {_q(leaf.listen)}",
            f"port: {leaf.client_port}",
            f"http: {_q(_hostport('127.0.0.1', leaf.monitor_port))}",
            f"max_payload: {DEFAULT_MAX_MSG_SIZE}",
            "authorization {",
            f"  user: {_q(client.user)}",
            f"  password: {_q(client.password)}",
            "}",
            "leafnodes {",
            "  remotes: [",
            "    {",
            f"      urls: [{', '.join(_q(u) for u in urls)}]",
            *["    " + line for line in _tls(directory, server=False)],
            "    }",
            "  ]",
            "}",
            "",
        ]
    )


# -- certificates ----------------------------------------------------------------------------


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_or_make_ca(out: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from eventlog.embedded import write_private

    cert_file, key_file = out / "ca.pem", out / "ca-key.pem"
    if cert_file.exists() and key_file.exists():
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValidationError(f"ca: {key_file} is not an EC private key")
        return x509.load_pem_x509_certificate(cert_file.read_bytes()), key
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Pulse NATS CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=max(days, 3650)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(key_file, _key_pem(key).decode())
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates (and CRLs); a server signs and agrees keys (ECDHE)."""
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=not ca, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _server_cert(
    host: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, days: int
) -> tuple[bytes, bytes]:
    """A certificate for ``host`` (DNS name or IP) good for serving and for routes."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    try:
        alt: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(host))]
    except ValueError:
        alt = [x509.DNSName(host)]
    now = datetime.datetime.now(datetime.UTC)
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


# -- the whole directory ----------------------------------------------------------------------


def _secrets(out: Path) -> dict[str, NatsCredentials]:
    """The passwords of ``out/secrets.json``, made (0600) when missing."""
    from eventlog.embedded import NatsCredentials, write_private

    path = out / "secrets.json"
    if path.exists():
        try:
            data = json.loads(path.read_text())
            return {k: NatsCredentials(data[k]["user"], data[k]["password"]) for k in data}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValidationError(f"secrets: {path} is unreadable ({exc!r})") from None
    made = {
        "client": NatsCredentials.generate(CLIENT_USER),
        "route": NatsCredentials.generate(ROUTE_USER),
        "leaf": NatsCredentials.generate(LEAF_USER),
    }
    text = json.dumps({k: {"user": c.user, "password": c.password} for k, c in made.items()})
    write_private(path, text + "\n")
    return made


def check_hosts(
    nodes: Sequence[Node],
    apps: Sequence[AppHost] = (),
    *,
    leaves: Sequence[Leaf] = (),
    replicas: int | None = None,
    min_port: int = 1,
    durability: str | None = None,
) -> None:
    """Names, hosts and ports of a deployment fit together, or a ``ValidationError``
    naming the host and the field: distinct names, ports in range, and no two services
    on one host and port."""
    if len(nodes) < 1:
        raise ValidationError(
            "hosts: give at least one host (three for a cluster that survives a node down)"
        )
    names = [n.name for n in nodes] + [f"leaf-{leaf.name}" for leaf in leaves]
    for name in names + [a.name for a in apps]:
        if not _NAME.fullmatch(name):
            raise ValidationError(
                f"hosts: {name!r} is not a host name (letters, digits, . _ : -): it names "
                "the host's directory"
            )
    for name in names:
        if names.count(name) > 1:
            raise ValidationError(f"hosts: {name} appears twice")
    app_names = [a.name for a in apps]
    for name in app_names:
        if app_names.count(name) > 1:
            raise ValidationError(f"app-host: {name} appears twice")
    hosts = {n.name: n.host for n in nodes}
    taken: dict[tuple[str, int], str] = {}

    def take(name: str, host: str, field_: str, port: int) -> None:
        what = "node" if name in hosts else "app-host"
        if not min_port <= port <= 65535:
            low = " (the services get no privilege to bind a lower one)" if min_port > 1 else ""
            raise ValidationError(
                f"{what} {name}: {field_}: must be a port {min_port}..65535{low}, got {port}"
            )
        if (host, port) in taken:
            raise ValidationError(
                f"{what} {name}: {field_}: {_hostport(host, port)} is also {taken[host, port]}"
            )
        taken[host, port] = f"{name}'s {field_} port"

    for node in nodes:
        check_host(f"node {node.name}: host", node.host)
        for field_, attribute in PORTS.items():
            take(node.name, node.host, field_, getattr(node, attribute))
    for app in apps:  # (an app host that is no node: its name is its host)
        take(app.name, hosts.get(app.name, app.name), "http", app.http_port)
    if replicas is not None and not 1 <= replicas <= min(5, len(nodes)):
        raise ValidationError(
            f"replicas: must be 1..{min(5, len(nodes))} on {len(nodes)} node(s), got {replicas}"
        )
    for node in nodes:
        check_durability(node.durability, f"node {node.name}: durability")
    if durability is not None:
        check_durability(durability)
        held = [n.name for n in nodes if n.durability == durability]
        needed = replicas if replicas is not None else (3 if len(nodes) >= 3 else 1)
        if len(held) < needed:
            raise ValidationError(
                f"durability: {needed} replica(s) of {durability} need {needed} node(s) of "
                f"it, and {len(held)} are ({', '.join(held) or 'none'})"
            )


def write_cluster(
    out: str | os.PathLike[str],
    nodes: Sequence[Node],
    *,
    leaves: Sequence[Leaf] = (),
    cluster_name: str = "pulse",
    install_dir: str | None = None,
    store_dir: str | None = None,
    days: int = 825,
    layout: Layout | None = None,
    apps: Sequence[AppHost] | None = None,
    replicas: int | None = None,
    durability: str = "fsync",
) -> Written:
    """Write the CA, the credentials and every node's and leaf's files under ``out``
    (see the module docstring). ``install_dir``: where a node's files will be on its host
    (default: its directory under ``out``, absolute); ``store_dir``: JetStream's store
    there (default ``<install_dir>/store``); both may hold ``{name}``, the node's name.

    With a ``layout`` (its install and store directories replace those two), each host's
    directory also gets systemd units, pulse.env and install.sh (``ops.deploy.systemd``):
    every node is an app host (running `pulse up`) unless ``apps`` says which are; an app
    host that is no node gets a directory of its own. ``replicas`` (default 3 on three
    nodes or more, else 1) is what `pulse up --replicas` says in the units, ``durability``
    what its ``--durability`` says (the nodes' own: ``Node.durability``)."""
    from eventlog.embedded import write_private

    if apps is None:
        apps = [AppHost(n.name) for n in nodes] if layout is not None else []
    check_hosts(nodes, apps, leaves=leaves, replicas=replicas,
                min_port=1024 if layout is not None else 1, durability=durability)  # fmt: skip
    if layout is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", cluster_name):
        raise ValidationError(
            f"cluster-name: {cluster_name!r} must be letters, digits, _ and - (no spaces)"
        )
    if days < 1:
        raise ValidationError(f"days: must be >= 1, got {days}")
    if replicas is None:
        replicas = 3 if len(nodes) >= 3 else 1
    layouts = {h: layout.on(h) for h in [n.name for n in nodes] + [a.name for a in apps]
               } if layout is not None else {}  # fmt: skip
    root = Path(out).absolute()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca, ca_key = _load_or_make_ca(root, days)
    keys = _secrets(root)
    creds = root / "client-credentials.json"
    keys["client"].save(creds)
    written = Written(root, root / "ca.pem", creds, replicas=replicas, durability=durability)
    for node in nodes:
        here = root / node.name
        here.mkdir(exist_ok=True)
        if layout is not None:
            directory, store = layouts[node.name].install_dir, layouts[node.name].store_dir
        else:
            directory = (install_dir or str(here)).replace("{name}", node.name)
            store = (store_dir or f"{directory}/store").replace("{name}", node.name)
        cert, key = _server_cert(node.host, ca, ca_key, days)
        (here / "server-cert.pem").write_bytes(cert)
        write_private(here / "server-key.pem", key.decode())
        shutil.copyfile(root / "ca.pem", here / "ca.pem")
        conf = node_config(
            node, nodes, keys, directory=directory, store_dir=store, cluster_name=cluster_name
        )
        write_private(here / "nats.conf", conf)
        written.nodes[node.name] = here / "nats.conf"
        written.urls.append(f"tls://{_hostport(node.host, node.client_port)}")
    for leaf in leaves:
        here = root / f"leaf-{leaf.name}"
        here.mkdir(exist_ok=True)
        shutil.copyfile(root / "ca.pem", here / "ca.pem")
        conf = leaf_config(leaf, nodes, keys, directory=install_dir or str(here))
        write_private(here / "nats.conf", conf)
        written.leaves[leaf.name] = here / "nats.conf"
    if layout is not None:
        _write_services(written, nodes, apps, layouts, cluster_name)
    return written


def _write_services(
    written: Written,
    nodes: Sequence[Node],
    apps: Sequence[AppHost],
    layouts: dict[str, Layout],
    cluster_name: str,
) -> None:
    """Each host's systemd units, pulse.env and install.sh, next to its node's files."""
    from eventlog.embedded import NatsCredentials

    by_name = {n.name: n for n in nodes}
    app_of = {a.name: a for a in apps}
    for name in dict.fromkeys([*by_name, *app_of]):  # nodes first, in order
        here, lay = written.out / name, layouts[name]
        here.mkdir(exist_ok=True)
        node, app = by_name.get(name), app_of.get(name)
        for stale in (systemd.NATS_UNIT, systemd.PULSE_UNIT, systemd.PULSE_ENV):
            (here / stale).unlink(missing_ok=True)  # a rerun with other app hosts
        if node is not None:
            unit = systemd.nats_unit(name, cluster_name, lay)
            (here / systemd.NATS_UNIT).write_text(unit)
        if app is not None:
            shutil.copyfile(written.ca, here / "ca.pem")
            NatsCredentials.load(written.client_credentials).save(here / "client-credentials.json")
            (here / systemd.PULSE_ENV).write_text(systemd.pulse_env(app, lay, written.urls))
            unit = systemd.pulse_unit(
                app, lay, replicas=written.replicas, cluster_name=cluster_name,
                with_node=node is not None, durability=written.durability,
            )  # fmt: skip
            (here / systemd.PULSE_UNIT).write_text(unit)
        script = systemd.install_script(
            name, node.host if node else name, lay, node=node is not None, app=app is not None
        )
        (here / systemd.INSTALL).write_text(script)
        (here / systemd.INSTALL).chmod(0o755)
        written.hosts[name] = here / systemd.INSTALL


# -- the command ------------------------------------------------------------------------------

NODE_FIELDS = ("name", "host", *PORTS, "http", "durability")
APP_FIELDS = ("name", "http")
_SYSTEMD_ONLY = ("app_host", "pulse_config_dir", "pulse_data_dir", "unit_dir", "pulse_user",
                 "nats_user", "pulse_bin", "nats_server_bin", "http_host")  # fmt: skip


def parse_spec(spec: str, what: str, number: int, fields: Sequence[str]) -> dict[str, str]:
    """The fields of ``--node name=n1,host=10.0.0.5,client=4222`` (``what`` is "node"),
    or a ``ValidationError`` naming the host (or its place) and the field."""
    pieces = [piece.strip() for piece in spec.split(",")]
    named = [p.partition("=")[2].strip() for p in pieces if p.partition("=")[0].strip() == "name"]
    label = f"{what} {named[0]}" if named and named[0] else f"{what} #{number}"
    values: dict[str, str] = {}
    for piece in pieces:
        key, equals, value = (part.strip() for part in piece.partition("="))
        if not equals or not key:
            raise ValidationError(
                f"{label}: {piece!r} is not FIELD=VALUE (fields: {', '.join(fields)})"
            )
        if key not in fields:
            raise ValidationError(f"{label}: unknown field {key!r} (fields: {', '.join(fields)})")
        if key in values:
            raise ValidationError(f"{label}: {key}: given twice")
        if not value:
            raise ValidationError(f"{label}: {key}: empty")
        values[key] = value
    if "name" not in values:
        raise ValidationError(f"{label}: name: missing (as in --{what} name=n1,...)")
    return values


def _port(label: str, field_: str, value: str) -> int:
    try:
        return int(value)  # (its range: check_hosts)
    except ValueError:
        raise ValidationError(f"{label}: {field_}: {value!r} is not a port number") from None


def hosts_of(args: argparse.Namespace) -> tuple[list[Node], list[AppHost]]:
    """The nodes and app hosts of `pulse nats-config`'s options."""
    default: dict[str, int] = {f: getattr(args, f"{f}_port") for f in PORTS}
    http_port = args.http_port or 8765
    nodes, apps = [], []
    if args.hosts is not None:
        for host in [h.strip() for h in args.hosts.split(",") if h.strip()]:
            ports = {PORTS[f]: port for f, port in default.items()}
            nodes.append(Node(host, host, listen=args.listen, durability=args.durability, **ports))
            apps.append(AppHost(host, http_port))
    for number, spec in enumerate(args.node or [], 1):
        values = parse_spec(spec, "node", number, NODE_FIELDS)
        label = f"node {values['name']}"
        ports = {
            PORTS[f]: _port(label, f, values[f]) if f in values else port
            for f, port in default.items()
        }
        if "http" in values and not args.systemd:
            raise ValidationError(f"{label}: http: only with --systemd (pulse up's port)")
        name = values["name"]
        durability = values.get("durability", args.durability)
        check_durability(durability, f"{label}: durability")
        nodes.append(
            Node(
                name, values.get("host", name), listen=args.listen, durability=durability, **ports
            )  # fmt: skip
        )
        apps.append(
            AppHost(name, _port(label, "http", values["http"]) if "http" in values else http_port)
        )
    for number, spec in enumerate(args.app_host or [], 1):
        values = parse_spec(spec, "app-host", number, APP_FIELDS)
        label = f"app-host {values['name']}"
        port = _port(label, "http", values["http"]) if "http" in values else http_port
        apps.append(AppHost(values["name"], port))
    return nodes, apps


def cmd_nats_config(args: argparse.Namespace) -> int:
    """`pulse nats-config` (declared, with its help, in ``ops.cli.deployment``)."""
    given = {d: getattr(args, d) for d in _SYSTEMD_ONLY if getattr(args, d) is not None}
    if args.http_port is not None:
        given["http_port"] = args.http_port
    if not args.systemd and given:
        option = next(iter(given)).replace("_", "-")
        raise ValidationError(f"{option}: only with --systemd")
    # (the global --durability, or $PULSE_DURABILITY, when the command's own is not given)
    args.durability = getattr(args, "durability", None) or "fsync"
    nodes, apps = hosts_of(args)
    leaves = [Leaf(name) for name in args.leaf]
    layout = None
    if args.systemd:
        fields = {k: v for k, v in given.items() if k not in ("app_host", "http_port")}
        if args.install_dir:
            fields["install_dir"] = args.install_dir
        if args.store_dir:
            fields["store_dir"] = args.store_dir
        layout = Layout(**fields)
    written = write_cluster(
        args.out, nodes, leaves=leaves, cluster_name=args.cluster_name,
        install_dir=args.install_dir, store_dir=args.store_dir, days=args.days,
        layout=layout, apps=apps if layout is not None else None, replicas=args.replicas,
        durability=args.durability,
    )  # fmt: skip
    out = args.out
    if args.json:
        document = {
            "out": str(written.out), "ca": str(written.ca), "urls": written.urls,
            "client_credentials": str(written.client_credentials),
            "nodes": {k: str(v) for k, v in written.nodes.items()},
            "leaves": {k: str(v) for k, v in written.leaves.items()},
            "hosts": {k: str(v.parent) for k, v in written.hosts.items()},
            "replicas": written.replicas, "durability": written.durability,
            "node_durability": {n.name: n.durability for n in nodes},
        }  # fmt: skip
        print(json.dumps(document))
        return 0
    print(
        f"NATS cluster {args.cluster_name!r} of {len(nodes)} nodes, with TLS and "
        f"credentials, in {out}:"
    )
    print(f"  {out / 'ca.pem'}  the CA certificate every client and node trusts")
    print(f"  {out / 'ca-key.pem'}  the CA's key (0600): keep it offline; reruns reuse it")
    print(f"  {out / 'secrets.json'}  every password (0600); reruns reuse them")
    print(f"  {out / 'client-credentials.json'}  what Pulse hosts present (0600)")
    if layout is not None:
        hosts = {n.name: n.host for n in nodes}
        for name in written.hosts:
            runs = ["nats-server"] if name in hosts else []
            runs += ["pulse up"] if any(a.name == name for a in apps) else []
            print(f"  {out / name}/  copy to {hosts.get(name, name)}; there, as root: "
                  f"sh install.sh  ({' and '.join(runs)})")  # fmt: skip
        print(f"Each runs `pulse --replicas {written.replicas} --durability "
              f"{written.durability} up` (pulse.service) with "
              f"{layout.pulse_config_dir}/pulse.env; see ops/deploy/README.md")  # fmt: skip
        return 0
    where = args.install_dir or "its directory"
    for node in nodes:
        print(f"  {out / node.name}/  copy to {node.host} ({where}); run: nats-server -c nats.conf")
    for leaf in leaves:
        print(f"  {out / ('leaf-' + leaf.name)}/  a leaf node: its clients connect to "
              f"nats://127.0.0.1:{leaf.client_port} with the same credentials")  # fmt: skip
    print("Connect Pulse (the credentials and the CA copied to each Pulse host):")
    print(f"  pulse --nats-url {','.join(written.urls)} --nats-creds {written.client_credentials} "
          f"--nats-ca {written.ca} --replicas {written.replicas} "
          f"--durability {written.durability} up")  # fmt: skip
    return 0
