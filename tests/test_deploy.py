"""The deployment `pulse nats-config --systemd` writes: its systemd units pass systemd's
own checks and their command lines parse with the real `pulse` parser, bad host lists are
refused naming the field, and three hosts installed from the generated files (on
loopback: only the paths and ports differ, both options of the generator) run a TLS
cluster with R3 streams synced on every write, on which three `pulse up` processes,
started with the units' exact command lines and environment files, converge."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from eventlog import JetStreamLog, StreamSettings
from eventlog.embedded import _die_with_parent, find_nats_server
from ops.cli import build_parser
from ops.cli import main as pulse_main
from ops.cluster import LocalCluster, free_ports
from ops.operator_secret import read_secret
from tests.harness import drain, eventually

PULSE = str(Path(sys.executable).parent / "pulse")
NATS_SERVER = find_nats_server()


def unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file's sections and their keys' values (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, equals, value = line.partition("=")
        assert equals, f"{path}: {line!r} is no KEY=VALUE"
        current.setdefault(key, []).append(value)
    return sections


def one(sections: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = sections[section][key]
    assert len(values) == 1, f"{key}= appears {len(values)} times"
    return values[0]


def environment(path: Path) -> dict[str, str]:
    """The variables of an environment file, as systemd's EnvironmentFile= reads them."""
    pairs = [line.partition("=") for line in path.read_text().splitlines()]
    return {k: v for k, eq, v in pairs if eq and not k.startswith("#")}


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


# -- the files --------------------------------------------------------------------------------


