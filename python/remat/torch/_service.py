"""Talk to a remat service (`remat serve`, docs/api.md) from Python: attach what
`remat.torch.measure` measured to the plan the service made, so the API and the viewer show it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from ._errors import RematTorchError


class ServiceError(RematTorchError):
    """The service refused a request: `status` and its error object (`code`, `message`)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        self.status = status
        self.error = error
        super().__init__(f"{status} {error.get('code', '?')}: {error.get('message', '')}")


def attach(
    plan_url: str, validation: dict[str, Any], *, token: str | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """PUTs `validation` (what `measure` returned for the plan at `plan_url`, a service's
    `.../v1/plans/{id}`) as that plan's `validation`; returns the plan record the service now
    answers. The service refuses, naming the field, a measurement of another plan."""
    request = urllib.request.Request(
        plan_url.rstrip("/") + "/validation",
        data=json.dumps(validation).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            record: dict[str, Any] = json.loads(response.read())
            return record
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            error = json.loads(body).get("error", {})
        except ValueError:
            error = {"code": "http", "message": body.decode(errors="replace")}
        raise ServiceError(e.code, error) from None
