"""What an operator does to a Kafka cluster with Confluent's admin client, for the Apache Kafka tests.

    kafka_admin.py grant BOOTSTRAP USER PASSWORD ACLS_JSON
        creates (or updates) SCRAM-SHA-512 user USER and grants it ACLS_JSON, a list of [resource, name, operation]
        with resource `topic` or `group` and operation `read`, `write` or `describe`, each a literal ALLOW for
        User:USER from any host
    kafka_admin.py delete-records BOOTSTRAP TOPIC PARTITION BEFORE_OFFSET
        deletes the partition's records below BEFORE_OFFSET, as retention would; prints the new earliest offset

BOOTSTRAP is a listener where the caller is a super user (scripts/kafka's PLAINTEXT).
"""

import json
import sys

from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)


def grant(admin, user, password, acls):
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode())
    for f in admin.alter_user_scram_credentials([upsert]).values():
        f.result(30)
    kinds = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}
    ops = {"read": AclOperation.READ, "write": AclOperation.WRITE, "describe": AclOperation.DESCRIBE}
    bindings = [
        AclBinding(kinds[kind], name, ResourcePatternType.LITERAL, f"User:{user}", "*", ops[op], AclPermissionType.ALLOW)
        for kind, name, op in acls
    ]
    if bindings:
        for f in admin.create_acls(bindings).values():
            f.result(30)
    print("granted", len(bindings), flush=True)


def delete_records(admin, topic, partition, before):
    for f in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        deleted = f.result(30)
    print("earliest", deleted.low_watermark, flush=True)


if __name__ == "__main__":
    admin = AdminClient({"bootstrap.servers": sys.argv[2]})
    if sys.argv[1] == "grant":
        grant(admin, sys.argv[3], sys.argv[4], json.loads(sys.argv[5]))
    else:
        delete_records(admin, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
