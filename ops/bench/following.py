"""Benchmark: hosts that follow some collectives (``sync.following``) beside a host that
follows every one: their catch-up time and memory, and a collective followed later.

    python -m ops.bench.following [--collectives 20] [--experiences-per 2000]
        [--reinforcements-per 0.5] [--dim 32] [--follows N ...] [--rounds 3]
        [--only FIGURE ...]

An embedded NATS (sync_interval 2m: filling is not measured) is filled, in JetStream
atomic batches of 1,000, with ``--collectives`` collectives c00, c01, ... (owner
"bench", ``--dim``-d vectors: small, so that the fold and not FAISS is what costs), each
with ``--experiences-per`` recorded experiences and ``--reinforcements-per``
reinforcements per experience (running totals of one of 4 instances), the collectives'
events interleaved one by one as if written at once; 4 access tokens first and one
wisdom event per 1,000 events (every host reads those). The hosts, each opened in a
process of its own (``python -m ops.bench.following --worker``, told what to do on its
stdin) on a new data directory: ``full`` (every collective); ``follows_N`` for each N of
``--follows`` (default 1 and a quarter of the collectives: c00 .. c<N-1>, by name);
``follow_later`` (opens following the last collective, then calls
``follow(["c00"])``). ``--rounds`` rounds of every host in turn; each figure is the
median over the rounds (``*_rounds`` lists them: the machine may be shared and noisy).
One JSON line per figure and partial host, both sides and the ratios in it:

- catch_up: seconds from the start of ``PulseDB.open`` to its return (it catches up
  before returning) and the events read (``events_applied`` + ``backfilled``), beside
  the full host's; ``ratio_to_full`` = host s / full host s, beside ``share_of_events``
  (what that ratio would be if catch-up scaled exactly with what is followed). Peers,
  in the same process once the host is closed: nats-py ordered push consumers counting
  messages without decoding. ``raw_drain_s``: one consumer with the host's filters
  (``pulse.c.<id>.>`` per collective, ``pulse.w.>``, ``pulse.t.>``; none for the full
  host). ``raw_single_filters_s``: the same messages read by one single-filter consumer
  per filter, one after the other, which is how a partial host reads a stretch of the
  log (``eventlog.jetstream._merged``); ``ratio_to_raw`` = host s / raw_single_filters_s
  (the full host: / raw_drain_s). ``raw_multi_to_single`` = raw_drain_s /
  raw_single_filters_s, what reading them through one multi-filter consumer would cost
  the server.
- memory: growth of VmRSS and RssAnon (``/proc/self/status``) from just before ``open``
  (Pulse imported) to just after it, and VmRSS then, beside the full host's; ratio host
  / full for each, beside ``share_of_events``. (The full host's catch-up reads the log
  in a child process, ``eventlog.reader``: not counted.)
- follow_later: seconds of ``follow(["c00"])`` on a host that follows the last
  collective (c00's events backfilled, its subjects added to the tail), beside seconds
  of ``open`` of ``follows_1`` (a new host following only c00): ``ratio``. Both read
  c00's events, but the open also pays what any open costs: ``fixed_open_s``, the open
  of a host whose reference (``owner:nobody``) matches no collective, so it reads only
  wisdom and tokens. ``ratio_less_fixed`` = follow s / (open s - fixed s) should be
  near 1 (target 0.5 .. 2) whatever the other collectives hold. Beside it, the raw
  drain of c00's subjects.

Checked, cheaply: every partial host's ``digest(cid)`` of each collective it follows
equals the full host's of the same round, and every host read exactly the events it
follows; else what differs goes to stderr and the bench exits 1. A summary line per
figure goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
import nats
import numpy as np

from eventlog import EmbeddedNats, JetStreamLog, StreamSettings
from eventlog import events as ev
from eventlog.ids import uuid7
from eventlog.subjects import collective_filter
from ops.bench import emitter
from ops.bench.peers import raw_drain
from ops.bench.projection import append_all, sig
from sync import PulseDB

FIGURES = ("catch_up", "memory", "follow_later")
INSTANCES, TOKENS, WISDOM_EVERY, VOCABULARY = 4, 4, 1000, 2000
STREAM = StreamSettings().name
EVERYTHING = ">"  # the raw peer of the full host: a consumer without a filter
ROOT = Path(__file__).resolve().parents[2]


emit = emitter("following")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def status() -> tuple[int, int]:
    """(VmRSS, RssAnon) of this process in bytes."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["RssAnon"].split()[0]) * 1024


