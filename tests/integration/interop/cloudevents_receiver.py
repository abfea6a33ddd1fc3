"""A CloudEvents webhook receiver built on the official SDKs, for tests/integration/cloudevents_out.rs.

Every POST is parsed by the CloudEvents SDK (binary or structured mode, as the request says) and its Standard
Webhooks signature checked with the `standardwebhooks` library against the raw body. Every OPTIONS is answered as
the CloudEvents web hooks spec (section 4, abuse protection) describes, by path:

  /ok/...          2xx, WebHook-Allowed-Origin: <the origin asked for>, WebHook-Allowed-Rate: 60 when a rate was
                   asked for (a grant below it), else *
  /other-origin/.. 2xx granting another origin (someone-else.example)
  anything else    2xx without any WebHook-* header: handles OPTIONS, grants nothing

Prints the port it listens on (127.0.0.1, port 0), then one JSON line per request it handled.

usage: cloudevents_receiver.py WHSEC_SECRET
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock

from cloudevents.core.bindings import http as ce_http
from standardwebhooks.webhooks import Webhook

SECRET = sys.argv[1]
OUT = Lock()


def emit(record):
    with OUT:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_OPTIONS(self):
        origin = self.headers.get("WebHook-Request-Origin")
        rate = self.headers.get("WebHook-Request-Rate")
        emit({"method": "OPTIONS", "path": self.path, "origin": origin, "rate": rate})
        if self.path.startswith("/ok"):
            grant = [("WebHook-Allowed-Origin", origin), ("WebHook-Allowed-Rate", "60" if rate else "*")]
        elif self.path.startswith("/other-origin"):
            grant = [("WebHook-Allowed-Origin", "someone-else.example")]
        else:
            grant = []
        self.reply(200, [("Allow", "POST, OPTIONS")] + grant)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {name.lower(): value for name, value in self.headers.items()}
        record = {
            "method": "POST",
            "path": self.path,
            "origin": headers.get("origin"),
            # As sent, before the SDK decodes them (it also fills in a missing time with its own clock).
            "ce_headers": {k: v for k, v in headers.items() if k.startswith("ce-")},
        }
        try:
            Webhook(SECRET).verify(body, headers, json_parse=False)
            record["signature"] = "verified"
        except Exception as e:  # the test asserts on what failed
            record["signature"] = f"{type(e).__name__}: {e}"
        try:
            event = ce_http.from_http_event(ce_http.HTTPMessage(headers=headers, body=body))
            time = event.get_time()
            record["event"] = {
                "specversion": event.get_specversion(),
                "id": event.get_id(),
                "type": event.get_type(),
                "source": event.get_source(),
                "time": time.isoformat() if time else None,
                "subject": event.get_subject(),
                "datacontenttype": event.get_datacontenttype(),
                "dataschema": event.get_dataschema(),
                "data": event.get_data(),
                "extensions": {
                    k: v
                    for k, v in event.get_attributes().items()
                    if k not in ("specversion", "id", "type", "source", "time", "subject", "datacontenttype", "dataschema")
                },
            }
            status = 204
        except Exception as e:
            record["error"] = f"{type(e).__name__}: {e}"
            status = 400
        emit(record)
        self.reply(status)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
