"""Issue 23 item 16: a delivery is remembered long enough for late redeliveries and replays of its signed body
(30 days by default, ``TORCHREVIEW_DELIVERY_TTL_DAYS``), through real HTTP into the webhook and real Redis."""
from __future__ import annotations

import json
import threading

import pytest
import requests
from werkzeug.serving import make_server

from bot.settings import Settings, SettingsError
from bot.webhook import create_app
from tests.conftest import WEBHOOK_SECRET, payload, signed_headers

DAY = 24 * 3600


def serve(settings):
    server = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}{settings.webhook_path}"


@pytest.mark.parametrize("env, days", [({}, 30), ({"TORCHREVIEW_DELIVERY_TTL_DAYS": "90"}, 90)])
def test_deliveries_are_remembered_for_the_configured_days(redis_url, redis_client, tmp_path, env, days):
    settings = Settings.from_env({"GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET, "REDIS_URL": redis_url,
                                  "TORCHREVIEW_DATA_DIR": str(tmp_path), **env}, require_github=False, role="web")
    server, url = serve(settings)
    try:
        body = json.dumps(payload("pull_request.opened")).encode()
        headers = signed_headers(body, "pull_request", delivery="2e5f8a10-0000-4000-8000-000000000023")
        assert requests.post(url, data=body, headers=headers, timeout=10).status_code == 202
        for key in ("torchreview:delivery:2e5f8a10-0000-4000-8000-000000000023",
                    *[k.decode() for k in redis_client.scan_iter(match="torchreview:delivery-body:*")]):
            assert days * DAY - 60 <= redis_client.ttl(key) <= days * DAY, key
        # a redelivery long after GitHub's own retries (here: at once) is still a duplicate
        assert requests.post(url, data=body, headers=headers, timeout=10).status_code == 200
    finally:
        server.shutdown()


@pytest.mark.parametrize("value", ["0", "-3", "seven", "366"])
def test_a_bad_delivery_memory_is_refused_by_name(value):
    with pytest.raises(SettingsError, match="TORCHREVIEW_DELIVERY_TTL_DAYS"):
        Settings.from_env({"GITHUB_WEBHOOK_SECRET": WEBHOOK_SECRET, "TORCHREVIEW_DELIVERY_TTL_DAYS": value},
                          require_github=False, role="web")
