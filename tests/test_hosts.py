"""Real hosts: three instance processes with their own data directories on a 3-node
NATS cluster, reinforcing the same experiences concurrently. Mid-way a NATS node is
killed and restarted, and one instance is killed with SIGKILL (between two calls, while
its replication loop is applying the others' events) and restarted. At the end every
digest is equal and each experience's total equals the acknowledged calls exactly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from eventlog import StreamSettings
from ops.cluster import LocalCluster
from sync import PulseDB

OPS = 300
READS = re.compile(r"consumer|stall|recreat|replication|WARNING|ERROR")
WORKERS = 3


class Worker:
    def __init__(self, root: Path, index: int, urls: str, ops: int, seed: int) -> None:
        self.acks = root / f"acks-{index}.log"
        self.lines: Queue[str] = Queue()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.host_worker", str(root / f"host-{index}"), urls,
             str(root / "ids.json"), str(self.acks), str(ops), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).parent.parent,
        )  # fmt: skip
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def wait_for(self, prefix: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except Empty:
                raise AssertionError(f"worker never printed {prefix!r}") from None
            if line.startswith(prefix):
                return line

    def close(self, kill: bool = False) -> None:
        if kill:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(60)
        self.reader.join(10)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.stdout.close()

    def acked(self) -> int:
        return len(self.acks.read_text().splitlines()) if self.acks.exists() else 0


def disagreement(reports: list[dict[str, Any]], root: Path) -> str:
    """What differs between the hosts' states: for each digested table (and the G-counter
    entries memory holds) whose rows differ, the rows each host has that another lacks;
    and what each host's log says of its reads (its consumers, where they ran, stalls)."""
    lines = ["hosts disagree: " + ", ".join(r["digest"][:12] for r in reports)]
    everywhere = set.intersection(*(set(r["explain"]["applied"]) for r in reports))
    for i, r in enumerate(reports):
        e = r["explain"]
        lines.append(f"host {i}: seq {e['seq']}, flushed {e['flushed_seq']}, totals {r['totals']}")
        missed = sorted(set(range(1, e["seq"] + 1)) - set(e["applied"]))
        only = sorted(set(e["applied"]) - everywhere)
        lines.append(f"  never applied: {missed[:50]}; applied, not by every host: {only[:50]}")
    shown = [{**r["explain"]["tables"], "memory": r["explain"]["memory"],
              "rejected": r["explain"]["rejected"]} for r in reports]  # fmt: skip
    for name in shown[0]:
        held = [s[name] for s in shown]
        if all(h == held[0] for h in held):
            continue
        lines.append(f"{name} differs:")
        if any(isinstance(h, str) for h in held):
            lines.extend(f"  host {i}: {h if isinstance(h, str) else len(h)}" for i, h in
                         enumerate(held))  # fmt: skip
            continue
        everywhere = set.intersection(*(set(h) for h in held))
        for i, h in enumerate(held):
            lines.extend(f"  only host {i}: {row}" for row in h if row not in everywhere)
    for i in range(len(reports)):
        logged = root / f"host-{i}" / "pulse.log"
        said = logged.read_text().splitlines() if logged.exists() else []
        lines.append(f"host {i}'s log of its reads:")
        lines.extend(f"  {line}" for line in said if READS.search(line))
    return "\n".join(lines)


async def test_three_hosts_agree_through_node_and_instance_failures(
    tmp_path: Path, cluster: LocalCluster
) -> None:
    urls = ",".join(cluster.urls)
    setup = await PulseDB.open(
        tmp_path / "setup", urls, append_timeout=30, stream_settings=StreamSettings(replicas=3)
    )
    cid = await setup.create_collective("owner", "shared", 4)
    ids = [await setup.record_experience(cid, f"lesson {i}", [1, i, 0, 1]) for i in range(4)]
    await setup.close()
    (tmp_path / "ids.json").write_text(json.dumps([str(i) for i in ids]))

    (tmp_path / "acks-2.log.hold").write_text("10")  # host 2 stops after 10 calls
    workers = [Worker(tmp_path, i, urls, OPS, seed=i) for i in range(WORKERS)]
    try:
        victim = workers[2]
        victim.wait_for("holding")
        victim.close(kill=True)  # an instance dies, between two calls
        running = [workers[0].acked(), workers[1].acked()]
        cluster.kill(1)  # and a NATS node dies, while the others keep writing
        assert all(n < OPS for n in running), running
        os.unlink(tmp_path / "acks-2.log.hold")
        workers[2] = Worker(tmp_path, 2, urls, OPS - victim.acked(), seed=99)  # restarted
        workers[2].wait_for("ready")
        cluster.start_node(1)  # the node comes back

        for w in workers:
            w.wait_for("finished", timeout=300)
        reports = []
        for w in workers:
            assert w.process.stdin is not None
            w.process.stdin.write("report\n")
            w.process.stdin.flush()
            reports.append(json.loads(w.wait_for("{")))
            w.close()

    finally:
        for w in workers:
            if w.process.poll() is None:
                w.close(kill=True)

    (tmp_path / "reports.json").write_text(json.dumps(reports))  # (kept by pytest: a post-mortem)
    acked = Counter(
        line for w in (0, 1, 2) for line in (tmp_path / f"acks-{w}.log").read_text().splitlines()
    )
    assert sum(acked.values()) == OPS * WORKERS
    assert len({r["digest"] for r in reports}) == 1, disagreement(reports, tmp_path)
    for report in reports:
        assert report["totals"] == {str(i): acked[str(i)] for i in ids}
