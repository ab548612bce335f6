"""The error a request is answered with: an HTTP status and the OpenAI API's error body
(`{"error": {"message", "type", "param", "code"}}`), raised anywhere in the server's handling."""

from __future__ import annotations

from typing import Any, Dict


class ErrorInfo(Exception):
    """A request the server answers with an OpenAI-style error body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def type(self) -> str:
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> Dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def unknown_model(asked: str, served: str) -> ErrorInfo:
    return ErrorInfo(
        404,
        f"The model `{asked}` does not exist (this server serves `{served}`)",
        param="model",
        code="model_not_found",
    )
