"""A webhook receiver: verifies each delivery's signature with standardwebhooks and prints the event.

    WEBHOOK_SECRET=whsec_... .venv/bin/flask --app examples/webhook_receiver run --port 9000
"""

import os

from flask import Flask, request
from standardwebhooks import Webhook, WebhookVerificationError

app = Flask(__name__)
webhook = Webhook(os.environ["WEBHOOK_SECRET"])


@app.post("/hooks/leadsvc")
def receive():
    try:
        event = webhook.verify(request.get_data(), request.headers)
    except WebhookVerificationError:
        return "", 400
    # Delivery is at least once: a receiver that must not act twice remembers webhook-id.
    print(request.headers["webhook-id"], event["type"], event["data"].get("lead", {}).get("id"), flush=True)
    return "", 204