def mib(n: float) -> float:
    return round(n / 2**20, 1)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def rounded(values: Sequence[float]) -> list[float]:
    return [round(v, 3) for v in values]


# -- the log ---------------------------------------------------------------------------------


class Organisation:
    """Collectives c00, c01, ... and their events; ``counts`` (events per collective),
    ``tokens`` and ``wisdom`` are known once ``events()`` is consumed."""

    def __init__(self, count: int, per: int, reinforcements: float, dim: int) -> None:
        self.names = [f"c{i:02d}" for i in range(count)]
        self.ids = {name: uuid7() for name in self.names}
        self.per, self.reinforcements, self.dim = per, reinforcements, dim
        self.instances = [uuid7() for _ in range(INSTANCES)]
        self.counts = dict.fromkeys(self.names, 0)
        self.tokens = self.wisdom = 0

    def collective(self, name: str, seed: int) -> Iterator[ev.Event]:
        """One collective's events in its writers' order (HLC 0: ``events`` sets it)."""
        rng = np.random.default_rng(seed)
        cid, instances = self.ids[name], self.instances
        yield ev.CollectiveCreated(
            event_id=uuid7(), instance_id=instances[0], hlc=0, collective_id=cid,
            owner_id="bench", name=name, embedding_dimension=self.dim,
        )  # fmt: skip
        vectors = rng.normal(size=(self.per, self.dim)).astype("<f4")
        words = rng.integers(0, VOCABULARY, size=(self.per, 8)).tolist()
        experiences: list[UUID] = []
        totals: dict[tuple[int, int], int] = {}  # (writer, experience) -> its running total
        credit = 0.0
        for i in range(self.per):
            experiences.append(uuid7())
            yield ev.ExperienceRecorded(
                event_id=uuid7(), instance_id=instances[i % INSTANCES], hlc=0,
                experience_id=experiences[-1], collective_id=cid,
                content=f"{name} lesson {i}: " + " ".join(f"w{w}" for w in words[i]),
                embedding=vectors[i].tobytes(), experience_type=ev.Generic(),
                importance=0.5, confidence=0.5, source_agent="bench",
            )  # fmt: skip
            credit += self.reinforcements
            while credit >= 1:
                credit -= 1
                target, writer = int(rng.integers(len(experiences))), int(rng.integers(INSTANCES))
                totals[writer, target] = totals.get((writer, target), 0) + 1
                yield ev.ExperienceReinforced(
                    event_id=uuid7(), instance_id=instances[writer], hlc=0,
                    experience_id=experiences[target], collective_id=cid,
                    applications=totals[writer, target],
                )  # fmt: skip

    def events(self) -> Iterator[ev.Event]:
        """Tokens, then every collective's events interleaved one by one with a wisdom
        event now and then; HLCs a millisecond apart, ending well before now."""
        rng = np.random.default_rng(99)
        hlc = ev.pack_hlc(int(time.time() * 1000) - 10_000_000)
        common: dict[str, Any] = {"instance_id": self.instances[0], "author_owner": "bench"}
        for i in range(TOKENS):
            hlc += 1 << 16
            self.tokens += 1
            yield ev.TokenCreated(
                event_id=uuid7(), hlc=hlc, token_id=uuid7(), owner_id="bench",
                secret_sha256=f"{i:064x}", scope="read", **common,
            )  # fmt: skip
        running = [(name, self.collective(name, seed)) for seed, name in enumerate(self.names)]
        written = 0
        while running:
            for name, events in list(running):
                event = next(events, None)
                if event is None:
                    running.remove((name, events))
                    continue
                hlc += 1 << 16
                written += 1
                self.counts[name] += 1
                yield msgspec.structs.replace(event, hlc=hlc)
                if written % WISDOM_EVERY == 0:
                    hlc += 1 << 16
                    self.wisdom += 1
                    yield ev.WisdomStored(
                        event_id=uuid7(), hlc=hlc, wisdom_id=uuid7(), owner_id="bench",
                        category="CodingStyle", pattern=f"pattern {written}", confidence=0.5,
                        embedding=rng.normal(size=self.dim).astype("<f4").tobytes(), **common,
                    )  # fmt: skip

    def followed(self, names: Sequence[str]) -> int:
        """Events a host following ``names`` reads (with wisdom and tokens)."""
        return sum(self.counts[n] for n in names) + self.tokens + self.wisdom

    def total(self) -> int:
        return self.followed(self.names)


