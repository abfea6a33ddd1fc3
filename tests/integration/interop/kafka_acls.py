"""Creates a SCRAM-SHA-512 user and its ACLs on a Kafka cluster with Confluent's admin client, as an operator would.

    kafka_acls.py BOOTSTRAP USER PASSWORD ACLS_JSON

BOOTSTRAP is a listener where the caller is a super user (scripts/kafka's PLAINTEXT); ACLS_JSON is a list of
[resource, name, operation] with resource `topic` or `group` and operation `read`, `write` or `describe`, each
granted as a literal ALLOW for User:USER from any host.
"""

import json
import sys

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

bootstrap, user, password, acls = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
admin = AdminClient({"bootstrap.servers": bootstrap})
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
