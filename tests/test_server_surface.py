"""The HTTP API's surface (issue 21) over a real uvicorn server, driven with httpx: unknown
fields and query parameters refused naming them, JSON errors with line and column, one error
shape on every path (404 and 405 included), response models in /openapi.json that the real
responses satisfy, and /docs served from packaged assets with no CDN."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from ctxwarden import Engine
from ctxwarden.server.http import create_app
from ctxwarden.server.surface import RESPONSES, ErrorResponse
from serving import serve

RECORDS = [
    {"id": "m1", "role": "user", "content": "the deploy moved to friday"},
    {"id": "m2", "role": "user", "content": "omar owns the release checklist"},
]


@pytest.fixture
def served() -> Iterator[tuple[httpx.Client, Engine]]:
    with (
        Engine.open(":memory:") as engine,
        serve(create_app(engine)) as base,
        # a bound, not a measurement: the docs' bundles are megabytes, and CI runs loaded
        httpx.Client(base_url=base, timeout=60) as http,
    ):
        yield http, engine


@pytest.fixture
def client(served: tuple[httpx.Client, Engine]) -> httpx.Client:
    return served[0]


def _error(response: httpx.Response) -> dict[str, Any]:
    ErrorResponse.model_validate(response.json())  # the one shape
    return response.json()["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/ingest", {"records": RECORDS, "sesion": "s"}, "sesion"),
        ("/v1/assemble", {"session": "s", "querry": "deploy"}, "querry"),
        ("/v1/search", {"query": "deploy", "limt": 3}, "limt"),
        ("/v1/compact/plan", {"older_then": 5}, "older_then"),
        ("/v1/compact/apply", {"older_then": 5}, "older_then"),
    ],
)
def test_unknown_body_fields_are_refused_naming_them(
    client: httpx.Client, path: str, body: dict[str, Any], field: str
) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 422
    error = _error(response)
    assert error["field"] == field
    assert field in error["message"]
    assert client.get("/v1/stats").json()["memories"] == 0  # nothing was written


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/stats?sesion=s"),
        ("GET", "/v1/pins?scop=user"),
        ("GET", "/v1/memories/m1?usr=a"),
        ("POST", "/v1/assemble?reprot=full"),
        ("DELETE", "/v1/memories/m1?forse=1"),
        ("GET", "/v1/stats/history?bucket=5"),
    ],
)
def test_unknown_query_parameters_are_refused(client: httpx.Client, method: str, path: str) -> None:
    client.post("/v1/ingest", json={"records": RECORDS, "session": "s"})
    response = client.request(method, path, json={"session": "s"})
    assert response.status_code == 422
    name = path.split("?")[1].split("=")[0]
    assert _error(response)["field"] == f"query.{name}"
    assert client.get("/v1/memories/m1").status_code == 200  # the delete did not run


def test_a_json_error_names_line_and_column(client: httpx.Client) -> None:
    raw = '{\n  "session": "s",\n  "query": oops\n}'
    response = client.post(
        "/v1/assemble", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    error = _error(response)
    assert (error["line"], error["column"]) == (3, 12)
    assert "line 3, column 12" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "status", "kind"),
    [
        ("GET", "/v1/nothing-here", 404, "NotFound"),
        ("GET", "/", 404, "NotFound"),
        ("GET", "/v1/memories/none", 404, "NotFound"),
        ("GET", "/v1/memories/none/history", 404, "NotFound"),
        ("POST", "/v1/stats/history", 405, "MethodNotAllowed"),
        ("GET", "/v1/ingest", 405, "MethodNotAllowed"),
        ("PUT", "/v1/stats", 405, "MethodNotAllowed"),
    ],
)
def test_one_error_shape_on_every_path(
    client: httpx.Client, method: str, path: str, status: int, kind: str
) -> None:
    response = client.request(method, path)
    assert response.status_code == status
    error = _error(response)
    assert error["type"] == kind
    assert error["message"]
    if status == 405:
        assert "allowed" in error["message"]
        assert response.headers["allow"]


def test_the_schema_documents_every_response_and_the_answers_match(
    served: tuple[httpx.Client, Engine],
) -> None:
    client, engine = served
    # a large tool result offloaded by the library: its whole text is what /sources returns
    result = {"role": "tool", "tool_call_id": "c1", "content": "row " * 400}
    offloaded = engine.offload([result], max_tokens=50, session="tools")
    schema = client.get("/openapi.json").json()
    documented = {
        (method, path) for path, operations in schema["paths"].items() for method in operations
    }
    assert documented == set(RESPONSES)  # every endpoint has its model, and no stale one
    for (method, path), model in RESPONSES.items():
        operation = schema["paths"][path][method]
        ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model.__name__}"
        assert model.__name__ in schema["components"]["schemas"]
        error_ref = operation["responses"]["422"]["content"]["application/json"]["schema"]
        assert error_ref == {"$ref": "#/components/schemas/ErrorResponse"}
    # The real answers satisfy the documented models.
    ingest = {"records": RECORDS, "session": "s"}
    assemble = {"session": "s", "query": "deploy"}
    edit = {"content": "the deploy moved to monday"}
    answers = {
        ("post", "/v1/ingest"): client.post("/v1/ingest", json=ingest),
        ("post", "/v1/assemble"): client.post("/v1/assemble", json=assemble),
        ("post", "/v1/search"): client.post("/v1/search", json={"query": "deploy"}),
        ("get", "/v1/memories/{memory_id}"): client.get("/v1/memories/m1"),
        ("post", "/v1/memories/{memory_id}/pin"): client.post("/v1/memories/m1/pin"),
        ("get", "/v1/pins"): client.get("/v1/pins?session=s"),
        ("post", "/v1/memories/{memory_id}/unpin"): client.post("/v1/memories/m1/unpin"),
        ("patch", "/v1/memories/{memory_id}"): client.patch("/v1/memories/m1", json=edit),
        ("get", "/v1/memories/{memory_id}/versions"): client.get("/v1/memories/m1/versions"),
        ("get", "/v1/stats"): client.get("/v1/stats"),
        ("get", "/v1/stats/history"): client.get("/v1/stats/history?buckets=5"),
        ("get", "/v1/memories/{memory_id}/history"): client.get("/v1/memories/m1/history"),
        ("get", "/v1/memories/{memory_id}/sources"): client.get(
            f"/v1/memories/{offloaded.ids[0]}/sources", params={"session": "tools"}
        ),
        ("post", "/v1/compact/plan"): client.post("/v1/compact/plan", json={}),
        ("post", "/v1/compact/apply"): client.post("/v1/compact/apply", json={}),
        ("delete", "/v1/memories/{memory_id}"): client.delete("/v1/memories/m2"),
        ("delete", "/v1/sessions/{session}"): client.delete("/v1/sessions/s"),
        ("get", "/health"): client.get("/health"),
        ("delete", "/v1/tenant"): client.delete("/v1/tenant"),
    }  # fmt: skip
    assert set(answers) == set(RESPONSES)
    for key, response in answers.items():
        assert response.status_code == 200, (key, response.text)
        RESPONSES[key].model_validate(response.json())


def test_every_route_is_in_the_table() -> None:
    with Engine.open(":memory:") as engine:
        app = create_app(engine)
    routes = {
        (method.lower(), route.path)
        for route in app.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    assert routes == set(RESPONSES)


def test_docs_work_offline(client: httpx.Client) -> None:
    for page, script in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
        html = client.get(page)
        assert html.status_code == 200
        sources = re.findall(r'(?:src|href)="([^"]+)"', html.text)
        assert sources  # the page loads its script and style ...
        assert all(s.startswith("/docs/assets/") for s in sources), sources  # ... from us
        assert "https://" not in html.text.replace("https://github.com", "")
        asset = client.get(f"/docs/assets/{script}")
        assert asset.status_code == 200
        assert len(asset.content) > 100_000
    # Swagger UI 5 reads OpenAPI 3.1, which FastAPI writes
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1")
    bundle = client.get("/docs/assets/swagger-ui-bundle.js").text
    assert re.search(r'"5\.\d+\.\d+"', bundle)
