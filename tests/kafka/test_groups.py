"""Consumer groups as real clients run them (the classic protocol, one coordinator: this node).

1. Three members of one client (confluent-kafka, kafka-python, aiokafka) on a three-partition
   topic, records arriving all along: every partition is held by exactly one member; a member
   closing and one joining each move partitions; with offsets committed synchronously after
   each batch no record is lost or processed twice across the rebalances; a new member of the
   group resumes at the committed offsets.
2. The same with `kcat -G` processes (auto-commit: no record lost).
3. Session timeout: a member whose process is SIGKILLed (no LeaveGroup, no heartbeat) is
   removed once its session expires, and its partition goes to a live member.
4. DescribeGroups / ListGroups through confluent's AdminClient and kafka-python's
   KafkaAdminClient: the group, its members, their assignments and the group state.
5. DeleteGroups: refused for a group with members, then removes an empty group's offsets,
   for good (also after kill -9).

The brokers run with `group_initial_rebalance_delay_ms = 0` and short sessions
(`kafka_groups.GROUP_SETTINGS`).
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire", "kafka_groups")

from kafka_clients import CLIENTS, Rec  # noqa: E402
from kafka_groups import (  # noqa: E402
    HEARTBEAT_MS, MEMBERS, SESSION_MS, ConfluentMember, KafkaPythonMember, KcatMember, committed, create_topic,
    group_config, wait_assignment, watermarks,
)
from kafka_harness import unique, wait_until  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARTS = [0, 1, 2]


class Feed:
    """A confluent-kafka producer on a thread, writing `seq=N` to partition N % 3 every few ms
    until stopped; `acked` maps (partition, offset) to the value the broker acknowledged there."""

    def __init__(self, bootstrap, topic):
        self.topic = topic
        self.p = CLIENTS["confluent"].producer(bootstrap, **{"linger.ms": 1})
        self.acked, self.failed = {}, []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.running = threading.Event()  # cleared: paused
        self.running.set()
        self.idle = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="group-feed")

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        seq = 0
        while not self.stopping.is_set():
            if not self.running.is_set():
                assert self.p.flush(60) == 0
                self.idle.set()
                self.running.wait(0.05)
                continue
            self.idle.clear()
            value = f"seq={seq}".encode()

            def cb(err, msg, value=value):
                with self.lock:
                    if err is None:
                        self.acked[(msg.partition(), msg.offset())] = value
                    else:
                        self.failed.append(err)
            self.p.produce(self.topic, value=value, key=value, partition=seq % 3, on_delivery=cb)
            self.p.poll(0)
            seq += 1
            self.stopping.wait(0.01)
        assert self.p.flush(60) == 0

    def pause(self):
        """Returns once nothing is produced or unacknowledged."""
        self.running.clear()
        assert self.idle.wait(60)
        return dict(self.acked)

    def resume(self):
        self.running.set()

    def count(self):
        with self.lock:
            return len(self.acked)

    def finish(self):
        self.stopping.set()
        self.thread.join(90)
        assert not self.thread.is_alive()
        assert not self.failed, f"produce failed: {self.failed[:3]}"
        return dict(self.acked)


def consumed_by(members):
    return [(m.name, rec) for m in members for rec in m.snapshot()[1]]


def wait_progress(members, feed, what, timeout=60):
    """Waits until each member processed a record produced after this call."""
    start = feed.count()
    marks = {m.name: len(m.snapshot()[1]) for m in members}

    def moved():
        return feed.count() > start + 9 and all(len(m.snapshot()[1]) > marks[m.name] for m in members)
    wait_until(moved, timeout, interval=0.1, what=what)


def check_exactly_once(acked, records, what):
    """Every acknowledged record processed once, at its offset, and nothing else processed."""
    seen = {}
    for name, (p, o, value) in records:
        seen.setdefault((p, o), []).append((name, value))
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, f"{what}: {len(twice)} records processed more than once, e.g. {sorted(twice.items())[:5]}"
    lost = sorted(set(acked) - set(seen))
    assert not lost, f"{what}: {len(lost)} of {len(acked)} acknowledged records never processed, e.g. {lost[:10]}"
    extra = sorted(set(seen) - set(acked))
    assert not extra, f"{what}: processed records that were never acknowledged: {extra[:10]}"
    wrong = [(k, seen[k][0][1], acked[k]) for k in acked if seen[k][0][1] != acked[k]]
    assert not wrong, f"{what}: values differ from what was produced there: {wrong[:5]}"


@pytest.mark.parametrize("client", list(MEMBERS))
def test_three_members_share_three_partitions_and_rebalance_without_loss_or_repeat(kafka, client):
    node = kafka.node(config=group_config(kafka))
    b = node.bootstrap
    topic, group = unique(f"grp-{client}"), unique(f"g-{client}")
    create_topic(b, topic, 3)
    Member = MEMBERS[client]
    everyone = []

    def member(i):
        m = Member(b, group, topic, f"{client}-{i}").start()
        everyone.append(m)
        kafka.on_cleanup(m.close)
        return m

    first = [member(i) for i in range(3)]
    held = wait_assignment(first, PARTS, each=1, what="three members")
    feed = Feed(b, topic).start()
    kafka.on_cleanup(lambda: feed.stopping.set())
    wait_progress(first, feed, "every member processing records")

    # One closes (LeaveGroup): its partition moves to one of the two others.
    leaving = first[1]
    gone = held[leaving.name]
    leaving.close()
    rest = [first[0], first[2]]
    after = wait_assignment(rest, PARTS, what="two members after one left")
    assert all(p in after[first[0].name] | after[first[2].name] for p in gone)
    wait_progress(rest, feed, "the two members going on after the leave")

    # One joins: the partitions spread over three again, the newcomer gets one.
    joiner = member(3)
    now = rest + [joiner]
    wait_assignment(now, PARTS, each=1, what="three members after one joined")
    wait_progress(now, feed, "every member processing records after the join")

    acked = feed.finish()
    assert len(acked) > 30
    wait_until(lambda: len(consumed_by(everyone)) >= len(acked), 60, interval=0.1,
               what=f"all {len(acked)} acknowledged records processed")
    for m in now:
        m.close()
    records = consumed_by(everyone)
    check_exactly_once(acked, records, f"{client} group across a leave and a join")
    for m in everyone:
        assert not m.snapshot()[2], f"{m.name}: {m.snapshot()[2]}"
        assert len(m.assignments) >= 1, f"{m.name} never held a partition"

    # The offsets committed are the partitions' ends; a new member resumes there.
    ends = [hi for _, hi in watermarks(b, topic, PARTS)]
    assert committed(b, group, topic, PARTS) == dict(zip(PARTS, ends))
    CLIENTS["confluent"].produce(b, [(topic, p, Rec(b"late", f"late-{p}-{i}".encode())) for p in PARTS for i in range(2)])
    late = member(4)
    wait_until(lambda: len(late.snapshot()[1]) >= 6, 60, interval=0.1, what="the new member's records")
    late.close()
    got = sorted((p, o, v) for p, o, v in late.snapshot()[1])
    assert got == sorted((p, ends[p] + i, f"late-{p}-{i}".encode()) for p in PARTS for i in range(2)), \
        f"the new member did not resume at the committed offsets {ends}: {got}"


def test_kcat_members_share_partitions_and_hand_them_over(kafka):
    node = kafka.node(config=group_config(kafka))
    b = node.bootstrap
    topic, group = unique("grp-kcat"), unique("g-kcat")
    create_topic(b, topic, 3)
    members = []

    def member(i):
        m = KcatMember(b, group, topic, f"kcat-{i}").start()
        members.append(m)
        kafka.on_cleanup(m.kill)
        return m

    first = [member(i) for i in range(3)]
    wait_assignment(first, PARTS, each=1, what="three kcat members")
    feed = Feed(b, topic).start()
    kafka.on_cleanup(lambda: feed.stopping.set())
    wait_progress(first, feed, "every kcat member printing records")
    # kcat stores a record's offset when it polls it, and once SIGTERMed drops the record in
    # hand unprinted: it leaves with nothing in flight (the rebalance runs with the feed on).
    so_far = feed.pause()
    wait_until(lambda: set(so_far) <= {(p, o) for _, (p, o, _) in consumed_by(members)}, 30,
               what="every record so far printed")
    first[0].close()  # SIGTERM: kcat commits and leaves the group
    feed.resume()
    rest = first[1:]
    wait_assignment(rest, PARTS, what="two kcat members after one left")
    wait_progress(rest, feed, "the two kcat members going on")
    now = rest + [member(3)]
    wait_assignment(now, PARTS, each=1, what="three kcat members after one joined")
    wait_progress(now, feed, "every kcat member printing records after the join")
    acked = feed.finish()

    def all_seen():
        return set(acked) <= {(p, o) for _, (p, o, _) in consumed_by(members)}
    wait_until(all_seen, 60, interval=0.2, what=f"all {len(acked)} records printed by some kcat")
    # kcat commits on its own clock (auto-commit, at least once): repeats are allowed, values
    # must be what was produced at that offset.
    for name, (p, o, v) in consumed_by(members):
        assert acked.get((p, o)) == v, f"{name} printed {v!r} at {p}@{o}, produced {acked.get((p, o))!r}"


def test_a_killed_member_is_removed_after_its_session_timeout(kafka):
    node = kafka.node(config=group_config(kafka))
    b = node.bootstrap
    topic, group = unique("grp-kill"), unique("g-kill")
    create_topic(b, topic, 3)
    live = [ConfluentMember(b, group, topic, f"live-{i}").start() for i in range(2)]
    for m in live:
        kafka.on_cleanup(m.close)
    doomed = KcatMember(b, group, topic, "doomed").start()
    kafka.on_cleanup(doomed.kill)
    held = wait_assignment(live + [doomed], PARTS, each=1, what="two confluent members and a kcat")
    lost = held["doomed"]
    assert len(describe(b, group).members) == 3

    killed = time.monotonic()
    doomed.kill()  # SIGKILL: no LeaveGroup; its connection is simply gone
    after = wait_assignment(live, PARTS, timeout=SESSION_MS / 1000 + 30, what="the live members after the kill")
    elapsed = time.monotonic() - killed
    assert any(lost <= ps for ps in after.values()), f"partition {sorted(lost)} was not reassigned: {after}"
    # Not before the session ran out: its last heartbeat was at most one interval before the kill.
    floor = (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.2
    assert elapsed >= floor, f"the member was removed {elapsed:.2f}s after the kill, before its session expired"
    d = describe(b, group)
    assert sorted(m.client_id for m in d.members) == ["live-0", "live-1"]
    assert d.state.name == "STABLE"


def admin(bootstrap):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": bootstrap})


def describe(bootstrap, group):
    a = admin(bootstrap)  # kept alive until the answer is in
    return a.describe_consumer_groups([group], request_timeout=30)[group].result(30)


def listed(bootstrap):
    """{group id: state name} from confluent's list_consumer_groups."""
    a = admin(bootstrap)
    res = a.list_consumer_groups(request_timeout=30).result(30)
    assert not res.errors, res.errors
    return {g.group_id: g.state.name for g in res.valid}


