"""Processes for the Kafka end-to-end tests, on top of the tiering harness (`SiltNode`,
`SeaweedFS`, `MqttClient`, reused by import):

- `KafkaNode`: a `silt serve` with `--kafka 127.0.0.1:0` (or a given address); its Kafka port
  is read from the `kafka listener bound addr=...` line.
- `Mqtt5`: the harness's paho MQTT 5 client, with publishes that carry properties.
- `KafkaWorld` (fixture `kafka`): a temporary folder, the nodes, clients and SeaweedFS a test
  starts, all stopped by PID at teardown, with the nodes' log tails printed (pytest shows them
  when a test failed). At teardown it also fails a test whose broker closed a Kafka connection
  or panicked when the test did not say it expects that (`world.expect_closed_connections()`):
  a client that sent something the broker does not serve (a group join, InitProducerId) shows
  up there even when the client itself hides it.

Test modules load the fixture with `pytest_plugins = ["kafka_harness"]` (no conftest.py, for
the reason tiering_harness gives).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiering"))
pytest.register_assert_rewrite("tiering_harness")

from tiering_harness import (  # noqa: E402
    SESSION_FOREVER, MqttClient, SeaweedFS, SiltNode, is_success, tail, wait_until, write_config,
)
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402

__all__ = ["SESSION_FOREVER", "KafkaNode", "KafkaWorld", "Mqtt5", "is_success", "mqtt_properties", "unique",
           "wait_until"]

CLOSED_LINE = "kafka connection closed"
# Lines no test expects: a panic, or a response the broker could not encode.
BAD_LINES = re.compile(r"panicked|a kafka response failed to encode|fetch read task failed|list offsets task failed")


class KafkaNode(SiltNode):
    """A silt node with its Kafka listener on `kafka_listen` (default: a free loopback port)."""

    def __init__(self, *args, kafka_listen="127.0.0.1:0", **kw):
        super().__init__(*args, **kw)
        self.kafka_listen = kafka_listen
        self.kafka_port = None
        self.starts = []  # log index at each start


    def start(self, timeout=120):
        mark = self.log_mark()
        self.starts.append(mark)
        super().start(timeout)
        with self._log_lock:
            lines = self.log[mark:]
        # `kafka listener bound [kind=...] addr=...`: the plain TCP one (no kind, or kind tcp).
        self.kafka_ports = {}
        for line in lines:
            m = re.search(r'kafka listener bound (?:kind="?(\w+)"? )?addr=127\.0\.0\.1:(\d+)', line)
            if m:
                self.kafka_ports[m.group(1) or "tcp"] = int(m.group(2))
        if "tcp" not in self.kafka_ports:
            raise RuntimeError(f"silt {self.name}: no 'kafka listener bound' line:\n{self.log_tail()}")
        self.kafka_port = self.kafka_ports["tcp"]
        return self

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.kafka_port}"

    def lines(self, pattern, since=0):
        rx = re.compile(pattern)
        with self._log_lock:
            return [line for line in self.log[since:] if rx.search(line)]


def mqtt_properties(user=(), content_type=None, response_topic=None, correlation_data=None):
    p = Properties(PacketTypes.PUBLISH)
    if user:
        p.UserProperty = list(user)
    if content_type is not None:
        p.ContentType = content_type
    if response_topic is not None:
        p.ResponseTopic = response_topic
    if correlation_data is not None:
        p.CorrelationData = correlation_data
    return p


class Mqtt5(MqttClient):
    """`MqttClient` whose QoS 1 publishes may carry PUBLISH properties."""

    def publish_with(self, topic, payload, properties, retain=False, timeout=30):
        """One QoS 1 publish with `properties`; returns the PUBACK reason code."""
        info = self.c.publish(topic, payload, qos=1, retain=retain, properties=properties)
        assert info.rc == 0, f"publish refused locally: {info.rc}"
        tok = next(self._tokens)
        self._pending[info.mid] = tok
        self.submit_times[tok] = time.monotonic()
        return self.wait_acks([tok], timeout)[tok]


class KafkaWorld:
    """One test's processes and clients (see the module docs)."""

    def __init__(self, base, test_name):
        self.base = Path(base)
        self.test_name = test_name
        self.nodes = []
        self.closers = []
        self.s3 = None
        self.prefix = f"k/{re.sub(r'[^A-Za-z0-9_-]+', '-', test_name)[:40]}-{uuid.uuid4().hex[:8]}"
        self.allowed_closes = False

    def expect_closed_connections(self):
        """This test makes the broker close Kafka connections on purpose."""
        self.allowed_closes = True

    def config(self, name="silt.toml", topics=(), **sections):
        """A config file (see tiering_harness.write_config); `[mqtt] sys_interval_secs = 0` unless
        given, so no `$SYS` records land in the log between a test's own."""
        sections.setdefault("mqtt", {}).setdefault("sys_interval_secs", 0)
        return write_config(self.base / name, topics=topics, **sections)

    def data_dir(self, name):
        return self.base / f"data-{name}"

    def node(self, name="a", config=None, data_dir=None, object_store=None, start=True,
             kafka_listen="127.0.0.1:0", env=None):
        if config is None:
            config = self.config(f"{name}.toml")
        n = KafkaNode(name, data_dir or self.data_dir(name), config=config, object_store=object_store,
                      env=env, log_dir=self.base, kafka_listen=kafka_listen)
        self.nodes.append(n)
        if start:
            n.start()
        return n

    def seaweedfs(self):
        """SeaweedFS with a bucket (started once per test)."""
        if self.s3 is None:
            self.s3 = SeaweedFS(self.base / "weed")
            self.s3.start()
        return self.s3

    def s3_node(self, name="a", config=None, data_dir=None, start=True):
        """A node whose object store is this test's prefix in the SeaweedFS bucket."""
        s3 = self.seaweedfs()
        return self.node(name, config=config, data_dir=data_dir, object_store=s3.url(self.prefix),
                         env=s3.env(), start=start)

    def wipe(self, node):
        assert not node.running
        shutil.rmtree(node.data_dir, ignore_errors=True)
        assert not node.data_dir.exists()

    def on_cleanup(self, fn):
        self.closers.append(fn)
        return fn

    def mqtt(self, node, client_id="", **kw):
        c = Mqtt5(node.port, client_id, **kw)
        self.on_cleanup(c.close)
        return c

    def unexpected_lines(self):
        out = []
        for n in self.nodes:
            for line in n.lines(".*"):
                if BAD_LINES.search(line) or (CLOSED_LINE in line and not self.allowed_closes):
                    out.append(f"{n.name}: {line.rstrip()}")
        return out

    def cleanup(self):
        for fn in reversed(self.closers):
            try:
                fn()
            except Exception:
                pass
        for n in self.nodes:
            if n.proc is not None:
                n.kill()
        if self.s3 is not None:
            self.s3.stop(10)

    def report(self):
        for n in self.nodes:
            print(f"\n---- silt {n.name} (kafka {n.kafka_port}, mqtt {n.port}) log tail ----\n{tail(n.log_path, 80)}")
        if self.s3 is not None:
            print(f"\n---- weed log tail ----\n{tail(self.s3.log_path, 30)}")


@pytest.fixture
def kafka(request):
    with tempfile.TemporaryDirectory(prefix="silt-kafka-") as d:
        w = KafkaWorld(d, request.node.name)
        try:
            yield w
        finally:
            w.cleanup()
            w.report()
        # An xfail test's own assertions say what it expects of the broker.
        bad = [] if request.node.get_closest_marker("xfail") else w.unexpected_lines()
        assert not bad, "the broker logged what no client should cause:\n" + "\n".join(bad[:20])


def unique(prefix):
    """A Kafka topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"