def test_the_units_pass_systemd_checks_and_run_the_real_pulse_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "deploy"
    hosts = ["n1.example.org", "n2.example.org", "10.0.0.7"]
    code = pulse_main(["nats-config", "--systemd", "--hosts", ",".join(hosts), "--out", str(out),
                       "--app-host", "name=agents,http=9000", "--pulse-bin", PULSE,
                       "--nats-server-bin", NATS_SERVER, "--json"])  # fmt: skip
    assert code == 0
    written = json.loads(capsys.readouterr().out)
    assert written["replicas"] == 3
    assert set(written["hosts"]) == {*hosts, "agents"}
    urls = "tls://n1.example.org:4222,tls://n2.example.org:4222,tls://10.0.0.7:4222"
    assert ",".join(written["urls"]) == urls

    for name in [*hosts, "agents"]:
        here = out / name
        node = name != "agents"
        assert (here / "pulse-nats.service").exists() == node
        assert (here / "nats.conf").exists() == node
        assert mode(here / "client-credentials.json") == 0o600  # a secret, in --out too
        units = [here / "pulse.service"] + ([here / "pulse-nats.service"] if node else [])

        # systemd's own check: keys, values, executables (here: the real binaries)
        if shutil.which("systemd-analyze"):
            check = subprocess.run(["systemd-analyze", "verify", *map(str, units)],
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
            assert check.returncode == 0 and not check.stderr.strip(), check.stderr

        pulse = unit(here / "pulse.service")
        service = pulse["Service"]
        assert one(pulse, "Service", "User") == one(pulse, "Service", "Group") == "pulse"
        assert one(pulse, "Service", "Restart") == "on-failure"
        assert one(pulse, "Service", "EnvironmentFile") == "/etc/pulse/pulse.env"
        assert one(pulse, "Service", "ReadWritePaths") == "/var/lib/pulse"  # and nothing else
        assert one(pulse, "Service", "WorkingDirectory") == "/var/lib/pulse"
        for key, value in [("NoNewPrivileges", "true"), ("ProtectSystem", "strict"),
                           ("ProtectHome", "true"), ("PrivateTmp", "true"),
                           ("CapabilityBoundingSet", "")]:  # fmt: skip
            assert service[key] == [value], key
        assert one(pulse, "Install", "WantedBy") == "multi-user.target"
        assert ("pulse-nats.service" in one(pulse, "Unit", "After")) == node

        # the command line is the real `pulse up`, with what pulse.env says
        env = environment(here / "pulse.env")
        assert env == {
            "PULSE_DATA_DIR": "/var/lib/pulse", "PULSE_NATS_URL": urls,
            "PULSE_NATS_CREDS": "/etc/pulse/client-credentials.json",
            "PULSE_NATS_CA": "/etc/pulse/ca.pem",
        }  # fmt: skip
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        argv = shlex.split(one(pulse, "Service", "ExecStart"))
        assert argv[0] == PULSE
        args = build_parser().parse_args(argv[1:])  # (reads the environment it is built in)
        assert (args.command, args.replicas, args.host) == ("up", 3, "127.0.0.1")
        assert args.port == (9000 if name == "agents" else 8765)
        assert (args.nats_url, args.nats_creds, args.nats_ca, args.data_dir) == (
            urls,
            env["PULSE_NATS_CREDS"],
            env["PULSE_NATS_CA"],
            env["PULSE_DATA_DIR"],
        )

        if node:
            nats = unit(here / "pulse-nats.service")
            argv = shlex.split(one(nats, "Service", "ExecStart"))
            assert argv == [NATS_SERVER, "-c", "/etc/pulse-nats/nats.conf"]
            assert one(nats, "Service", "User") == "pulse-nats"
            assert one(nats, "Service", "ReadWritePaths") == "/var/lib/pulse-nats"
            assert one(nats, "Service", "ProtectSystem") == "strict"
            conf = (here / "nats.conf").read_text()
            assert 'store_dir: "/var/lib/pulse-nats"' in conf and "sync_interval: always" in conf
            assert 'cert_file: "/etc/pulse-nats/server-cert.pem"' in conf

        # install.sh: valid sh, and it installs every file of the directory
        script = (here / "install.sh").read_text()
        assert subprocess.run(["sh", "-n", str(here / "install.sh")], timeout=30).returncode == 0
        installed = {
            word for line in script.splitlines() if line.startswith("put ")
            for word in line.split()[5:]
        }  # fmt: skip
        assert installed == {p.name for p in here.iterdir()} - {"install.sh"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hosts", "a,a"], "hosts: a appears twice"),
        (["--node", "name=n1,host=10.0.0.5", "--node", "name=n1,host=10.0.0.6"],
         "hosts: n1 appears twice"),
        (["--node", "name=n1,client=70000"], "node n1: client: must be a port 1..65535, got 70000"),
        (["--node", "name=n1,cluster=abc"], "node n1: cluster: 'abc' is not a port number"),
        (["--node", "name=n1,clients=4222"], "node n1: unknown field 'clients' (fields: name, "
         "host, client, cluster, leaf, monitor, http, durability)"),
        (["--node", "name=n1,durability=sometimes"],
         "node n1: durability: must be one of fsync, replicated, got 'sometimes'"),
        (["--node", "name=a,host=h1", "--node", "name=b,host=h2,durability=replicated",
          "--node", "name=c,host=h3"],
         "durability: 3 replica(s) of fsync need 3 node(s) of it, and 2 are (a, c)"),
        (["--node", "name=n1,client=1,client=2"], "node n1: client: given twice"),
        (["--node", "name=n1,host"], "node n1: 'host' is not FIELD=VALUE"),
        (["--node", "host=10.0.0.5"], "node #1: name: missing"),
        (["--node", "name=n1,host=bad host"],
         "node n1: host: 'bad host' is not an IP address or a host name"),
        (["--node", "name=a,host=h,client=4000", "--node", "name=b,host=h,cluster=4000"],
         "node b: cluster: h:4000 is also a's client port"),
        (["--node", "name=n1,leaf=6222"], "node n1: leaf: n1:6222 is also n1's cluster port"),
        (["--node", "name=n1,http=9000"], "node n1: http: only with --systemd"),
        (["--hosts", "a,b", "--replicas", "3"], "replicas: must be 1..2 on 2 node(s), got 3"),
        (["--hosts", "a", "--pulse-user", "me"], "pulse-user: only with --systemd"),
        (["--systemd", "--hosts", "a,b,c", "--client-port", "80"],
         "node a: client: must be a port 1024..65535 (the services get no privilege"),
        (["--systemd", "--hosts", "a", "--app-host", "name=x,http=web"],
         "app-host x: http: 'web' is not a port number"),
        (["--systemd", "--hosts", "a", "--app-host", "name=x", "--app-host", "name=x"],
         "app-host: x appears twice"),
        (["--systemd", "--hosts", "a", "--http-port", "4222"],
         "node a: http: a:4222 is also a's client port"),
        (["--systemd", "--hosts", "a", "--pulse-data-dir", "var/lib/pulse"],
         "pulse-data-dir: 'var/lib/pulse' must be an absolute path"),
        (["--systemd", "--hosts", "a", "--pulse-data-dir", "/srv/my data"],
         "pulse-data-dir: '/srv/my data' must be an absolute path"),
        (["--systemd", "--hosts", "a", "--pulse-data-dir", "/etc/pulse"],
         "pulse-data-dir: /etc/pulse is also the pulse-config-dir"),
        (["--systemd", "--hosts", "a", "--nats-user", "Nats Admin"],
         "nats-user: 'Nats Admin' is not a system user name"),
        (["--systemd", "--hosts", "a", "--cluster-name", "my cluster"],
         "cluster-name: 'my cluster' must be letters"),
    ],
)  # fmt: skip
def test_bad_host_lists_are_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "deploy"
    code = pulse_main(["nats-config", "--out", str(out), *args])
    err = capsys.readouterr().err
    assert code == 1 and message in err, err
    assert not out.exists(), "nothing is written before the whole list is checked"


