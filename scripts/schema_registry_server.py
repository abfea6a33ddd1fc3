"""An in-memory Confluent-compatible Schema Registry (scripts/schema-registry): the REST subset that Confluent's
serializers and hookline use. Listens on 127.0.0.1, port 0; prints {"url": ...} once it listens, then serves.

  POST /subjects/{subject}/versions   register {"schema", "schemaType"?, "references"?}: {"id"} (same schema, same id)
  POST /subjects/{subject}            look a schema up: its subject, version, id, schema
  GET  /schemas/ids/{id}              {"schema", "schemaType" (absent for AVRO), "references"?}, or 404 (40403)
  GET  /subjects/{subject}/versions/{version|latest}
  GET  /subjects/{subject}/versions, GET /subjects, GET /config, PUT /config[/{subject}]
"""

import base64
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LOCK = threading.Lock()
SCHEMAS = {}  # id -> {"schema", "schemaType", "references"}
BY_KEY = {}  # (schemaType, schema, references json) -> id
SUBJECTS = {}  # subject -> [id, ...] (version n is index n-1)
USER = os.environ.get("HOOKLINE_SCHEMA_REGISTRY_USER")
PASSWORD = os.environ.get("HOOKLINE_SCHEMA_REGISTRY_PASSWORD", "")


def _key(body):
    return (body.get("schemaType", "AVRO"), body["schema"], json.dumps(body.get("references") or [], sort_keys=True))


def _out(sid):
    s = SCHEMAS[sid]
    out = {"schema": s["schema"]}
    if s["schemaType"] != "AVRO":
        out["schemaType"] = s["schemaType"]
    if s["references"]:
        out["references"] = s["references"]
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        sys.stderr.write("%s\n" % (args,))

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _missing(self, what, code=40403):
        self._send(404, {"error_code": code, "message": what + " not found"})

    def _authorized(self):
        if USER is None:
            return True
        want = "Basic " + base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode()
        if self.headers.get("Authorization") == want:
            return True
        self._send(401, {"error_code": 401, "message": "Unauthorized"})
        return False

    def _parts(self):
        return [unquote(p) for p in urlparse(self.path).path.split("/") if p]

    def _version(self, subject, version):
        ids = SUBJECTS.get(subject)
        if not ids:
            return self._missing("Subject", 40401)
        n = len(ids) if version in ("latest", "-1") else int(version)
        if not 1 <= n <= len(ids):
            return self._missing("Version", 40402)
        sid = ids[n - 1]
        body = dict(_out(sid), subject=subject, version=n, id=sid)
        body.setdefault("schemaType", "AVRO")
        self._send(200, body)

    def do_GET(self):
        if not self._authorized():
            return
        p = self._parts()
        with LOCK:
            if len(p) == 3 and p[:2] == ["schemas", "ids"] and p[2].isdigit():
                sid = int(p[2])
                return self._send(200, _out(sid)) if sid in SCHEMAS else self._missing("Schema")
            if p == ["subjects"]:
                return self._send(200, sorted(SUBJECTS))
            if len(p) == 3 and p[0] == "subjects" and p[2] == "versions":
                return self._send(200, list(range(1, len(SUBJECTS.get(p[1], [])) + 1)))
            if len(p) == 4 and p[0] == "subjects" and p[2] == "versions":
                return self._version(p[1], p[3])
            if p[:1] == ["config"]:
                return self._send(200, {"compatibilityLevel": "NONE"})
        self._missing("Path", 404)

    def do_PUT(self):
        if not self._authorized():
            return
        length = int(self.headers.get("Content-Length") or 0)
        self._send(200, json.loads(self.rfile.read(length) or b"{}"))

    def do_POST(self):
        if not self._authorized():
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        p = self._parts()
        with LOCK:
            if len(p) == 3 and p[0] == "subjects" and p[2] == "versions":
                key = _key(body)
                sid = BY_KEY.get(key)
                if sid is None:
                    sid = len(SCHEMAS) + 1
                    SCHEMAS[sid] = {"schema": body["schema"], "schemaType": key[0], "references": body.get("references") or []}
                    BY_KEY[key] = sid
                ids = SUBJECTS.setdefault(p[1], [])
                if sid not in ids:
                    ids.append(sid)
                return self._send(200, {"id": sid, "subject": p[1], "version": ids.index(sid) + 1, "schema": body["schema"], "schemaType": key[0]})
            if len(p) == 2 and p[0] == "subjects":
                sid = BY_KEY.get(_key(body))
                ids = SUBJECTS.get(p[1], [])
                if sid is None or sid not in ids:
                    return self._missing("Schema")
                return self._send(200, dict(_out(sid), subject=p[1], version=ids.index(sid) + 1, id=sid))
        self._missing("Path", 404)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(json.dumps({"url": "http://127.0.0.1:%d" % server.server_address[1]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
