"""Which tables' streamed INSERTs may take their template (capture/streaming/insert_template.py), learnt as they come.

A table's template is made from the first INSERT the generic path handled and kept only if it
gives that very change the same topic, key and value; it is used while the table's shape is the
one it was made under (`SchemaTracker.version`), and remade after a change of shape.
"""

from __future__ import annotations

import logging

from tributary.capture.decoding import wal2json
from tributary.capture.records import envelope as env
from tributary.capture.records.schema_tracker import SchemaTracker
from tributary.capture.streaming.insert_template import SPLIT, InsertTemplate, table_tag

__all__ = ["MAX_TEMPLATES", "TemplateCache"]

log = logging.getLogger(__name__)

MAX_TEMPLATES = 4096  # tables with a template at once; past it, all are forgotten and relearnt


class TemplateCache:
    """Per table tag (`insert_template.table_tag`): its template, or None when it was refused."""

    def __init__(self, source_name: str, schemas: SchemaTracker) -> None:
        self.source_name = source_name
        self.schemas = schemas
        self._by_tag: dict[bytes, InsertTemplate | None] = {}

    def current(self, tag: bytes) -> InsertTemplate | None:
        """The table's template if it was made under the table's current shape."""
        template = self._by_tag.get(tag)
        if template is None or template.announced != self.schemas.version:
            return None
        return template

    @property
    def refused(self) -> list[bytes]:
        """Tags of the tables whose template was refused (could not be made, or disagreed)."""
        return [tag for tag, template in self._by_tag.items() if template is None]

    def learn(
        self,
        change: wal2json.Change,
        payload: bytes,
        outputs: list[env.Output],
        *,
        db: str,
        key_columns: tuple[str, ...],
        tx_id: int | None,
        commit_ts_ms: int | None,
        now_ms: int,
    ) -> None:
        """After the generic path handled an INSERT (`outputs`): make, or remake, its table's
        template, and keep it only if it gives this very change the same bytes."""
        parts = payload.split(SPLIT)
        tag = table_tag(parts[0])
        if tag in self._by_tag:
            old = self._by_tag[tag]
            if old is None or old.announced == self.schemas.version:
                return  # refused before, or current (it declined one value: the next change may suit it)
        template = InsertTemplate.build(
            change,
            payload,
            source_name=self.source_name,
            db=db,
            key_columns=key_columns,
            announced=self.schemas.version,
        )
        if template is None or len(outputs) != 1:
            self._by_tag[tag] = None
            return
        got = template.encode(payload, parts, template.tx_part(tx_id, commit_ts_ms), now_ms)
        if got is None:
            return  # a value it is not sure of: try again with the next change
        if got != (outputs[0].key, outputs[0].value) or template.topic != outputs[0].topic:
            log.warning(
                "source %s: INSERT template for %s.%s disagrees; not used",
                self.source_name,
                change.schema,
                change.table,
            )
            self._by_tag[tag] = None
            return
        if len(self._by_tag) >= MAX_TEMPLATES:
            self._by_tag.clear()
        self._by_tag[tag] = template