def test_hosts_and_nodes_do_not_mix_and_one_is_needed(tmp_path: Path) -> None:
    for args in (["--hosts", "a", "--node", "name=b"], []):
        with pytest.raises(SystemExit):
            pulse_main(["nats-config", "--out", str(tmp_path), *args])


# -- three hosts on loopback --------------------------------------------------------------------

ROUNDS = 12  # reinforcements per host, before and again after a node dies


class PulseUp:
    """`pulse up` started as pulse.service would start it: ExecStart, EnvironmentFile,
    WorkingDirectory of the installed unit, nothing else from the test's environment."""

    def __init__(self, unit_file: Path) -> None:
        service = unit(unit_file)["Service"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
        env.update(environment(Path(service["EnvironmentFile"][0])))
        self.env = env
        self.argv = shlex.split(service["ExecStart"][0])
        self.port = int(self.argv[self.argv.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = Path(service["WorkingDirectory"][0]) / env["PULSE_DATA_DIR"]
        self.process = subprocess.Popen(
            self.argv, cwd=service["WorkingDirectory"][0], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        self.printed: list[str] = []
        self.logged: list[str] = []
        self.drains = [drain(self.process.stdout, self.printed),
                       drain(self.process.stderr, self.logged)]  # fmt: skip

    def operator(self) -> dict[str, str]:
        """The header of a request as the host's operator (its data directory's secret)."""
        return {"Authorization": f"Bearer {read_secret(self.data_dir)}"}

    def serving(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"`{shlex.join(self.argv)}` exited {self.process.returncode}: "
                f"{''.join(self.printed)}{''.join(self.logged)}"
            )
        return any("Ctrl-C stops" in line for line in self.printed)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for reader in self.drains:
            reader.join(10)


async def call(client: httpx.AsyncClient, method: str, **body: Any) -> Any:
    response = await client.post(f"/v1/{method}", json=body)
    assert response.status_code == 200, f"{method}: {response.status_code} {response.text}"
    return response.json()


async def reinforce(client: httpx.AsyncClient, experiences: list[str], host: int) -> Counter[str]:
    """``ROUNDS`` acknowledged reinforcements (a call refused while the cluster elects a
    new leader is not acknowledged, and repeated: the instance counts it once)."""
    acked: Counter[str] = Counter()
    for i in range(ROUNDS):
        experience = experiences[(i * (host + 1)) % len(experiences)]
        for _attempt in range(20):
            response = await client.post("/v1/reinforce_experience",
                                         json={"experience_id": experience})  # fmt: skip
            if response.status_code == 200:
                acked[experience] += 1
                break
            assert response.status_code == 503, response.text  # LogUnavailable: retry
        else:
            raise AssertionError(f"host {host}: 20 reinforcements in a row refused")
    return acked


def monitor(port: int, path: str) -> dict[str, Any]:
    """A node's monitoring endpoint (loopback), as ops/deploy/README.md has operators read it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:  # noqa: S310
        return dict(json.loads(response.read()))


async def test_three_hosts_installed_from_the_generated_files_converge(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "logs", size=3)  # (runs each node's ExecStart)
    taken = {*cluster.client_ports, *cluster.route_ports, *cluster.monitor_ports}
    spare = [p for p in free_ports(12) if p not in taken]
    leaf, http = spare[:3], spare[3:6]
    root = tmp_path / "hosts"
    specs = []
    for i in range(3):
        specs += ["--node", f"name=n{i},host=127.0.0.1,client={cluster.client_ports[i]},"
                  f"cluster={cluster.route_ports[i]},leaf={leaf[i]},"
                  f"monitor={cluster.monitor_ports[i]},http={http[i]}"]  # fmt: skip
    on = f"{root}/{{name}}"  # each host's filesystem: only the paths differ from production
    code = pulse_main(["nats-config", "--systemd", "--out", str(tmp_path / "deploy"), *specs,
                       "--listen", "127.0.0.1", "--install-dir", f"{on}/etc/pulse-nats",
                       "--store-dir", f"{on}/var/lib/pulse-nats",
                       "--pulse-config-dir", f"{on}/etc/pulse",
                       "--pulse-data-dir", f"{on}/var/lib/pulse",
                       "--unit-dir", f"{on}/etc/systemd/system",
                       "--pulse-bin", PULSE, "--nats-server-bin", NATS_SERVER])  # fmt: skip
    assert code == 0
    for i in range(3):
        script = tmp_path / "deploy" / f"n{i}" / "install.sh"
        done = subprocess.run(["sh", str(script), "--files-only"], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
    hosts = [root / f"n{i}" for i in range(3)]
    for here in hosts:
        for secret in ("etc/pulse-nats/nats.conf", "etc/pulse-nats/server-key.pem",
                       "etc/pulse/client-credentials.json"):  # fmt: skip
            assert mode(here / secret) == 0o640, secret  # (root:<service group> on a host)
        assert mode(here / "var/lib/pulse") == mode(here / "var/lib/pulse-nats") == 0o700

    # the nodes, each with its unit's command line (the same binary LocalCluster runs)
    configs = []
    for here in hosts:
        argv = shlex.split(unit(here / "etc/systemd/system/pulse-nats.service")["Service"]
                           ["ExecStart"][0])  # fmt: skip
        assert argv[:2] == [NATS_SERVER, "-c"]
        configs.append(Path(argv[2]))
    cluster.configs = configs
    services: list[PulseUp] = []
    cluster.start()
    try:
        for i in range(3):
            status = monitor(cluster.monitor_ports[i], "/varz")
            assert status["server_name"] == f"n{i}" and status["tls_required"]
            assert status["jetstream"]["config"].get("sync_always") is True, "sync: always"
            assert status["jetstream"]["config"]["store_dir"].startswith(str(hosts[i]))
            assert status["cluster"]["tls_required"] and status["cluster"]["tls_verify"]

        # pulse up on each host, as pulse.service runs it (the first creates the streams)
        units = [here / "etc/systemd/system/pulse.service" for here in hosts]
        services.append(PulseUp(units[0]))
        await eventually(services[0].serving, timeout=60, what="pulse up on n0")
        services += [PulseUp(units[1]), PulseUp(units[2])]
        for service in services:
            await eventually(service.serving, timeout=60, what=f"pulse up on {service.url}")
        assert "(external)" in "".join(services[0].printed)

        env = services[0].env
        log = await JetStreamLog.connect(
            env["PULSE_NATS_URL"].split(","), StreamSettings(replicas=3), create_streams=False,
            credentials=env["PULSE_NATS_CREDS"], tls_ca=env["PULSE_NATS_CA"], connect_timeout=30,
        )  # fmt: skip
        try:
            for stream in ("PULSE", "PULSE_ACTIVITY", "KV_PULSE_KEYS"):  # (the data keys)
                info = await log.js.stream_info(stream)
                assert info.config.num_replicas == 3, stream
                assert info.cluster is not None and len(info.cluster.replicas or []) == 2
            leader = (await log.js.stream_info("PULSE")).cluster.leader  # type: ignore[union-attr]
        finally:
            await log.close()
        jsz = monitor(cluster.monitor_ports[1], "/jsz?streams=true")
        streams = {s["name"]: s for a in jsz["account_details"] for s in a["stream_detail"]}
        assert set(streams) == {"PULSE", "PULSE_ACTIVITY", "KV_PULSE_KEYS"}
        assert all(len(s["cluster"]["replicas"]) == 2 for s in streams.values())

        clients = [
            httpx.AsyncClient(base_url=s.url, timeout=60, headers=s.operator()) for s in services
        ]
        try:
            team = await call(clients[0], "create_collective", owner_id="ops", name="team",
                              embedder="hash")  # fmt: skip

            async def everywhere(method: str, ids: list[str], field: str) -> bool:
                """Every host answers ``method`` for every id (it has applied them)."""
                for client in clients:
                    for key in ids:
                        response = await client.post(f"/v1/{method}", json={field: key})
                        if response.status_code != 200:
                            return False
                return True

            await eventually(lambda: everywhere("get_collective_stats", [team], "collective_id"),
                             timeout=30, what="the collective on every host")  # fmt: skip
            experiences = list(await asyncio.gather(*[
                call(client, "record_experience", collective_id=team,
                     content=f"lesson {i} from host {i}")
                for i, client in enumerate(clients)
            ]))  # fmt: skip
            await eventually(lambda: everywhere("get_experience", experiences, "experience_id"),
                             timeout=30, what="every experience on every host")  # fmt: skip

            acked: Counter[str] = Counter()
            for counts in await asyncio.gather(
                *[reinforce(c, experiences, i) for i, c in enumerate(clients)]
            ):
                acked.update(counts)
            # a node dies (the stream's leader): R3 keeps a quorum, writes go on
            cluster.kill(int(leader.removeprefix("n")))  # type: ignore[union-attr]
            for counts in await asyncio.gather(
                *[reinforce(c, experiences, i) for i, c in enumerate(clients)]
            ):
                acked.update(counts)
            assert sum(acked.values()) == 2 * ROUNDS * 3

            async def agreed() -> bool:
                for client in clients:
                    for experience in experiences:
                        got = await call(client, "get_experience", experience_id=experience)
                        if got["applications"] != acked[experience]:
                            return False
                digests = {await call(client, "digest") for client in clients}
                return len(digests) == 1

            await eventually(agreed, timeout=60, what="equal digests and exact counts")
        finally:
            for client in clients:
                await client.aclose()
    finally:
        for service in services:
            service.stop()
        cluster.stop()
