"""Flask app factory and background server for the GitHub emulator.

Every request runs the same pipeline before its handler, in GitHub's order:
record -> injected fault -> authentication -> repository access & permission ->
primary rate limit -> OpenAPI validation. Responses get GitHub's headers.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import WSGIRequestHandler, make_server

from . import graphql
from .auth import AuthError, credentials, installation_principal, verify_app_jwt
from .render import Renderer
from .routes import ROUTES, RestApi, Route
from .spec import operations_index
from .state import EmulatorError, EmulatorState, RecordedRequest
from .validation import check_request, check_response, spec_request

GENERIC_DOCS = "https://docs.github.com/rest"
GRAPHQL_DOCS = "https://docs.github.com/graphql"
API_VERSION = "2022-11-28"
ANONYMOUS = "anonymous"  # rate-limit bucket reported on requests without valid credentials


def create_app(state: EmulatorState, check_responses: bool = False) -> Flask:
    """A Flask app serving `state`.

    check_responses: also validate each JSON response of a described operation
    against the OpenAPI response schema; a mismatch becomes a 500 naming the
    problems (and is kept in `app.config["RESPONSE_PROBLEMS"]`). Meant for tests.
    """
    app = Flask(__name__)
    app.url_map.strict_slashes = False
    app.config["RESPONSE_PROBLEMS"] = []
    api = RestApi(state)
    docs = {op["operationId"]: op["docs"] for op in operations_index()}
    routes: dict[str, Route] = {}

    for index, route in enumerate(ROUTES):
        endpoint = f"{route.handler}:{index}"
        routes[endpoint] = route
        app.add_url_rule(route.rule, endpoint, getattr(api, route.handler), methods=[route.method])
    graphql_route = Route(None, "POST", "/graphql", "graphql")
    routes["graphql"] = graphql_route
    app.add_url_rule("/graphql", "graphql", lambda: _graphql(state), methods=["POST"])

    def current_route() -> Route | None:
        return routes.get(request.endpoint or "")

    def error_response(error: EmulatorError) -> Response:
        route = current_route()
        body: dict[str, Any] = {"message": error.message}
        if error.errors is not None:
            body["errors"] = error.errors
        if route is graphql_route:
            body["documentation_url"] = GRAPHQL_DOCS
        else:
            body["documentation_url"] = docs.get(route.operation_id, GENERIC_DOCS) if route else GENERIC_DOCS
        body["status"] = str(error.status)
        response = jsonify(body)
        response.status_code = error.status
        return response

    @app.before_request
    def pipeline() -> Response | None:
        token = state.tokens.get(credentials(request.headers.get("Authorization")) or "")
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            query=request.args.to_dict(),
            body=request.get_json(silent=True) if request.data else None,
            installation_id=token.installation_id if token is not None else None,
            user_agent=request.headers.get("User-Agent", ""),
        )
        state.requests.append(recorded)
        g.recorded = recorded
        g.renderer = Renderer(state, request.host_url)
        g.rate_limit_principal = None

        fault = state.faults.take(request.method, request.path)
        if fault is not None:
            response = jsonify(fault.body)
            response.status_code = fault.status
            response.headers.update(fault.headers)
            return response

        route = current_route()
        if route is None:
            state.contract_violations.append({"method": request.method, "path": request.path,
                                              "errors": ["no such operation"]})
            return None  # unknown URL: Flask answers 404/405, rendered below
        try:
            _authenticate(state, route)
            _charge_rate_limit(state)
            if request.data and request.get_json(silent=True) is None:
                raise EmulatorError(400, "Problems parsing JSON")
            if route.operation_id is not None:
                _validate(state, route)
        except AuthError as error:
            return error_response(EmulatorError(401, str(error)))
        except EmulatorError as error:
            return error_response(error)
        return None

    @app.errorhandler(EmulatorError)
    def on_emulator_error(error: EmulatorError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    def on_http_error(error: HTTPException) -> Response:
        return error_response(EmulatorError(error.code or 500, "Not Found" if error.code == 404 else error.name))

    @app.after_request
    def decorate(response: Response) -> Response:
        route = current_route()
        if check_responses and route is not None and route.operation_id and response.status_code < 300:
            response = _checked(route, response, app.config["RESPONSE_PROBLEMS"])
        response.headers["X-GitHub-Request-Id"] = uuid.uuid4().hex[:8].upper() + ":" + uuid.uuid4().hex[:12].upper()
        response.headers["X-GitHub-Media-Type"] = "github.v3; format=json"
        response.headers["X-GitHub-Api-Version-Selected"] = API_VERSION
        if "x-ratelimit-remaining" not in response.headers:  # a fault may set its own
            bucket = state.rate_limit_bucket(g.get("rate_limit_principal") or ANONYMOUS)
            response.headers.update({
                "x-ratelimit-limit": str(bucket.limit),
                "x-ratelimit-remaining": str(bucket.remaining),
                "x-ratelimit-reset": str(bucket.reset),
                "x-ratelimit-used": str(bucket.used),
                "x-ratelimit-resource": "graphql" if route is graphql_route else "core",
            })
        if request.method == "GET" and response.status_code == 200 and response.mimetype == "application/json":
            response.headers["ETag"] = f'W/"{hashlib.sha256(response.get_data()).hexdigest()}"'
        if "recorded" in g:
            g.recorded.status = response.status_code
        return response

    # One request at a time: handlers mutate shared state, tests mutate it too.
    wsgi_app = app.wsgi_app

    def serialized(environ: dict[str, Any], start_response: Callable) -> Any:
        hold = state.faults.take_hold(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""))
        if hold is not None:
            time.sleep(hold.delay)  # before the lock: the rest of the emulator answers meanwhile
        with state.lock:
            return wsgi_app(environ, start_response)

    app.wsgi_app = serialized  # type: ignore[method-assign]
    return app


def _authenticate(state: EmulatorState, route: Route) -> None:
    """Set g.principal / g.repo for the route's auth kind, or raise AuthError/EmulatorError."""
    credential = credentials(request.headers.get("Authorization"))
    if route.auth == "none":
        return
    if route.auth == "app" or (route.auth == "any" and credential and credential.count(".") == 2):
        verify_app_jwt(credential, state.app)
        g.rate_limit_principal = f"app:{state.app.id}"
        return
    if credential is None:
        raise AuthError("Requires authentication")
    principal = installation_principal(state, credential)
    g.principal = principal
    g.rate_limit_principal = f"installation:{principal.installation.id}"
    owner, name = (request.view_args or {}).get("owner"), (request.view_args or {}).get("repo")
    if owner is None:
        return
    repo = state.repos.get(f"{owner}/{name}")
    if repo is None or not principal.can_access(repo):
        raise EmulatorError(404, "Not Found")
    if route.permissions and not any(principal.has_permission(p, route.level) for p in route.permissions):
        raise EmulatorError(403, "Resource not accessible by integration")
    g.repo = repo


