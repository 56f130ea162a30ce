"""The foreign clients of deploy/smoke: a receiver that verifies every webhook with the
Standard Webhooks reference library, and a producer that publishes with pika, as a team's own
service would. Nothing here is hookrelay's code.

    python3 deploy/smoke.py receive PORT SECRET OUT     serve until killed; a JSON line per request to OUT
    python3 deploy/smoke.py publish AMQP_URL EXCHANGE TENANT N
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def receive(port, secret, out):
    from standardwebhooks.webhooks import Webhook

    hook = Webhook(secret)
    log = open(out, "a", buffering=1)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                hook.verify(body, headers)
                verified = True
            except Exception:  # a wrong signature is a finding, not a crash
                verified = False
            log.write(
                json.dumps(
                    {
                        "id": headers.get("webhook-id"),
                        "idempotency_key": headers.get("idempotency-key"),
                        "verified": verified,
                        "at": time.time(),
                    }
                )
                + "\n"
            )
            self.send_response(200 if verified else 400)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("0.0.0.0", int(port)), Handler).serve_forever()


def publish(url, exchange, tenant, n):
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(int(n)):
        channel.basic_publish(
            exchange=exchange,
            routing_key=tenant,
            body=json.dumps({"order": i, "total": "12.50"}).encode(),
            properties=pika.BasicProperties(
                message_id=f"evt_smoke_{i:04d}",
                type="order.paid",
                content_type="application/json",
                delivery_mode=2,
                timestamp=int(time.time()),
            ),
            mandatory=True,
        )
    connection.close()


if __name__ == "__main__":
    {"receive": receive, "publish": publish}[sys.argv[1]](*sys.argv[2:])
