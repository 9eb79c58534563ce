"""HEAD answers as GET would, without the body (RFC 9110 §9.3.2): FastAPI routes declare GET only,
so HEAD /healthz was a 405 for monitors and load balancers that probe with it. `front.Front` runs a
HEAD request as a GET and sends only the response's start (status and headers, with GET's
content-length)."""

from __future__ import annotations

__all__ = ["HEAD_MARK"]

HEAD_MARK = "tributary.head"  # in the scope of a HEAD request run as a GET