def _charge_rate_limit(state: EmulatorState) -> None:
    if g.rate_limit_principal is None or request.path == "/rate_limit":
        return  # GET /rate_limit is free on GitHub too
    bucket = state.rate_limit_bucket(g.rate_limit_principal)
    if bucket.remaining == 0:
        raise EmulatorError(403, f"API rate limit exceeded for {g.rate_limit_principal.replace(':', ' ID ')}.")
    bucket.used += 1


_RULE_VARIABLE = re.compile(r"<(?:\w+:)?(\w+)>")


def _spec_path() -> str:
    """The request path with `/` inside path parameters percent-encoded, for openapi-core."""
    if request.url_rule is None:
        return request.path
    view_args = request.view_args or {}
    return _RULE_VARIABLE.sub(lambda m: quote(str(view_args[m.group(1)]), safe=""), request.url_rule.rule)


def _spec_request_for_current():
    return spec_request(
        request.method,
        _spec_path(),
        request.args.to_dict(),
        request.get_data(),
        request.mimetype,
        dict(request.headers),
    )


def _validate(state: EmulatorState, route: Route) -> None:
    problem = check_request(_spec_request_for_current())
    if problem is None:
        return
    state.contract_violations.append({"method": request.method, "path": request.path, "errors": problem.errors})
    if problem.status == 404:
        raise EmulatorError(404, "Not Found")
    raise EmulatorError(422, "Validation Failed", problem.errors)


def _checked(route: Route, response: Response, problems: list[dict[str, Any]]) -> Response:
    if response.mimetype != "application/json":
        return response
    if route.operation_id == "repos/get-content" and response.get_data().startswith(b"["):
        # The description puts a `type` discriminator on a oneOf whose first branch is
        # an array, so no directory listing (not even GitHub's example) can validate.
        return response
    found = check_response(
        _spec_request_for_current(), response.status_code, response.get_data(), response.mimetype or "application/json"
    )
    if not found:
        return response
    problems.append({"operation": route.operation_id, "path": request.path, "problems": found})
    failure = jsonify({"message": "Emulator response does not match the OpenAPI description", "errors": found})
    failure.status_code = 500
    return failure


def _graphql(state: EmulatorState) -> Response:
    if "principal" not in g:
        raise EmulatorError(401, "This endpoint requires you to be authenticated.")
    return jsonify(graphql.execute(state, g.principal, g.renderer.api, request.get_json(silent=True) or {}))


# ------------------------------------------------------------------------------ serving


@dataclass
class RunningEmulator:
    url: str
    state: EmulatorState
    app: Flask
    _server: Any
    _thread: threading.Thread

    def shutdown(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> "RunningEmulator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


class _QuietRequestHandler(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass  # state.requests already records every request


def serve(
    state: EmulatorState, host: str = "127.0.0.1", port: int = 0, check_responses: bool = False
) -> RunningEmulator:
    """Serve `state` from a background thread; port 0 picks a free port."""
    app = create_app(state, check_responses=check_responses)
    server = make_server(host, port, app, threaded=True, request_handler=_QuietRequestHandler)
    # A short poll interval keeps shutdown() (which waits for the loop to notice) fast.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="github-emulator", daemon=True
    )
    thread.start()
    return RunningEmulator(f"http://{host}:{server.server_port}", state, app, server, thread)
