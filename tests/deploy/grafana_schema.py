"""A JSON Schema of the parts of a dashboard file Grafana's file provisioning needs to load and draw it: no
published schema ships in a pip package (Grafana's own is CUE, in its Go module), so these are written from
Grafana's dashboard JSON model (schemaVersion 39) for the panel types deploy/ uses."""

PANEL_TYPES = ["timeseries", "heatmap", "table", "barchart", "stat", "gauge", "bargauge", "text"]

_GRID_POS = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
    },
}
_DATASOURCE = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"type": "string", "minLength": 1}, "uid": {"type": "string", "minLength": 1}},
}
_TARGET = {
    "type": "object",
    "required": ["refId", "datasource"],
    "properties": {"refId": {"type": "string", "pattern": "^[A-Z]$"}, "datasource": _DATASOURCE},
    "oneOf": [
        {"required": ["expr"], "properties": {"expr": {"type": "string", "minLength": 1},
                                              "datasource": {"properties": {"type": {"const": "prometheus"}}}}},
        {"required": ["rawSql", "format"],
         "properties": {"rawSql": {"type": "string", "minLength": 1}, "format": {"enum": ["time_series", "table"]},
                        "datasource": {"properties": {"type": {"const": "grafana-postgresql-datasource"}}}}},
    ],
}
_ROW = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos", "panels"],
    "properties": {"type": {"const": "row"}, "id": {"type": "integer"}, "title": {"type": "string"},
                   "gridPos": _GRID_POS, "collapsed": {"type": "boolean"}, "panels": {"type": "array"}},
}
_PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos", "datasource", "targets", "fieldConfig", "options"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": PANEL_TYPES},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "gridPos": _GRID_POS,
        "datasource": _DATASOURCE,
        "targets": {"type": "array", "minItems": 1, "items": _TARGET},
        "fieldConfig": {"type": "object", "required": ["defaults", "overrides"]},
        "options": {"type": "object"},
    },
}
_VARIABLE = {
    "type": "object",
    "required": ["name", "type", "datasource", "query"],
    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                   "type": {"const": "query"}, "datasource": _DATASOURCE},
}
DASHBOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time", "version"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "version": {"type": "integer"},
        "id": {"type": "null"},  # a provisioned file must not carry a database id
        "time": {"type": "object", "required": ["from", "to"]},
        "refresh": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "templating": {"type": "object", "required": ["list"],
                       "properties": {"list": {"type": "array", "items": _VARIABLE}}},
        "panels": {"type": "array", "minItems": 1,
                   "items": {"if": {"properties": {"type": {"const": "row"}}}, "then": _ROW, "else": _PANEL}},
    },
}
