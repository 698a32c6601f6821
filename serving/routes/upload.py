"""Reading an upload: the body under a byte cap, and multipart/form-data parsed with the stdlib
email parser (no python-multipart dependency)."""

from __future__ import annotations

import email.parser
import email.policy

from fastapi import Request

from serving.api.errors import ApiError

MULTIPART_OVERHEAD_BYTES = 65536  # form headers and boundaries around the file's bytes


async def read_capped(request: Request, max_bytes: int, what: str) -> bytes:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_bytes:
            raise ApiError(
                413,
                f"{what} exceeds the {max_bytes}-byte limit",
                code="request_too_large",
            )
    return bytes(raw)


def parse_form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Form field name -> (filename or None, bytes)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(
            400,
            f"content-type {content_type!r}: upload files as multipart/form-data "
            "(fields: file, purpose)",
            param="content-type",
        )
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise ApiError(400, "the multipart body could not be parsed", param="file")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise ApiError(400, "a form part has no name", param="file")
        fields[str(name)] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields
