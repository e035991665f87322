"""Consumer-group members of every client, for the group, offset and transaction tests.

- `group_config(kafka, ...)`: a config whose `[kafka]` section lets a group form at once
  (`group_initial_rebalance_delay_ms = 0`) and accepts the short session timeouts below.
- Members, each on its own thread (or process) with the same small interface: `assigned`
  (the partitions it holds now), `consumed` ([(partition, offset, value)] in the order it
  processed them), `close()` (a graceful leave), `errors`.
  - `ConfluentMember`, `KafkaPythonMember`, `AioKafkaMember`: subscribe, and after each batch
    commit the next offsets synchronously before asking for more. A batch is processed and
    committed whole before the next poll, and a rebalance (revoke) is served only inside
    a poll (librdkafka with a rebalance callback, kafka-python's poll) or waits for the
    batch in hand (aiokafka: a lock its rebalance listener takes), so across a graceful
    rebalance no record is processed twice or skipped.
  - `KcatMember`: `kcat -G` as a subprocess (auto-commit, at least once), its assignment read
    from the "rebalanced ... assigned:" lines it prints; `kill()` is SIGKILL.
- `committed(bootstrap, group, topic, partitions)`: a group's committed offsets through
  OffsetFetch (confluent-kafka `committed()`, no join).
- `free_port()`: a loopback port for a broker that must come back on the same address (a
  producer that retries across a restart knows only that one).
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import threading
import time

from kafka_clients import NEVER_JOINED

# Group settings the tests' brokers run with, and the clients' matching timeouts: a session
# expires 2 s after the last heartbeat; heartbeats every 300 ms, so a live member's is never late.
GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 1000}
SESSION_MS = 2000
HEARTBEAT_MS = 300


def group_config(kafka, name="silt.toml", topics=(), kafka_section=None, **sections):
    return kafka.config(name, topics=topics, kafka={**GROUP_SETTINGS, **(kafka_section or {})}, **sections)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def create_topic(bootstrap, topic, partitions):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def committed(bootstrap, group, topic, partitions, **conf):
    """{partition: committed offset} of `group` (-1001, librdkafka's "invalid", where none)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, **conf})
    try:
        got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
        for tp in got:
            assert tp.error is None, f"committed({group}, {topic}[{tp.partition}]): {tp.error}"
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def watermarks(bootstrap, topic, partitions):
    """[(low, high)] per partition."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": NEVER_JOINED})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False) for p in partitions]
    finally:
        c.close()


class Member:
    """A group member consuming `topic` on a thread of its own (see the module docs)."""

    client = "?"

    def __init__(self, bootstrap, group, topic, name, **conf):
        self.bootstrap, self.group, self.topic, self.name = bootstrap, group, topic, name
        self.conf = conf
        self.lock = threading.Lock()
        self.assigned = frozenset()
        self.assignments = []      # every assignment it was given, in order
        self.consumed = []         # (partition, offset, value)
        self.errors = []
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._guarded, daemon=True, name=f"{self.client}-{name}")

    def start(self):
        self.thread.start()
        return self

    def _guarded(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - reported to the test through `errors`
            with self.lock:
                self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            self.ready.set()

    def _assign(self, partitions):
        with self.lock:
            self.assigned = frozenset(partitions)
            if partitions:
                self.assignments.append(frozenset(partitions))

    def _took(self, records):
        with self.lock:
            self.consumed.extend(records)

    def close(self, timeout=60):
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} did not close within {timeout}s"
        self._assign(())

    def snapshot(self):
        with self.lock:
            return self.assigned, list(self.consumed), list(self.errors)


class ConfluentMember(Member):
    client = "confluent"

    def _run(self):
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": self.name,
                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                      "fetch.wait.max.ms": 100, **self.conf})
        try:
            c.subscribe([self.topic], on_assign=lambda _c, ps: self._assign(p.partition for p in ps),
                        on_revoke=lambda _c, ps: self._assign(()))
            self.ready.set()
            while not self.stop.is_set():
                msgs = c.consume(200, 0.2)
                took, nxt = [], {}
                for m in msgs:
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            continue
                        raise KafkaException(m.error())
                    took.append((m.partition(), m.offset(), m.value()))
                    nxt[m.partition()] = m.offset() + 1
                if took:
                    self._took(took)
                    c.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in nxt.items()], asynchronous=False)
        finally:
            c.close()


class KafkaPythonMember(Member):
    client = "kafka-python"

    def _run(self):
        from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata, TopicPartition
        member = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                member._assign(())

            def on_partitions_assigned(self, assigned):
                member._assign(tp.partition for tp in assigned)

        c = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.name,
                          enable_auto_commit=False, auto_offset_reset="earliest",
                          session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                          fetch_max_wait_ms=100, **self.conf)
        try:
            c.subscribe([self.topic], listener=Listener())
            self.ready.set()
            while not self.stop.is_set():
                # A long poll: kafka-python 3.0.12 abandons a rebalance that a poll's timeout
                # cuts short (it applies no SyncGroup answer and never heartbeats again, so
                # the coordinator rightly drops it when its session expires).
                batches = c.poll(timeout_ms=3000)
                took, nxt = [], {}
                for tp, msgs in batches.items():
                    for m in msgs:
                        took.append((m.partition, m.offset, m.value))
                        nxt[tp] = OffsetAndMetadata(m.offset + 1, "", -1)
                if took:
                    self._took(took)
                    c.commit(nxt)
        finally:
            c.close()


class AioKafkaMember(Member):
    """aiokafka rebalances on a task of its own, between any two awaits of the application: its
    listener takes the lock the batch in hand holds, and a batch fetched across a revoke is
    dropped (its records go to the partition's owner from the committed offset)."""

    client = "aiokafka"

    def _run(self):
        asyncio.run(self._main())

    async def _main(self):
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
        from aiokafka.structs import OffsetAndMetadata
        member = self
        lock = asyncio.Lock()
        revokes = [0]

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                async with lock:
                    revokes[0] += 1
                    member._assign(())

            async def on_partitions_assigned(self, assigned):
                member._assign(tp.partition for tp in assigned)

        c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.name,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                             fetch_max_wait_ms=100, **self.conf)
        await c.start()
        try:
            c.subscribe([self.topic], listener=Listener())
            self.ready.set()
            while not self.stop.is_set():
                seen = revokes[0]
                batches = await c.getmany(timeout_ms=200)
                async with lock:
                    if revokes[0] != seen:
                        # Fetched across a rebalance: not processed. A partition held again
                        # reads them again (its committed offset is the first of them).
                        held = c.assignment()
                        for tp, msgs in batches.items():
                            if msgs and tp in held:
                                c.seek(tp, msgs[0].offset)
                        continue
                    took, nxt = [], {}
                    for tp, msgs in batches.items():
                        for m in msgs:
                            took.append((m.partition, m.offset, m.value))
                            nxt[tp] = OffsetAndMetadata(m.offset + 1, "")
                    if took:
                        self._took(took)
                        await c.commit(nxt)
        finally:
            await c.stop()


MEMBERS = {m.client: m for m in (ConfluentMember, KafkaPythonMember, AioKafkaMember)}


class KcatMember(Member):
    """`kcat -G GROUP TOPIC` as a process: auto-commit (librdkafka's), records printed as
    `partition offset value` lines, assignments from its stderr."""

    client = "kcat"
    REBALANCED = re.compile(r"rebalanced \(memberid [^)]*\): (assigned|revoked): (.*)")

    def __init__(self, bootstrap, group, topic, name, **conf):
        super().__init__(bootstrap, group, topic, name, **conf)
        args = ["kcat", "-b", bootstrap, "-G", group, topic, "-f", r"%p %o %s\n", "-u",
                "-X", f"client.id={name}", "-X", "auto.offset.reset=earliest",
                "-X", f"session.timeout.ms={SESSION_MS}", "-X", f"heartbeat.interval.ms={HEARTBEAT_MS}",
                "-X", "fetch.wait.max.ms=100", "-X", "auto.commit.interval.ms=200"]
        for k, v in conf.items():
            args += ["-X", f"{k}={v}"]
        self.args = args
        self.proc = None
        self.stderr_lines = []

    def start(self):
        from tiering_harness import _die_with_parent
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        threading.Thread(target=self._read_out, daemon=True, name=f"kcat-{self.name}-out").start()
        threading.Thread(target=self._read_err, daemon=True, name=f"kcat-{self.name}-err").start()
        self.ready.set()
        return self

    def _read_out(self):
        for line in self.proc.stdout:
            p, o, v = line.rstrip(b"\n").split(b" ", 2)
            self._took([(int(p), int(o), v)])

    def _read_err(self):
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            with self.lock:
                self.stderr_lines.append(line)
            m = self.REBALANCED.search(line)
            if m:
                parts = [int(x) for x in re.findall(r"\[(\d+)\]", m.group(2))]
                self._assign(parts if m.group(1) == "assigned" else ())

    def close(self, timeout=60):
        """SIGTERM: kcat closes its consumer (commits, leaves the group)."""
        self.proc.terminate()
        self.proc.wait(timeout)
        self._assign(())

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)
        self._assign(())


def wait_assignment(members, partitions, timeout=60, what="", each=None):
    """Waits until the members together hold every partition of `partitions` exactly once
    (and, with `each`, each member holds that many); returns {member name: partitions}."""
    def check():
        held = {m.name: m.snapshot()[0] for m in members}
        flat = [p for ps in held.values() for p in ps]
        errors = [e for m in members for e in m.snapshot()[2]]
        assert not errors, f"a member failed: {errors}"
        if sorted(flat) != sorted(partitions):
            return None
        if each is not None and any(len(ps) != each for ps in held.values()):
            return None
        return held
    try:
        return wait_until_value(check, timeout)
    except TimeoutError:
        held = {m.name: sorted(m.snapshot()[0]) for m in members}
        raise AssertionError(f"{what}: partitions {sorted(partitions)} never held once each; now {held}") from None


def wait_until_value(predicate, timeout, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(interval)
