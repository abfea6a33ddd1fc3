"""Frames events with Confluent's own Schema Registry serializers (confluent-kafka's AvroSerializer, JSONSerializer,
ProtobufSerializer), registering their schemas in the registry at argv[1] as a Kafka producer of topic argv[2]
would. Reads one JSON line per event on stdin: {"format": "avro"|"json"|"protobuf", "event": {...}}; writes one
JSON line per event: {"hex": the framed value}. Used by tests/integration/schema_registry.rs."""

import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

AVRO = json.dumps({
    "type": "record", "name": "OrderEvent", "namespace": "com.acme",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "type", "type": "string"},
        {"name": "occurred_at", "type": ["null", "long"], "default": None},
        {"name": "data", "type": {"type": "record", "name": "Order", "fields": [
            {"name": "total", "type": "long"},
            {"name": "note", "type": ["null", "string"], "default": None},
        ]}},
    ],
})

JSON_SCHEMA = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "OrderEvent", "type": "object",
    "properties": {"id": {"type": "string"}, "type": {"type": "string"}, "data": {"type": "object"}},
    "required": ["id", "type"],
})


def protobuf_class():
    """acme.v1.OrderEvent { string id = 1; string type = 2; int64 occurred_at = 3; Order data = 4; } with Order
    { int64 total = 1; string note = 2; }, built from a descriptor (no protoc needed)."""
    f = descriptor_pb2.FileDescriptorProto(name="acme/order.proto", package="acme.v1", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    order = f.message_type.add(name="Order")
    order.field.add(name="total", number=1, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    order.field.add(name="note", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    ev = f.message_type.add(name="OrderEvent")
    ev.field.add(name="id", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    ev.field.add(name="type", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    ev.field.add(name="occurred_at", number=3, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    ev.field.add(name="data", number=4, type=T.TYPE_MESSAGE, type_name=".acme.v1.Order", label=T.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.v1.OrderEvent"))


def main():
    client = SchemaRegistryClient({"url": sys.argv[1]})
    ctx = SerializationContext(sys.argv[2], MessageField.VALUE)
    OrderEvent = protobuf_class()
    serializers = {
        "avro": AvroSerializer(client, AVRO),
        "json": JSONSerializer(JSON_SCHEMA, client),
        "protobuf": ProtobufSerializer(OrderEvent, client, {"use.deprecated.format": False}),
    }
    for line in sys.stdin:
        spec = json.loads(line)
        event = spec["event"]
        if spec["format"] == "protobuf":
            msg = OrderEvent(id=event["id"], type=event["type"], occurred_at=event.get("occurred_at") or 0)
            msg.data.total = event["data"]["total"]
            msg.data.note = event["data"].get("note") or ""
            event = msg
        value = serializers[spec["format"]](event, ctx)
        print(json.dumps({"hex": value.hex()}), flush=True)


if __name__ == "__main__":
    main()