async def raw_seconds(url: str, drains: Sequence[tuple[Sequence[str], int]]) -> float:
    """Seconds of the raw drains, one after the other, on one connection."""
    nc = await nats.connect(url)
    try:
        started = time.perf_counter()
        for subjects, total in drains:
            await raw_drain(nc.jetstream(), subjects, total, stream=STREAM)
        return time.perf_counter() - started
    finally:
        await nc.close()


async def fill(url: str, org: Organisation) -> int:
    """Append the organisation's events; drain them once (untimed, so that every host
    finds the server as warm); the stream's last sequence."""
    log = await JetStreamLog.connect(url, append_timeout=60)
    try:
        total = await append_all(log, org.events())
    finally:
        await log.close()
    await raw_seconds(url, [([EVERYTHING], total)])
    return total


# -- a host in its own process ---------------------------------------------------------------


async def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Open a host as ``spec`` says; what it measured (see ``worker``)."""
    before = status()
    started = time.perf_counter()
    db = await PulseDB.open(spec["dir"], spec["url"], collectives=spec["refs"])
    open_s = time.perf_counter() - started
    after = status()
    out: dict[str, Any] = {"open_s": open_s, "before": before, "after": after}
    try:
        if spec["later"]:
            applied, backfilled = db.events_applied, db.backfilled
            started = time.perf_counter()
            await db.follow([spec["later"]])
            out["follow_s"] = time.perf_counter() - started
            out["follow_events"] = db.events_applied - applied + db.backfilled - backfilled
        out["events"] = db.events_applied + db.backfilled
        out["digests"] = {n: await db.digest(UUID(c)) for n, c in spec["digests"].items()}
    finally:
        await db.close()
    out["raw_s"] = await raw_seconds(spec["url"], [spec["raw"]])
    if spec["single"]:
        out["raw_single_s"] = await raw_seconds(spec["url"], [([s], n) for s, n in spec["single"]])
    return out


def worker() -> None:
    """``--worker``: one host, its spec a JSON line on stdin (the URL holds credentials:
    never in argv), what it measured a JSON line on stdout."""
    spec = json.loads(sys.stdin.readline())
    print(json.dumps(asyncio.run(measure(spec))), flush=True)


@dataclass(frozen=True)
class Host:
    """A host of the bench: the collectives it opens following (None: every one), and
    the one it follows later."""

    kind: str
    names: list[str] | None
    later: str | None = None
    refs: list[str] | None = None  # what it is told to follow, when not ``names``

    def follows(self, org: Organisation) -> list[str]:
        names = org.names if self.names is None else self.names
        return names + ([self.later] if self.later else [])

    def spec(self, org: Organisation, url: str, directory: Path) -> dict[str, Any]:
        # the raw peers read what the host's open read; follow_later's, what its follow read
        if self.names is None:
            raw: tuple[list[str], int] = ([EVERYTHING], org.total())
            single: list[tuple[str, int]] = []
        elif self.later:
            raw = (collective_filter([org.ids[self.later]], wisdom=False), org.counts[self.later])
            single = []
        else:
            single = [(f, org.counts[n]) for n in self.names
                      for f in collective_filter([org.ids[n]], wisdom=False)]  # fmt: skip
            wisdom, tokens = collective_filter([])
            single += [(wisdom, org.wisdom), (tokens, org.tokens)]
            raw = ([f for f, _ in single], org.followed(self.names))
        return {
            "kind": self.kind, "url": url, "dir": str(directory),
            "refs": self.names if self.refs is None else self.refs,
            "later": self.later, "raw": raw, "single": single,
            "digests": {n: str(org.ids[n]) for n in self.follows(org)},
        }  # fmt: skip

    def run(self, org: Organisation, url: str, directory: Path) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "ops.bench.following", "--worker"],
            input=json.dumps(self.spec(org, url, directory)), capture_output=True, text=True,
            cwd=ROOT, timeout=1800,
        )  # fmt: skip
        shutil.rmtree(directory, ignore_errors=True)
        if done.returncode:
            raise RuntimeError(f"the {self.kind} host failed:\n{done.stderr}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def check(self, org: Organisation, got: dict[str, Any], full: dict[str, Any]) -> list[str]:
        """What this host got wrong: events read, digests against the full host's."""
        wrong = []
        expected = org.followed(self.follows(org))
        if got["events"] != expected:
            wrong.append(f"{self.kind}: read {got['events']} events, follows {expected}")
        if self.later and got["follow_events"] != org.counts[self.later]:
            wrong.append(f"{self.kind}: follow({self.later}) read {got['follow_events']} "
                         f"events, {self.later} holds {org.counts[self.later]}")  # fmt: skip
        for name, digest in got["digests"].items():
            if digest != full["digests"][name]:
                wrong.append(f"{self.kind}: digest({name}) {digest} != the full host's")
        return wrong


