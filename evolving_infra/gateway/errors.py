"""The gateway's own error answers, OpenAI-shaped like the router's (`{"error": {message, type, param,
code}}` with `x-should-retry`, and `Retry-After` when a retry after a delay can help).

| status | code | when | retry |
| --- | --- | --- | --- |
| 503 | `partition_unavailable` | the user's partition is down or does not answer | after Retry-After |
| 503 | `no_partitions` | no partition is known yet | after Retry-After |
| 400 | `no_eligible_partition` | no partition meets the requirements | never |
| 400 | `invalid_value` | a bad requirements header, id or body | never |
| 401 | `invalid_api_key` | keys are configured and none or a wrong one was sent | never |
| 504 | `deadline_exceeded` | the partition router did not answer within the gateway's deadline | yes |

Boundary: plain values; the server turns them into responses.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from evolving_infra.router.http.errors import ErrorType


class GatewayErrorCode(enum.Enum):
    PARTITION_UNAVAILABLE = "partition_unavailable"
    NO_PARTITIONS = "no_partitions"
    NO_ELIGIBLE_PARTITION = "no_eligible_partition"
    INVALID_VALUE = "invalid_value"
    INVALID_API_KEY = "invalid_api_key"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_FOUND = "not_found"


@dataclass(eq=False)
class GatewayError(Exception):
    status: int
    message: str
    type: ErrorType
    code: GatewayErrorCode
    param: str | None = None
    should_retry: bool = False
    retry_after_s: float | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type.value, "param": self.param, "code": self.code.value}}

    def headers(self) -> dict[str, str]:
        out = {"x-should-retry": "true" if self.should_retry else "false"}
        if self.retry_after_s is not None:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
            out["retry-after-ms"] = str(max(0, round(self.retry_after_s * 1000)))
        return out


def partition_unavailable(partition: str, retry_after_s: float, why: str) -> GatewayError:
    return GatewayError(
        503,
        f"partition {partition}, which serves this user, is unavailable ({why}); retry after {retry_after_s:g} s",
        ErrorType.SERVER,
        GatewayErrorCode.PARTITION_UNAVAILABLE,
        should_retry=True,
        retry_after_s=retry_after_s,
    )


def bad_request(message: str, param: str | None, code: GatewayErrorCode = GatewayErrorCode.INVALID_VALUE) -> GatewayError:
    return GatewayError(400, message, ErrorType.INVALID_REQUEST, code, param=param)
