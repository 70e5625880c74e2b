"""The operator's job checks its ``remote.*`` files and reaches the service before it
reserves budget or starts Ray.

Otherwise a wrong CA file, the operator's public key given for its private key, or a service
that is not up would surface only once Ray had started and the server actor asked the
service for its key (7-11 s here), as a traceback in the CA's case. Here each is one line
at once, nothing reserved. The job asks the service again when the round starts.
"""
from __future__ import annotations

from rknn_ray.errors import DataError
from rknn_ray.remote.operator_key import load_operator_key
from sealing.upload_client import client_context, fetch, reach_error

#: what the operator can do when the service is not reached (reach_error)
REACH_FIX = "start it (rknn-ray shuffler serve) or correct remote.shuffler / remote.ca"


def check_remote_parties(cfg) -> None:
    """DataError (one line naming the key and the fix) unless the operator's key loads, the CA
    file is a certificate, and the service answers over TLS verified with it: ``GET /key`` in
    the shuffle model (a relay has no key), ``GET /status`` in the local and central models."""
    r = cfg.remote
    load_operator_key(r.operator_key)
    try:
        client_context(r.ca)
    except ValueError as exc:
        raise DataError(f"remote.ca: {exc}") from None
    url = str(r.shuffler)
    path = "/key" if cfg.privacy.model == "shuffle" else "/status"
    try:
        status, body = fetch(url, r.ca, path)
    except OSError as exc:
        raise DataError(reach_error(url, r.ca, exc, "remote.ca", REACH_FIX)) from None
    if status == 404 and path == "/key":
        raise DataError(f"the service at {url} is a relay (no shuffler key) and "
                        "privacy.model=shuffle needs a shuffler. Fix: point remote.shuffler at "
                        "'rknn-ray shuffler serve --key ...', or run the local or central model")
    if status != 200:
        text = body.decode(errors="replace").strip().splitlines()[:1]
        raise DataError(f"GET {url}{path} answered HTTP {status}{': ' + text[0] if text else ''}"
                        ". Fix: point remote.shuffler at rknn-ray shuffler serve")
