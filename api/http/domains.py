"""Each loaded stream type in the OpenAPI document, so a client team can generate code from it.

`POST /commands/{stream_type}/{stream_id}` is one route; the document also lists, per stream type,
`POST /commands/<stream_type>/{stream_id}` (the same route, so the same behaviour and errors) with
its body as a union of that type's commands, discriminated by `type`, and its reply's events as a
union of that type's events. The models' JSON Schemas are components named `<stream_type>.<Model>`;
`<stream_type>.Command`, `<stream_type>.Event` and `<stream_type>.CommandReply` are the unions and
the reply.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tributary.api.http.problems import document_problems
from tributary.eventstore.aggregate import Aggregate

__all__ = ["GENERIC_COMMAND_PATH", "document_domains", "domain_paths"]

GENERIC_COMMAND_PATH = "/commands/{stream_type}/{stream_id}"
_REF = "#/components/schemas/{}"


def document_domains(app: FastAPI) -> None:
    """Have `app.openapi()` (hence `/openapi.json` and `/docs`) describe every stream type too: those
    of `app.state.aggregates`, made again when they change (`aggregates_generation`)."""
    base: Callable[[], dict[str, Any]] = app.openapi
    made_for: list[int] = [-1]

    def openapi() -> dict[str, Any]:
        generation = getattr(app.state, "aggregates_generation", 0)
        if app.openapi_schema is None or made_for[0] != generation:
            app.openapi_schema = None
            schema = base()  # FastAPI's own document, which it caches in app.openapi_schema
            domain_paths(schema, app.state.aggregates)
            made_for[0] = generation
            document_problems(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the document


def domain_paths(schema: dict[str, Any], aggregates: Mapping[str, Aggregate[Any]]) -> None:
    """Add each stream type's components and command path to an OpenAPI document (in place)."""
    generic = schema["paths"][GENERIC_COMMAND_PATH]["post"]
    components: dict[str, Any] = schema.setdefault("components", {}).setdefault("schemas", {})
    request_fields = components["CommandRequest"]["properties"]
    event_out = components["EventOut"]
    reply = components["CommandReply"]
    for stream_type, agg in sorted(aggregates.items()):
        refs = _model_components(stream_type, agg, components)
        commands = {}
        for name, model in agg.commands.items():
            key = f"{stream_type}.command.{name}"
            components[key] = _command_body(name, refs[model, "validation"], model, request_fields)
            commands[name] = _REF.format(key)
        events = {}
        for name, model in agg.event_models.items():
            key = f"{stream_type}.event.{name}"
            components[key] = _event_body(name, refs[model, "serialization"], event_out)
            events[name] = _REF.format(key)
        components[f"{stream_type}.Command"] = _union(f"A {stream_type} command", commands)
        components[f"{stream_type}.Event"] = _union(f"A {stream_type} event", events)
        typed_reply = copy.deepcopy(reply)
        typed_reply["title"] = f"{stream_type} CommandReply"
        typed_reply["properties"]["events"] = {
            "type": "array",
            "items": {"$ref": _REF.format(f"{stream_type}.Event")},
            "title": "Events",
        }
        components[f"{stream_type}.CommandReply"] = typed_reply
        schema["paths"][f"/commands/{stream_type}/{{stream_id}}"] = {"post": _operation(generic, stream_type)}


def _model_components(
    stream_type: str, agg: Aggregate[Any], components: dict[str, Any]
) -> dict[tuple[Any, str], dict[str, Any]]:
    """The JSON Schemas of the commands (as accepted) and events (as returned), named
    `<stream_type>.<Model>` so that two domains' models of one name do not collide."""
    inputs: list[tuple[type[BaseModel], Any]] = [(m, "validation") for m in agg.commands.values()]
    inputs += [(m, "serialization") for m in agg.event_models.values()]
    template = _REF.format(f"{stream_type}.{{model}}")
    refs, top = models_json_schema(inputs, ref_template=template)
    for name, definition in top.get("$defs", {}).items():
        components[f"{stream_type}.{name}"] = definition
    out: dict[tuple[Any, str], dict[str, Any]] = {}
    for (model, mode), ref in refs.items():
        out[model, mode] = ref
    return out


def _command_body(
    name: str, data_ref: dict[str, Any], model: type[BaseModel], request_fields: dict[str, Any]
) -> dict[str, Any]:
    optional_data = all(not f.is_required() for f in model.model_fields.values())
    return {
        "title": f"{name} command",
        "type": "object",
        "properties": {
            "type": {"type": "string", "const": name, "title": "Type"},
            "data": data_ref,
            # the generic body's other fields (expected_version, command_id, …), as the route takes them
            **{k: v for k, v in request_fields.items() if k not in ("type", "data")},
        },
        "required": ["type"] if optional_data else ["type", "data"],
        "additionalProperties": False,
    }


def _event_body(name: str, data_ref: dict[str, Any], event_out: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(event_out)
    body["title"] = f"{name} event"
    body.pop("description", None)
    body["properties"]["type"] = {"type": "string", "const": name, "title": "Type"}
    body["properties"]["data"] = data_ref
    return body


def _union(title: str, refs: Mapping[str, str]) -> dict[str, Any]:
    return {
        "title": title,
        "oneOf": [{"$ref": ref} for ref in refs.values()],
        "discriminator": {"propertyName": "type", "mapping": dict(refs)},
    }


def _operation(generic: dict[str, Any], stream_type: str) -> dict[str, Any]:
    op = copy.deepcopy(generic)
    op["summary"] = f"Send a {stream_type} command"
    op["operationId"] = "send_" + re.sub(r"\W", "_", stream_type) + "_command"
    op["parameters"] = [p for p in op.get("parameters", []) if p.get("name") != "stream_type"]
    op["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": _REF.format(f"{stream_type}.Command")}}},
    }
    op["responses"].pop("404", None)  # the stream type exists
    ok = op["responses"]["200"]["content"]["application/json"]
    ok["schema"] = {"$ref": _REF.format(f"{stream_type}.CommandReply")}
    return op
