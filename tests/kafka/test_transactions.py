"""Transactions as stream processors use them (Kafka's protocol before KIP-890).

1. A committed and an aborted transaction of a confluent-kafka transactional producer, over two
   partitions, with plain records written while each was open: read_committed consumers
   (confluent, kafka-python, aiokafka, kcat) get exactly the committed and the plain records;
   read_uncommitted ones every data record; nobody ever gets a control record (the markers
   only take up offsets). The same after kill -9, and from the bucket on an empty data
   directory.
2. A read_committed consumer stops at the last stable offset (the first offset of the open
   transaction) while it is open, and goes on once it commits; ListOffsets says the same.
3. Consume-transform-produce with `send_offsets_to_transaction`: the group's committed offset
   moves with a commit only, an aborted transaction's output is never read committed, and the
   output holds each input once.
4. A transaction left open is aborted when the broker restarts after kill -9, and when it
   outlives its `transaction.timeout.ms`: its records are never read committed, the last
   stable offset catches up, and its producer learns it was fenced.
5. A second producer with the same transactional.id fences the first (its open transaction is
   aborted, its next commit fails as fenced).
6. kafka-python's and aiokafka's transactional producers: commit and abort.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire", "kafka_groups")

from kafka_clients import CLIENTS  # noqa: E402
from kafka_groups import committed, create_topic, group_config, watermarks  # noqa: E402
from kafka_harness import unique, wait_until  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

COMMITTED = {"confluent": {"isolation.level": "read_committed"}, "kcat": {"isolation.level": "read_committed"},
             "kafka-python": {"isolation_level": "read_committed"}, "aiokafka": {"isolation_level": "read_committed"}}
UNCOMMITTED = {"confluent": {"isolation.level": "read_uncommitted"},
               "kcat": {"isolation.level": "read_uncommitted"},
               "kafka-python": {"isolation_level": "read_uncommitted"},
               "aiokafka": {"isolation_level": "read_uncommitted"}}


class Writer:
    """A confluent-kafka producer (transactional with `tid`, else plain) noting where each
    value landed: `at[value] = (partition, offset)`."""

    def __init__(self, bootstrap, tid=None, **conf):
        from confluent_kafka import Producer
        c = {"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all"}
        if tid:
            c["transactional.id"] = tid
        else:
            c["enable.idempotence"] = False
        c.update(conf)
        self.p = Producer(c)
        self.at, self.errors = {}, []
        if tid:
            self.p.init_transactions(30)

    def send(self, topic, partition, *values, flush=True):
        for v in values:
            def cb(err, msg, v=v):
                if err is None:
                    self.at[v] = (msg.partition(), msg.offset())
                else:
                    self.errors.append((v, err))
            self.p.produce(topic, value=v, partition=partition, on_delivery=cb)
        if flush:
            assert self.p.flush(30) == 0
            assert not self.errors, self.errors

    def begin(self):
        self.p.begin_transaction()

    def commit(self):
        self.p.commit_transaction(30)

    def abort(self):
        self.p.abort_transaction(30)


def fetch_committed(port, topic, partition, offset=0):
    """A read_committed Fetch v4 by hand: (last stable offset, high watermark, aborted
    transactions [(producer id, first offset)])."""
    from kafka_wire import API_FETCH, RawKafka, array, i8, i32, i64, string
    raw = RawKafka(port)
    try:
        body = (i32(-1) + i32(0) + i32(0) + i32(1 << 20) + i8(1)
                + array([string(topic) + array([i32(partition) + i64(offset) + i32(1 << 20)])]))
        r = raw.request(API_FETCH, 4, body)
        r.i32()  # throttle

        def part(y):
            p, err, hw, lso = y.i32(), y.i16(), y.i64(), y.i64()
            aborted = y.array(lambda z: (z.i64(), z.i64()))
            y.bytes32()
            return err, hw, lso, aborted
        (_, [(err, hw, lso, aborted)]), = r.array(lambda x: (x.string(), x.array(part)))
        assert err == 0, f"fetch error {err}"
        return lso, hw, aborted
    finally:
        raw.close()


def lso_and_hw(bootstrap, topic, partition):
    """(latest offset under read_committed, under read_uncommitted) through
    AdminClient.list_offsets: Kafka answers the last stable offset and the high watermark."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec
    a = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition(topic, partition)
    out = []
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        out.append(a.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level, request_timeout=30)[tp].result(30).offset)
    return tuple(out)


