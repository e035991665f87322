"""A real `silt serve` per test: temporary data directory, ephemeral MQTT port, stopped by PID."""

import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time

import paho.mqtt.client as mqtt
import pytest

SILT_BIN = os.environ.get("SILT_BIN", "target/debug/silt")


class Silt:
    def __init__(self, data_dir, extra_args=()):
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [SILT_BIN, "serve", "--mqtt", "127.0.0.1:0", "--data-dir", data_dir, *extra_args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.log = []
        ready = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"mqtt=127\.0\.0\.1:(\d+)", line)
                if m and "silt is running" in line:
                    self.port = int(m.group(1))
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60):
            self.proc.kill()
            raise RuntimeError("silt did not start:\n" + "".join(self.log))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, "".join(self.log)

    def kill(self):
        self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory() as d:
        yield d


@pytest.fixture
def silt(data_dir):
    s = Silt(data_dir)
    yield s
    if s.proc.poll() is None:
        s.kill()


class Client:
    """A paho client that records what it receives."""

    def __init__(self, silt, client_id="", protocol=mqtt.MQTTv5, clean=True, properties=None, will=None,
                 username=None, password=None):
        self.messages = queue.Queue()
        self.disconnects = queue.Queue()
        self.connack = queue.Queue()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                             clean_session=None if protocol == mqtt.MQTTv5 else clean)
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        self.c.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.published = queue.Queue()
        self.c.on_publish = lambda c, u, mid, rc, props: self.published.put((mid, rc))
        self.subacks = queue.Queue()
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.put(rcs)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        if username is not None:
            self.c.username_pw_set(username, password)
        if will:
            self.c.will_set(**will)
        kwargs = {"clean_start": clean, "properties": properties} if protocol == mqtt.MQTTv5 else {}
        self.c.connect("127.0.0.1", silt.port, keepalive=30, **kwargs)
        self.c.loop_start()
        self.flags, self.rc, self.props = self.connack.get(timeout=10)

    def get(self, timeout=10):
        return self.messages.get(timeout=timeout)

    def none(self, wait=0.5):
        time.sleep(wait)
        return self.messages.empty()

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()

    def drop(self):
        """Ends the TCP connection without DISCONNECT (an abnormal close)."""
        self.c.loop_stop()
        self.c.socket().close()
