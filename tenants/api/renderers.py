"""CSV for usage exports. Hand-written: djangorestframework-csv is unmaintained since 2023 and our rows are flat."""

import csv
import io

from rest_framework.renderers import BaseRenderer


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        rows = data if isinstance(data, list) else [data]
        fieldnames = list(rows[0]) if rows else _columns_of((renderer_context or {}).get("view"))
        if not fieldnames:
            return b""
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fieldnames, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({name: _cell(value) for name, value in row.items()})
        return out.getvalue().encode(self.charset)


def _cell(value):
    if isinstance(value, (list, dict)):
        return " ".join(str(item) for item in value) if isinstance(value, list) else str(value)
    return value


def _columns_of(view) -> list[str]:
    """The header row of an empty export: the view's serializer's fields (a spreadsheet still gets its columns)."""
    try:
        return list(view.get_serializer().fields)
    except AttributeError:
        return []