def test_describe_and_list_groups_show_the_members_and_the_state(kafka):
    from kafka.admin import KafkaAdminClient
    node = kafka.node(config=group_config(kafka))
    b = node.bootstrap
    topic, group = unique("grp-desc"), unique("g-desc")
    create_topic(b, topic, 3)
    CLIENTS["confluent"].produce(b, [(topic, p, Rec(None, f"v{p}".encode())) for p in PARTS])
    # A mixed group: librdkafka and kafka-python agree on the "range" assignor.
    members = [ConfluentMember(b, group, topic, "desc-c0").start(), ConfluentMember(b, group, topic, "desc-c1").start(),
               KafkaPythonMember(b, group, topic, "desc-kp").start()]
    for m in members:
        kafka.on_cleanup(m.close)
    held = wait_assignment(members, PARTS, each=1, what="a mixed group")
    wait_until(lambda: sum(len(m.snapshot()[1]) for m in members) >= 3, 30, what="the three records processed")

    d = describe(b, group)
    assert d.group_id == group and not d.is_simple_consumer_group
    assert d.state.name == "STABLE"
    assert d.partition_assignor == "range"
    assert d.coordinator.port == node.kafka_port
    by_client = {m.client_id: m for m in d.members}
    assert sorted(by_client) == ["desc-c0", "desc-c1", "desc-kp"]
    for name, parts in held.items():
        got = {(tp.topic, tp.partition) for tp in by_client[name].assignment.topic_partitions}
        assert got == {(topic, p) for p in parts}, f"{name}: described {got}, holds {sorted(parts)}"
    assert len({m.member_id for m in d.members}) == 3
    assert all(m.host.endswith("127.0.0.1") for m in d.members), [m.host for m in d.members]
    assert listed(b).get(group) == "STABLE"

    ka = KafkaAdminClient(bootstrap_servers=b)
    kafka.on_cleanup(ka.close)
    groups = {g["group_id"]: g for g in ka.list_groups()}
    assert groups[group]["protocol_type"] == "consumer", groups[group]
    kd = ka.describe_groups([group])[group]
    assert kd["error"] is None and kd["group_state"] == "Stable" and kd["protocol_data"] == "range", kd
    kp_members = {m["client_id"]: m for m in kd["members"]}
    assert sorted(kp_members) == ["desc-c0", "desc-c1", "desc-kp"]
    for name, parts in held.items():
        assignment = kp_members[name]["member_assignment"]
        got = {(t["topic"], p) for t in assignment["assigned_partitions"] for p in t["partitions"]}
        assert got == {(topic, p) for p in parts}, f"{name}: kafka-python describes {got}"
        assert kp_members[name]["member_metadata"]["topics"] == [topic]

    for m in members:
        m.close()
    d = describe(b, group)
    assert d.state.name == "EMPTY" and d.members == [], (d.state, d.members)
    assert listed(b).get(group) == "EMPTY"
    assert ka.describe_groups([group])[group]["group_state"] == "Empty"
    assert committed(b, group, topic, PARTS) == {0: 1, 1: 1, 2: 1}