def seen(client, bootstrap, topic, partition, count, conf):
    got = CLIENTS[client].consume(bootstrap, {(topic, partition): (0, count)}, **conf[client])[(topic, partition)]
    return [(g.offset, g.value) for g in got]


def test_read_committed_gets_the_committed_records_and_read_uncommitted_every_data_record(kafka):
    node = kafka.s3_node()
    b = node.bootstrap
    topic = unique("txn")
    create_topic(b, topic, 2)
    plain, tx = Writer(b), Writer(b, unique("tid"))
    for p in (0, 1):
        plain.send(topic, p, f"plain-0-p{p}".encode())
    tx.begin()
    tx.send(topic, 0, b"commit-a")
    tx.send(topic, 1, b"commit-b")
    for p in (0, 1):
        plain.send(topic, p, f"plain-1-p{p}".encode())  # while the transaction is open
    tx.send(topic, 0, b"commit-c")
    tx.commit()
    tx.begin()
    tx.send(topic, 0, b"abort-a")
    tx.send(topic, 1, b"abort-b")
    for p in (0, 1):
        plain.send(topic, p, f"plain-2-p{p}".encode())
    tx.abort()
    for p in (0, 1):
        plain.send(topic, p, f"plain-3-p{p}".encode())  # the last record: nothing comes after it

    aborted = {b"abort-a", b"abort-b"}
    expected = {}
    for p in (0, 1):
        data = sorted((o, v) for v, (q, o) in {**plain.at, **tx.at}.items() if q == p)
        expected[p] = (data, [(o, v) for o, v in data if v not in aborted])

    def check(clients, when):
        for p, (data, want_committed) in expected.items():
            lso, hw, aborted_ranges = fetch_committed(node.kafka_port, topic, p)
            assert [first for _, first in aborted_ranges] == [tx.at[b"abort-a" if p == 0 else b"abort-b"][1]], \
                f"{when}: partition {p}: aborted transactions {aborted_ranges}"
            assert lso == hw == data[-1][0] + 1, f"{when}: partition {p}: LSO {lso}, HW {hw}, last at {data[-1][0]}"
            markers = set(range(hw)) - {o for o, _ in data}
            assert len(markers) == 2, f"partition {p}: offsets {sorted(markers)} hold no data, expected two markers"
            for client in clients:
                got = seen(client, node.bootstrap, topic, p, len(want_committed), COMMITTED)
                assert got == want_committed, f"{when}: {client} read_committed, partition {p}"
                got = seen(client, node.bootstrap, topic, p, len(data), UNCOMMITTED)
                assert got == data, f"{when}: {client} read_uncommitted, partition {p}"

    check(list(COMMITTED), "")
    # The aborted ranges are state of their own (not in the partitions): they survive a
    # kill -9, and a restart on an empty data directory from the bucket.
    node.kill()
    node.start()
    check(["confluent", "kafka-python"], "after kill -9")
    assert node.stop() == 0, node.log_tail()
    kafka.wipe(node)
    node.start()
    check(["confluent", "aiokafka"], "after a restart on an empty data directory")


