"""Logs never carry a URL's credentials: signed archive links (``...?token=``) and ``user:token@host`` URLs
appear in exception messages (``404 Client Error ... for url: ...``), and logs travel further than the
worker (log shippers, support tickets). One filter, on every handler of the process, rewrites each record
with the same redaction the App applies to what it posts (``analyzers.markdown.redact_urls``)."""
from __future__ import annotations

import logging

from analyzers.markdown import redact_urls


class RedactUrls(logging.Filter):
    """Rewrites a record's message and exception text with every URL's query, fragment and userinfo removed."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_urls(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_urls(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_urls(record.stack_info)
        return True


def redact_handlers(logger: logging.Logger | None = None) -> None:
    """Put the filter on each handler of ``logger`` (the root by default): a handler's filters see the records
    of every logger that propagates to it, a logger's own filters would not."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactUrls) for f in handler.filters):
            handler.addFilter(RedactUrls())
