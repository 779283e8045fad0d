"""The client's errors, one tree with its own root (the client imports nothing of the server):

    ClientError                 raised by lakebroker_client
     ├── BrokerUnavailable      no usable answer before Retry.timeout_s ran out: connection refused
     │                          or reset, timeouts, 429 and 5xx answers (`last_status` says which)
     ├── RequestRefused         an answer that retrying cannot change (400, 401, 403, 404, 413,
     │                          416, 422, ...): `status` and the broker's error `code`
     ├── BufferFull             send() waited `block_s` for room in the producer's buffer
     ├── ClientClosed           used after close(), or a request that close() interrupted
     ├── SignatureInvalid       a webhook whose Standard Webhooks signature does not verify (401)
     └── InvalidDelivery        a correctly signed webhook body that is no lakebroker envelope (400)

Each carries `status` (the HTTP status it stands for) and `code`, like the broker's errors.
"""

from __future__ import annotations


class ClientError(Exception):
    status: int = 500
    code: str = "client_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BrokerUnavailable(ClientError):
    status = 503
    code = "broker_unavailable"

    def __init__(self, message: str, last_status: int | None = None) -> None:
        super().__init__(message)
        self.last_status = last_status  # the last HTTP status, or None when the broker did not answer


class RequestRefused(ClientError):
    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class BufferFull(ClientError):
    status = 503
    code = "buffer_full"


class ClientClosed(ClientError):
    code = "client_closed"


class SignatureInvalid(ClientError):
    status = 401
    code = "signature_invalid"


class InvalidDelivery(ClientError):
    status = 400
    code = "invalid_delivery"