# -- the figures -----------------------------------------------------------------------------


def catch_up(host: Host, share: float, runs: list[dict[str, Any]], full: list[dict[str, Any]],
             sides: dict[str, Any]) -> None:  # fmt: skip
    open_s, full_s = median([r["open_s"] for r in runs]), median([r["open_s"] for r in full])
    raw_s, single_s = median([r["raw_s"] for r in runs]), median([r["raw_single_s"] for r in runs])
    full_raw_s = median([r["raw_s"] for r in full])
    emit("catch_up", host=host.kind, follows=len(host.names or []), **sides,
         events_read=runs[0]["events"], share_of_events=sig(share), open_s=round(open_s, 3),
         open_s_rounds=rounded([r["open_s"] for r in runs]), full_open_s=round(full_s, 3),
         full_open_s_rounds=rounded([r["open_s"] for r in full]),
         raw_drain_s=round(raw_s, 3), raw_single_filters_s=round(single_s, 3),
         full_raw_drain_s=round(full_raw_s, 3), ratio_to_full=sig(open_s / full_s),
         ratio_to_raw=sig(open_s / single_s), full_ratio_to_raw=sig(full_s / full_raw_s),
         raw_multi_to_single=sig(raw_s / single_s))  # fmt: skip
    say(f"catch_up {host.kind}: {runs[0]['events']} events ({share:.1%} of the log) in "
        f"{open_s:.2f}s, full host {full_s:.2f}s: {open_s / full_s:.2f} of it; "
        f"{open_s / single_s:.1f}x its raw drain (full: {full_s / full_raw_s:.1f}x); its raw "
        f"multi-filter drain {raw_s / single_s:.1f}x single-filter drains")  # fmt: skip


def memory(host: Host, share: float, runs: list[dict[str, Any]], full: list[dict[str, Any]],
           sides: dict[str, Any]) -> None:  # fmt: skip
    def growth(results: list[dict[str, Any]], i: int) -> float:
        return median([r["after"][i] - r["before"][i] for r in results])

    rss, anon = growth(runs, 0), growth(runs, 1)
    full_rss, full_anon = growth(full, 0), growth(full, 1)
    emit("memory", host=host.kind, follows=len(host.names or []), **sides,
         share_of_events=sig(share), vm_rss_growth_mb=mib(rss), rss_anon_growth_mb=mib(anon),
         vm_rss_mb=mib(median([r["after"][0] for r in runs])),
         full_vm_rss_growth_mb=mib(full_rss), full_rss_anon_growth_mb=mib(full_anon),
         full_vm_rss_mb=mib(median([r["after"][0] for r in full])),
         ratio_vm_rss_growth_to_full=sig(rss / full_rss),
         ratio_rss_anon_growth_to_full=sig(anon / full_anon))  # fmt: skip
    say(f"memory {host.kind}: VmRSS +{mib(rss)} MiB (RssAnon +{mib(anon)}), full host "
        f"+{mib(full_rss)} (+{mib(full_anon)}): {rss / full_rss:.2f} ({anon / full_anon:.2f}) "
        f"of it, following {share:.1%} of the events")  # fmt: skip


