"""Configuration for a NATS cluster of your own, with TLS and credentials: `pulse nats-config`.

For the hosts given, ``write_cluster`` writes into one directory:

    ca.pem, ca-key.pem         a private CA (the key 0600: keep it offline)
    secrets.json               every password below (0600)
    client-credentials.json    what a Pulse host presents (0600; PULSE_NATS_CREDS)
    <node>/nats.conf           a node's configuration (0600: it holds passwords)
    <node>/server-cert.pem     the node's certificate (its host name or IP), signed by the CA
    <node>/server-key.pem      its private key (0600);  <node>/ca.pem  a copy of the CA
    leaf-<name>/nats.conf      a leaf node's configuration (0600), with <leaf>/ca.pem

Every node requires TLS and the client user and password on its client port, TLS (both
ways: each node shows its certificate to the others) and the route user and password on
its cluster port, and TLS and the leaf user and password on its leaf-node port; its
monitoring port listens on loopback only. A leaf node connects to the cluster over TLS
with the leaf credentials and takes local clients on loopback with the client
credentials; it runs no JetStream of its own: it carries core NATS traffic between its
host and the cluster (tests/test_nats_auth.py checks that), while Pulse hosts connect to
the cluster nodes themselves (the cluster's JetStream API is not reached through such a
leaf node; a leaf with a JetStream domain of its own and sourced streams is not what
Pulse does today). JetStream stores under ``<install dir>/store`` with
``sync_interval: always``, like Pulse's embedded server.

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
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from eventlog.embedded import NatsCredentials, write_private
from eventlog.errors import ValidationError
from eventlog.streams import DEFAULT_MAX_MSG_SIZE

CLIENT_USER, ROUTE_USER, LEAF_USER = "pulse", "route", "leaf"


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
            "jetstream {",
            f"  store_dir: {_q(store_dir)}",
            "  sync_interval: always",
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
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_or_make_ca(out: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
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
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=not ca, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _server_cert(
    host: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, days: int
) -> tuple[bytes, bytes]:
    """A certificate for ``host`` (DNS name or IP) good for serving and for routes."""
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


def write_cluster(
    out: str | os.PathLike[str],
    nodes: Sequence[Node],
    *,
    leaves: Sequence[Leaf] = (),
    cluster_name: str = "pulse",
    install_dir: str | None = None,
    store_dir: str | None = None,
    days: int = 825,
) -> Written:
    """Write the CA, the credentials and every node's and leaf's files under ``out``
    (see the module docstring). ``install_dir``: where a node's files will be on its host
    (default: its directory under ``out``, absolute); ``store_dir``: JetStream's store
    there (default ``<install_dir>/store``)."""
    if len(nodes) < 1:
        raise ValidationError(
            "hosts: give at least one host (three for a cluster that survives a node down)"
        )
    names = [n.name for n in nodes] + [f"leaf-{leaf.name}" for leaf in leaves]
    for name in names:
        if names.count(name) > 1:
            raise ValidationError(f"hosts: {name} appears twice")
        if not name or "/" in name or name.startswith("."):
            raise ValidationError(f"hosts: {name!r} cannot name a directory")
    if days < 1:
        raise ValidationError(f"days: must be >= 1, got {days}")
    root = Path(out).absolute()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca, ca_key = _load_or_make_ca(root, days)
    keys = _secrets(root)
    creds = root / "client-credentials.json"
    keys["client"].save(creds)
    written = Written(root, root / "ca.pem", creds)
    for node in nodes:
        here = root / node.name
        here.mkdir(exist_ok=True)
        directory = install_dir or str(here)
        cert, key = _server_cert(node.host, ca, ca_key, days)
        (here / "server-cert.pem").write_bytes(cert)
        write_private(here / "server-key.pem", key.decode())
        shutil.copyfile(root / "ca.pem", here / "ca.pem")
        conf = node_config(
            node, nodes, keys, directory=directory, store_dir=store_dir or f"{directory}/store",
            cluster_name=cluster_name,
        )  # fmt: skip
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
    return written


# -- the command ------------------------------------------------------------------------------


def setup_nats_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hosts", required=True, help="the cluster's hosts, comma-separated (names or IPs)"
    )
    p.add_argument("--out", type=Path, required=True, help="write everything into this directory")
    p.add_argument(
        "--leaf", action="append", default=[], metavar="NAME",
        help="also a leaf node configuration named NAME (repeatable)",
    )  # fmt: skip
    p.add_argument("--cluster-name", default="pulse", help="default: pulse")
    p.add_argument(
        "--install-dir", metavar="DIR",
        help="where each node's files will be on its host (default: its directory under --out)",
    )  # fmt: skip
    p.add_argument(
        "--store-dir", metavar="DIR", help="JetStream store (default: <install dir>/store)"
    )
    p.add_argument("--listen", default="0.0.0.0", help="address the nodes listen on (0.0.0.0)")
    p.add_argument("--client-port", type=int, default=4222, help="default 4222")
    p.add_argument("--cluster-port", type=int, default=6222, help="default 6222")
    p.add_argument("--leaf-port", type=int, default=7422, help="default 7422")
    p.add_argument("--monitor-port", type=int, default=8222, help="loopback only; default 8222")
    p.add_argument("--days", type=int, default=825, help="certificates' lifetime (825 days)")
    p.add_argument(
        "--json", action="store_true", help="print what was written as one JSON document"
    )


def cmd_nats_config(args: argparse.Namespace) -> int:
    """Write TLS and credentials configuration for a NATS cluster (and leaf nodes).

    For the hosts given: a private CA, a certificate per host, each node's nats.conf
    (client port with TLS and a user and password, cluster routes with TLS both ways and
    their own password, a leaf-node port with TLS and a password, JetStream with every
    write synced), leaf-node configurations (--leaf) that join the cluster over TLS, and
    client-credentials.json, what Pulse hosts present. Files holding a secret (keys,
    passwords) get mode 0600. Rerun on the same --out, it keeps the CA and the passwords.

    Copy <out>/<host>/ to each host (to --install-dir, where the configuration expects
    its files) and run `nats-server -c nats.conf` there; then point Pulse at the cluster
    with the URLs, the credentials file and the CA it prints.

    example:
      pulse nats-config --hosts n1.example.org,n2.example.org,n3.example.org --out nats-conf
      pulse nats-config --hosts 10.0.0.5,10.0.0.6,10.0.0.7 --out nats-conf \\
        --install-dir /etc/pulse-nats --leaf laptop-1
    """
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    nodes = [
        Node(host, host, args.client_port, args.cluster_port, args.leaf_port, args.monitor_port,
             args.listen)
        for host in hosts
    ]  # fmt: skip
    leaves = [Leaf(name) for name in args.leaf]
    written = write_cluster(
        args.out, nodes, leaves=leaves, cluster_name=args.cluster_name,
        install_dir=args.install_dir, store_dir=args.store_dir, days=args.days,
    )  # fmt: skip
    out = args.out
    if args.json:
        document = {
            "out": str(written.out), "ca": str(written.ca), "urls": written.urls,
            "client_credentials": str(written.client_credentials),
            "nodes": {k: str(v) for k, v in written.nodes.items()},
            "leaves": {k: str(v) for k, v in written.leaves.items()},
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
    where = args.install_dir or "its directory"
    for node in nodes:
        print(f"  {out / node.name}/  copy to {node.host} ({where}); run: nats-server -c nats.conf")
    for leaf in leaves:
        print(f"  {out / ('leaf-' + leaf.name)}/  a leaf node: its clients connect to "
              f"nats://127.0.0.1:{leaf.client_port} with the same credentials")  # fmt: skip
    print("Connect Pulse (the credentials and the CA copied to each Pulse host):")
    print(f"  pulse --nats-url {','.join(written.urls)} --nats-creds {written.client_credentials} "
          f"--nats-ca {written.ca} --replicas {3 if len(nodes) >= 3 else 1} up")  # fmt: skip
    return 0