def test_delete_groups_refuses_a_live_group_and_removes_an_empty_groups_offsets(kafka):
    from confluent_kafka import KafkaException
    from kafka.admin import KafkaAdminClient
    node = kafka.node(config=group_config(kafka))
    b = node.bootstrap
    topic, group = unique("grp-del"), unique("g-del")
    create_topic(b, topic, 3)
    CLIENTS["confluent"].produce(b, [(topic, p, Rec(None, f"v{p}-{i}".encode())) for p in PARTS for i in range(3)])
    m = ConfluentMember(b, group, topic, "del-0").start()
    kafka.on_cleanup(m.close)
    wait_until(lambda: len(m.snapshot()[1]) == 9, 30, what="nine records processed")

    a = admin(b)
    with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
        a.delete_consumer_groups([group], request_timeout=30)[group].result(30)
    m.close()
    assert committed(b, group, topic, PARTS) == {0: 3, 1: 3, 2: 3}, "the refused delete kept the offsets"

    a.delete_consumer_groups([group], request_timeout=30)[group].result(30)
    assert committed(b, group, topic, PARTS) == {0: -1001, 1: -1001, 2: -1001}, "offsets left after the delete"
    assert group not in listed(b)
    node.kill()  # the deletion is as durable as the commits were
    node.start()
    b = node.bootstrap
    assert committed(b, group, topic, PARTS) == {0: -1001, 1: -1001, 2: -1001}, "offsets back after kill -9"
    assert group not in listed(b)
    ka = KafkaAdminClient(bootstrap_servers=b)
    kafka.on_cleanup(ka.close)
    assert ka.delete_groups([group]) == {group: "GroupIdNotFoundError"}
    # A member of a group of that name starts from scratch (auto.offset.reset = earliest).
    again = ConfluentMember(b, group, topic, "del-1").start()
    kafka.on_cleanup(again.close)
    wait_until(lambda: len(again.snapshot()[1]) == 9, 30, what="the nine records again")
    again.close()
    assert sorted((p, o) for p, o, _ in again.snapshot()[1]) == [(p, o) for p in PARTS for o in range(3)]
