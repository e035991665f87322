"""A Kafka consumer behind the local disk: with a 1 MiB hot cache, sealed segments are uploaded
to the bucket (SeaweedFS) and evicted locally; a consumer reading from offset 0 then gets every
record byte for byte through the cold-read path (ranged GETs, counted in
`$SYS/broker/tiering/gets`).

Knob: SILT_KAFKA_COLD_MB (megabytes produced, default 12).
"""

import os
import random
import time
from pathlib import Path

import pytest

pytest.register_assert_rewrite("kafka_harness", "kafka_clients", "kafka_wire")

from kafka_clients import CLIENTS, MiB, Rec  # noqa: E402
from kafka_harness import wait_until  # noqa: E402
from tiering_harness import SysMonitor  # noqa: E402

pytest_plugins = ["kafka_harness"]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def local_bytes(data_dir):
    """Bytes of the node's own files, the index aside."""
    return sum(p.stat().st_size for p in Path(data_dir).rglob("*")
               if p.is_file() and "index" not in p.relative_to(data_dir).parts[:1]
               and "objects" not in p.relative_to(data_dir).parts[:1])


def test_a_consumer_reads_evicted_segments_from_the_bucket(kafka):
    mb = int(os.environ.get("SILT_KAFKA_COLD_MB", "12"))
    config = kafka.config(storage={"segment_bytes": MiB, "segment_max_age_ms": 1000, "tail_cache_bytes": MiB},
                          mqtt={"sys_interval_secs": 1}, tiering={"hot_cache_bytes": MiB},
                          topics=[{"match": "cold/#", "partitions": 3}])
    node = kafka.s3_node(config=config)
    mon = SysMonitor(node)
    kafka.on_cleanup(mon.close)

    rnd = random.Random(8)
    size = 16 * 1024
    recs = [Rec(f"k{i}".encode(), rnd.randbytes(size), (("i", str(i).encode()),)) for i in range(mb * MiB // size)]
    acks = CLIENTS["confluent"].produce(node.bootstrap, [("cold", i % 3, r) for i, r in enumerate(recs)], codec="none")

    mon.wait("upload_lag_bytes", lambda v: v == 0, 120, since=time.monotonic() + 3)
    produced = len(recs) * size
    wait_until(lambda: local_bytes(node.data_dir) < produced // 2, 60, interval=1,
               what=f"eviction (local data {local_bytes(node.data_dir)} bytes of {produced} produced)")
    gets_before = mon.latest("gets") or 0

    wants = {("cold", p): (0, sum(1 for a in acks if a[0] == p)) for p in range(3)}
    got = CLIENTS["kafka-python"].consume(node.bootstrap, wants, timeout=180)
    at = {(g.partition, g.offset): g for recs_ in got.values() for g in recs_}
    for r, pos in zip(recs, acks):
        g = at.get(pos)
        assert g is not None, f"{r.key!r}: nothing at {pos}"
        assert (g.key, g.value, g.headers) == (r.key, r.value, r.headers), f"{r.key!r} at {pos} differs"
    drained = time.monotonic()
    gets = mon.wait("gets", lambda v: v > gets_before, 30, since=drained)
    print(f"gets {gets_before:.0f} -> {gets:.0f}, cache hit ratio {mon.latest('cache_hit_ratio')}")
