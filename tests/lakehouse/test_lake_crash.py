"""Exactly once across crashes (issue 10): silt is killed (-9) while it writes the table under
load, restarted on the same disk, killed again, and restarted on an EMPTY data directory from the
same bucket; the table then holds every record of the stream exactly once, at the record's own
(stream, partition, offset), and so every acknowledged message.

The topics use `ack = "object"`, so an acknowledged message is in the bucket and survives the
empty disk; a message in flight at a kill may or may not be in the stream, but if it is, it is
in the table once, and if it is not, no row holds it.
"""

import itertools
import json

import pytest

pytest.register_assert_rewrite("lakehouse_harness")

from lakehouse_harness import (  # noqa: E402
    Closed, Sent, assert_no_problems, background, check_rows, wait_until,
)

pytest_plugins = ["lakehouse_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARTITIONS = 2
COLUMNS = {"n": "long"}


def config(lake):
    return lake.config(
        topic_defaults={"partitions": PARTITIONS},
        tiering={"object_ack_window_ms": 50},
        topics=[{"match": "meter/#", "ack": "object", "lakehouse": "iceberg", "commit_interval_ms": 500,
                 "columns": COLUMNS}])


class Messages:
    def __init__(self):
        self.n = itertools.count()
        self.all = []

    def make(self, count, phase):
        out = []
        for _ in range(count):
            k = next(self.n)
            payload = json.dumps({"n": k, "phase": phase, "pad": "x" * (k % 200)}).encode()
            out.append(Sent(f"meter/m{k % 20}", payload, want={"n": k}))
        self.all += out
        return out


def load_until_killed(lake, node, msgs, phase, min_acked, min_commits):
    """Publishes `msgs` from a thread and kills silt (-9) once this start made `min_commits`
    commits and `min_acked` messages were acknowledged. Returns the acknowledged ones."""
    mark = node.log_mark()
    pub = lake.publisher(node, f"meter-{phase}")
    thread, errors = background(lambda: pub.send(msgs, window=100), f"publisher-{phase}")
    node.wait_commits("meter", min_commits, 120, since=mark)
    wait_until(lambda: len(pub.acked_msgs) >= min_acked or not thread.is_alive(), 120,
               what=f"{min_acked} acknowledged publishes")
    assert thread.is_alive(), f"phase {phase}: the publisher finished before the kill ({errors})"
    node.kill()
    thread.join(60)
    assert not thread.is_alive(), "the publisher did not notice the kill"
    assert len(errors) == 1 and isinstance(errors[0], Closed), f"phase {phase}: publisher ended with {errors}"
    print(f"phase {phase}: killed after {len(pub.acked_msgs)} acknowledged of {pub.sent_upto} sent")
    return list(pub.acked_msgs)


def test_kill9_while_writing_and_an_empty_disk_keep_every_message_exactly_once(lake):
    node = lake.node(config=config(lake))
    m = Messages()
    acked = load_until_killed(lake, node, m.make(30_000, "a"), "a", min_acked=1500, min_commits=2)

    node.start()  # the same data directory
    acked += load_until_killed(lake, node, m.make(30_000, "b"), "b", min_acked=1500, min_commits=2)

    lake.wipe(node)
    node.start()  # an empty data directory: the stream and the table come from the bucket
    last = m.make(1000, "c")
    codes = lake.publisher(node, "meter-c").send(last)
    assert all(rc == 0 for rc in codes.values()), set(codes.values())
    acked += last

    kafka = lake.kafka_records(node, "meter", PARTITIONS)
    in_stream = {g.value for g in kafka.values()}
    lost = [s for s in acked if s.payload not in in_stream]
    assert not lost, (f"{len(lost)} acknowledged messages are not in the recovered stream (a tiering loss, "
                      f"not the table's), e.g. {[s.payload[:40] for s in lost[:3]]}")
    index = {s.payload: s for s in m.all}
    stream_msgs = [index[v] for v in in_stream]
    others = [s for s in m.all if s.payload not in in_stream]

    table = lake.embedded("meter")
    table.wait_count(len(stream_msgs), 120, node)
    for reader, rows in (("DuckDB", table.duck_rows()), ("pyiceberg", table.py_rows())):
        assert_no_problems(check_rows(rows, stream_msgs, may=others, partitions=PARTITIONS, kafka=kafka,
                                      columns=tuple(COLUMNS), reader=reader))
        assert len(rows) == len(stream_msgs), f"{reader}: {len(rows)} rows, the stream has {len(stream_msgs)} records"
    ends = {}
    for s, p, o in kafka:
        ends[f"{s}/{p}"] = max(ends.get(f"{s}/{p}", 0), o + 1)
    assert json.loads(table.summary()["silt.offsets"]) == ends