def test_a_read_committed_consumer_waits_at_the_last_stable_offset_until_the_commit(kafka):
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    node = kafka.node()
    b = node.bootstrap
    topic = unique("lso")
    create_topic(b, topic, 1)
    plain, tx = Writer(b), Writer(b, unique("tid"))
    plain.send(topic, 0, b"before")
    tx.begin()
    tx.send(topic, 0, b"open-0", b"open-1")
    plain.send(topic, 0, b"after")
    first_open = tx.at[b"open-0"][1]
    assert fetch_committed(node.kafka_port, topic, 0)[:2] == (first_open, plain.at[b"after"][1] + 1)

    c = Consumer({"bootstrap.servers": b, "group.id": unique("g"), "isolation.level": "read_committed",
                  "enable.partition.eof": True, "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    kafka.on_cleanup(c.close)
    c.assign([TopicPartition(topic, 0, 0)])
    got, eof = [], []

    def poll_until_eof(at):
        def step():
            m = c.poll(0.2)
            if m is None:
                return False
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                eof.append(m.offset())
                return m.offset() >= at
            got.append((m.offset(), m.value()))
            return False
        wait_until(step, 30, interval=0, what=f"the end of the partition at {at}")

    poll_until_eof(first_open)
    assert got == [(0, b"before")] and eof[-1] == first_open, (got, eof)

    tx.commit()
    lso, hw, _ = fetch_committed(node.kafka_port, topic, 0)
    assert lso == hw
    poll_until_eof(hw)
    want = [(0, b"before")] + sorted((at[v][1], v) for at, v in
                                     [(tx.at, b"open-0"), (tx.at, b"open-1"), (plain.at, b"after")])
    assert got == want, got


def group_offset(b, group, topic):
    return committed(b, group, topic, [0])[0]


def test_consume_transform_produce_moves_the_group_offset_only_with_a_commit(kafka):
    from confluent_kafka import Consumer, TopicPartition
    node = kafka.node(config=group_config(kafka))
    b = node.bootstrap
    src, out, group = unique("src"), unique("out"), unique("g-eos")
    create_topic(b, src, 1)
    create_topic(b, out, 1)
    Writer(b).send(src, 0, *[f"in-{i}".encode() for i in range(10)])

    c = Consumer({"bootstrap.servers": b, "group.id": group, "isolation.level": "read_committed",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 2000,
                  "heartbeat.interval.ms": 300, "fetch.wait.max.ms": 100})
    kafka.on_cleanup(c.close)
    c.subscribe([src])
    tx = Writer(b, unique("tid-eos"))

    def take(n):
        msgs = []
        wait_until(lambda: msgs.extend(m for m in c.consume(n - len(msgs), 0.2) if not m.error()) or len(msgs) >= n,
                   30, interval=0, what=f"{n} input records")
        return msgs

    def transform(msgs, end):
        tx.begin()
        for m in msgs:
            tx.send(out, 0, b"OUT:" + m.value(), flush=False)
        tx.p.send_offsets_to_transaction([TopicPartition(src, 0, msgs[-1].offset() + 1)],
                                         c.consumer_group_metadata(), 30)
        assert tx.p.flush(30) == 0
        assert group_offset(b, group, src) == before, "the offset moved before the transaction ended"
        end()

    before = -1001
    transform(take(4), tx.commit)
    assert group_offset(b, group, src) == 4
    before = 4
    transform(take(3), tx.abort)
    assert group_offset(b, group, src) == 4, "an aborted transaction moved the group's offset"
    c.seek(TopicPartition(src, 0, 4))  # what an exactly-once application does after an abort
    transform(take(6), tx.commit)
    assert group_offset(b, group, src) == 10

    outs = seen("confluent", b, out, 0, 10, COMMITTED)
    assert [v for _, v in outs] == [f"OUT:in-{i}".encode() for i in range(10)]
    everything = seen("confluent", b, out, 0, 13, UNCOMMITTED)
    assert [v for _, v in everything] == [f"OUT:in-{i}".encode() for i in [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9]]


def fenced(e):
    """Whether a confluent-kafka error says the producer was fenced."""
    err = e.args[0]
    return err.fatal() and err.name() in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"), err


def test_an_open_transaction_is_aborted_when_the_broker_restarts(kafka):
    node = kafka.node()
    b = node.bootstrap
    topic, tid = unique("restart"), unique("tid-restart")
    create_topic(b, topic, 1)
    plain = Writer(b)
    plain.send(topic, 0, b"kept-0")
    tx = Writer(b, tid)
    tx.begin()
    tx.send(topic, 0, b"doomed-0", b"doomed-1")
    assert fetch_committed(node.kafka_port, topic, 0) == (1, 3, [])
    node.kill()
    tx.p.purge()
    node.start()
    b = node.bootstrap
    # The abort marker is written before the listener serves anyone.
    lso, hw, aborted = fetch_committed(node.kafka_port, topic, 0)
    assert (lso, hw) == (4, 4) and [first for _, first in aborted] == [1], (lso, hw, aborted)
    after = Writer(b)
    after.send(topic, 0, b"kept-1")
    assert seen("confluent", b, topic, 0, 2, COMMITTED) == [(0, b"kept-0"), (4, b"kept-1")]
    assert seen("kafka-python", b, topic, 0, 2, COMMITTED) == [(0, b"kept-0"), (4, b"kept-1")]
    assert seen("confluent", b, topic, 0, 4, UNCOMMITTED) == [(0, b"kept-0"), (1, b"doomed-0"), (2, b"doomed-1"),
                                                              (4, b"kept-1")]
    # The id is usable again.
    again = Writer(b, tid)
    again.begin()
    again.send(topic, 0, b"new-txn")
    again.commit()
    assert seen("confluent", b, topic, 0, 3, COMMITTED)[-1] == (again.at[b"new-txn"][1], b"new-txn")


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(kafka):
    from confluent_kafka import KafkaException
    node = kafka.node()
    b = node.bootstrap
    topic = unique("timeout")
    create_topic(b, topic, 1)
    mark = node.log_mark()
    tx = Writer(b, unique("tid-timeout"), **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    tx.begin()
    tx.send(topic, 0, b"late-0", b"late-1")
    assert fetch_committed(node.kafka_port, topic, 0)[:2] == (0, 2)
    node.wait_log("a transaction passed its timeout and was aborted", 30, since=mark)
    wait_until(lambda: fetch_committed(node.kafka_port, topic, 0)[:2] == (3, 3), 30, what="the abort marker")
    with pytest.raises(KafkaException) as e:
        tx.commit()
    assert fenced(e.value)
    Writer(b).send(topic, 0, b"plain")
    assert seen("confluent", b, topic, 0, 1, COMMITTED) == [(3, b"plain")]
    assert seen("aiokafka", b, topic, 0, 1, COMMITTED) == [(3, b"plain")]


def test_a_second_producer_with_the_same_id_fences_the_first(kafka):
    from confluent_kafka import KafkaException
    node = kafka.node()
    b = node.bootstrap
    topic, tid = unique("fence"), unique("tid-fence")
    create_topic(b, topic, 1)
    old = Writer(b, tid)
    old.begin()
    old.send(topic, 0, b"old-0")
    new = Writer(b, tid)  # InitProducerId: a new epoch; the old one's transaction is aborted
    new.begin()
    new.send(topic, 0, b"new-0")
    new.commit()
    with pytest.raises(KafkaException) as e:
        old.send(topic, 0, b"old-1", flush=False)
        old.commit()
    assert fenced(e.value)
    assert seen("confluent", b, topic, 0, 1, COMMITTED) == [(new.at[b"new-0"][1], b"new-0")]
    assert b"old-1" not in {v for _, v in seen("confluent", b, topic, 0, 2, UNCOMMITTED)}


def test_kafka_python_and_aiokafka_transactional_producers_commit_and_abort(kafka):
    node = kafka.node()
    b = node.bootstrap
    topic = unique("txn-py")
    create_topic(b, topic, 1)
    from kafka import KafkaProducer
    kp = KafkaProducer(bootstrap_servers=b, transactional_id=unique("tid-kp"))
    kafka.on_cleanup(lambda: kp.close(5))
    kp.init_transactions()
    kp.begin_transaction()
    kp.send(topic, value=b"kp-commit", partition=0)
    kp.commit_transaction()
    kp.begin_transaction()
    kp.send(topic, value=b"kp-abort", partition=0)
    kp.flush()
    kp.abort_transaction()

    async def aio():
        from aiokafka import AIOKafkaProducer
        p = AIOKafkaProducer(bootstrap_servers=b, transactional_id=unique("tid-aio"))
        await p.start()
        try:
            async with p.transaction():
                await (await p.send(topic, value=b"aio-commit", partition=0))
            await p.begin_transaction()
            await (await p.send(topic, value=b"aio-abort", partition=0))
            await p.abort_transaction()
        finally:
            await p.stop()
    asyncio.run(aio())
    from kafka_clients import Rec
    CLIENTS["kafka-python"].produce(b, [(topic, 0, Rec(None, b"last"))])

    for client in COMMITTED:
        assert [v for _, v in seen(client, b, topic, 0, 3, COMMITTED)] == [b"kp-commit", b"aio-commit", b"last"], client
    assert [v for _, v in seen("aiokafka", b, topic, 0, 5, UNCOMMITTED)] == [
        b"kp-commit", b"kp-abort", b"aio-commit", b"aio-abort", b"last"]
    assert watermarks(b, topic, [0])[0][1] == 9, "five records and four markers"


def test_list_offsets_latest_under_read_committed_is_the_last_stable_offset(kafka):
    from kafka import TopicPartition as KTP
    node = kafka.node()
    b = node.bootstrap
    topic = unique("lso-list")
    create_topic(b, topic, 1)
    Writer(b).send(topic, 0, b"plain")
    tx = Writer(b, unique("tid"))
    tx.begin()
    tx.send(topic, 0, b"open-0", b"open-1")
    assert fetch_committed(node.kafka_port, topic, 0)[:2] == (1, 3), "Fetch knows the last stable offset"
    kc = CLIENTS["kafka-python"].consumer(b, isolation_level="read_committed")
    kafka.on_cleanup(kc.close)
    ends = (lso_and_hw(b, topic, 0), kc.end_offsets([KTP(topic, 0)])[KTP(topic, 0)])
    tx.abort()
    assert ends == ((1, 3), 1), f"(confluent (committed, uncommitted), kafka-python committed): {ends}"



def test_a_long_polling_read_committed_consumer_never_gets_an_aborted_record(kafka):
    import threading

    from confluent_kafka import Consumer, TopicPartition
    node = kafka.node()
    b = node.bootstrap
    topic = unique("lso-race")
    create_topic(b, topic, 1)
    c = Consumer({"bootstrap.servers": b, "group.id": unique("g"), "isolation.level": "read_committed",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 500})
    c.assign([TopicPartition(topic, 0, 0)])
    got, stop = [], threading.Event()

    def consume():
        while not stop.is_set():
            m = c.poll(0.1)
            if m is not None and not m.error():
                got.append((m.offset(), m.value()))
        c.close()
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    kafka.on_cleanup(lambda: (stop.set(), t.join(10)))
    tx = Writer(b, unique("tid-race"))
    for i in range(60):  # the consumer waits at the end each time a transaction writes
        tx.begin()
        tx.send(topic, 0, f"aborted-{i}".encode())
        tx.abort()
    end = Writer(b)
    end.send(topic, 0, b"end")
    wait_until(lambda: any(v == b"end" for _, v in got), 30, what="the plain record")
    stop.set()
    t.join(10)
    leaked = [x for x in got if x[1] != b"end"]
    assert not leaked, f"{len(leaked)} of 60 aborted records reached a read_committed consumer, e.g. {leaked[:5]}"
    assert got == [(end.at[b"end"][1], b"end")]
