"""ApiError: an HTTP status with OpenAI's error body, raised anywhere on the request path.

It pickles by value (`__reduce__`), so a handle caller in another Ray process gets it intact.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error with an HTTP status and an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def __reduce__(self):  # crosses Ray process boundaries to handle callers intact
        kwargs = dict(
            type_=self.type, param=self.param, code=self.code, retry_after_s=self.retry_after_s
        )
        return (_rebuild_api_error, (self.status, self.message, kwargs))

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"


def check_model_name(requested: str | None, served: str) -> None:
    """404 model_not_found unless the request names the served model (or names none)."""
    if requested and requested != served:
        raise ApiError(
            404,
            f"model {requested!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


def _rebuild_api_error(status: int, message: str, kwargs: dict) -> ApiError:
    return ApiError(status, message, **kwargs)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
