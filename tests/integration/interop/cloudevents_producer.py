"""Publishes CloudEvents to hookline with the official CloudEvents SDK, as a producer in a Kafka shop would.

    cloudevents_producer.py kafka BOOTSTRAP TOPIC   # Kafka binding, through confluent-kafka
    cloudevents_producer.py http URL TOKEN          # HTTP binding, POST URL (hookline's /v1/events)

Every event is the SDK's own rendering (binary or structured mode); the script prints one line per event sent
(`sent <id> <mode>` or, for HTTP, `sent <id> <mode> <status> <body>`).
"""

import sys
import urllib.request
from datetime import datetime, timezone

from cloudevents.core.bindings import http, kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v03.event import CloudEvent as CloudEvent03
from cloudevents.core.v1.event import CloudEvent

FMT = JSONFormat()
TIME = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)


def event(id_, region, data, **extra):
    attributes = {
        "id": id_,
        "type": "com.example.order.created",
        "source": "/shop/orders",
        "subject": f"order/{id_}",
        "time": TIME,
        "datacontenttype": "application/json",
        "tenant": "acme",
        "region": region,
        "partitionkey": "cust-7",
    }
    attributes.update(extra)
    return CloudEvent(attributes=attributes, data=data)


# In order, all with the partition key cust-7 (one events partition): the last one tells the test that every
# earlier one was read.
def events():
    yield "binary", event("ce-1", "eu", {"total": 12, "currency": "EUR"})
    yield "structured", event("ce-2", "eu", {"total": 5})
    # Filtered out by the subscription (region).
    yield "binary", event("ce-3", "us", {"total": 1})
    # No data: a tombstone in the Kafka binding, ignored.
    yield "binary", event("ce-4", "eu", None)
    # CloudEvents 0.3: not read, dead-lettered.
    yield "binary", CloudEvent03(
        attributes={"id": "ce-5", "type": "com.example.order.created", "source": "/shop/orders", "partitionkey": "cust-7"},
        data={"total": 3},
    )
    yield "text", event("ce-6", "eu", "plain words", datacontenttype="text/plain")
    yield "binary", event("ce-9", "eu", {"last": True})


def to_kafka(bootstrap, topic):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for mode, ev in events():
        msg = kafka.to_structured(ev, FMT) if mode == "structured" else kafka.to_binary(ev, FMT)
        # The SDK writes no data as an empty value; on Kafka a CloudEvent without data is a null value (a tombstone).
        value = msg.value if msg.value else None
        producer.produce(topic, key=msg.key, value=value, headers=list(msg.headers.items()))
        producer.flush(30)
        print("sent", ev.get_id(), mode, flush=True)


def to_http(url, token):
    for mode, ev in events():
        msg = http.to_structured(ev, FMT) if mode == "structured" else http.to_binary(ev, FMT)
        headers = dict(msg.headers)
        headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(url, data=msg.body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, body = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode()
        print("sent", ev.get_id(), mode, status, body.replace("\n", " "), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "kafka":
        to_kafka(sys.argv[2], sys.argv[3])
    else:
        to_http(sys.argv[2], sys.argv[3])