def follow_later(runs: list[dict[str, Any]], fresh: list[dict[str, Any]],
                 empty: list[dict[str, Any]], sides: dict[str, Any]) -> None:  # fmt: skip
    follow_s, fresh_s = median([r["follow_s"] for r in runs]), median([r["open_s"] for r in fresh])
    fixed_s, raw_s = median([r["open_s"] for r in empty]), median([r["raw_s"] for r in runs])
    ratio, reading = follow_s / fresh_s, follow_s / max(fresh_s - fixed_s, 1e-3)
    emit("follow_later", **sides, events_backfilled=runs[0]["follow_events"],
         follow_s=round(follow_s, 3), follow_s_rounds=rounded([r["follow_s"] for r in runs]),
         fresh_open_s=round(fresh_s, 3), fresh_open_s_rounds=rounded([r["open_s"] for r in fresh]),
         fresh_events_read=fresh[0]["events"], fixed_open_s=round(fixed_s, 3),
         raw_drain_s=round(raw_s, 3), ratio=sig(ratio), ratio_less_fixed=sig(reading),
         ratio_to_raw=sig(follow_s / raw_s), target="0.5 <= ratio_less_fixed <= 2",
         met=0.5 <= reading <= 2)  # fmt: skip
    say(f"follow_later: follow(c00) {follow_s:.2f}s ({runs[0]['follow_events']} events), a "
        f"new host on c00 {fresh_s:.2f}s: {ratio:.2f} of it ({reading:.2f} without the "
        f"{fixed_s:.2f}s any open costs); {follow_s / raw_s:.1f}x c00's raw drain")  # fmt: skip


def main(options: argparse.Namespace) -> int:
    figures, count = set(options.only), options.collectives
    org = Organisation(count, options.experiences_per, options.reinforcements_per, options.dim)
    follows = sorted(set(options.follows or [1, max(1, count // 4)]))
    if figures == {"follow_later"}:
        follows = [1]
    elif "follow_later" in figures:
        follows = sorted({1, *follows})
    hosts = [Host("full", None)] + [Host(f"follows_{n}", org.names[:n]) for n in follows]
    if "follow_later" in figures:
        hosts.append(Host("follow_later", [org.names[-1]], org.names[0]))
        # the fixed cost of opening: a host whose reference matches no collective
        hosts.append(Host("follows_none", [], refs=["owner:nobody"]))
    got: dict[str, list[dict[str, Any]]] = {h.kind: [] for h in hosts}
    wrong: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="pulse-bench-following-") as tmp,
        EmbeddedNats(tmp, sync_always=False) as server,
    ):
        started = time.perf_counter()
        total = asyncio.run(fill(server.url, org))
        say(f"filled {total} events ({count} collectives) in {time.perf_counter() - started:.1f}s")
        for turn in range(options.rounds):
            for host in hosts:
                result = host.run(org, server.url, Path(tmp) / f"{host.kind}-{turn}")
                got[host.kind].append(result)
                wrong += host.check(org, result, got["full"][-1])
    sides = {"collectives": count, "experiences_per": options.experiences_per, "events": total,
             "rounds": options.rounds}  # fmt: skip
    for host in hosts[1:]:
        if host.later or not host.names:
            continue
        share = org.followed(host.names or []) / total
        if "catch_up" in figures:
            catch_up(host, share, got[host.kind], got["full"], sides)
        if "memory" in figures:
            memory(host, share, got[host.kind], got["full"], sides)
    if "follow_later" in figures:
        follow_later(got["follow_later"], got["follows_1"], got["follows_none"], sides)
    for line in wrong:
        say(f"WRONG {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
        sys.exit(0)
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.following",
        description=__doc__.split("\n\n")[0],
        epilog="figures: " + ", ".join(FIGURES),
    )
    parser.add_argument("--collectives", type=int, default=20, help="collectives (20)")
    parser.add_argument("--experiences-per", type=int, default=2000,
                        help="experiences recorded per collective (2000)")  # fmt: skip
    parser.add_argument("--reinforcements-per", type=float, default=0.5,
                        help="reinforcements per experience (0.5)")  # fmt: skip
    parser.add_argument("--dim", type=int, default=32, help="embedding dimension (32)")
    parser.add_argument("--follows", type=int, nargs="+", metavar="N",
                        help="partial hosts: one following N collectives for each N "
                             "(1 and a quarter of --collectives)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every host; figures are medians (3)")  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES),
                        metavar="FIGURE", help="only these figures (all)")  # fmt: skip
    options = parser.parse_args()
    if options.collectives < 2:
        parser.error("--collectives: at least 2 (a host follows one, then another)")
    if any(not 1 <= n <= options.collectives for n in options.follows or []):
        parser.error("--follows: each N in 1 .. --collectives")
    if options.rounds < 1:
        parser.error("--rounds: at least 1")
    sys.exit(main(options))
