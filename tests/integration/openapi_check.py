"""Checks DSec REST requests and responses against api/openapi.yaml.

Used by the integration tests on every response they get from a live edge, and unit-tested by
test_openapi_spec.py. Standard library + PyYAML only. It understands the part of OpenAPI 3.0
that the spec uses, and refuses any other schema keyword rather than ignoring it:

    spec = Spec.load()                                   # this checkout's api/openapi.yaml
    spec.validate_request("POST", "/v1/sandboxes", {"memory_mb": 256})
    spec.validate_response("POST", "/v1/sandboxes", 201, resp_json)
    spec.validate_response("GET", "/v1/sandboxes/sb-x/files?path=/a", 200, raw_bytes,
                           content_type="application/octet-stream")
    spec.validate("ExecStreamEvent", line)               # one component schema

A mismatch raises SpecError (an AssertionError) naming the JSON pointer of the first mismatch.
"""

import json
import math
import pathlib
import re
import urllib.parse

import yaml

DEFAULT_PATH = pathlib.Path(__file__).resolve().parents[2] / "api" / "openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
JSON_TYPES = ("application/json", "application/x-ndjson")

# Schema keywords the validator implements; anything else (bar annotations and x-*) is an error,
# so a spec edit cannot silently weaken a check.
KEYWORDS = {
    "$ref", "type", "nullable", "enum", "format", "properties", "required",
    "additionalProperties", "minProperties", "maxProperties", "items", "minItems", "maxItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "oneOf", "anyOf", "allOf", "not",
}
ANNOTATIONS = {"description", "title", "default", "example", "readOnly", "writeOnly", "deprecated"}
INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


class SpecError(AssertionError):
    """A value does not match the spec (or the spec itself is unusable)."""

    def __init__(self, where, pointer, message):
        self.where, self.pointer, self.message = where, pointer, message
        super().__init__(f"{where}: at {pointer or '/'}: {message}")


class _Mismatch(Exception):
    def __init__(self, pointer, message):
        super().__init__(pointer, message)
        self.pointer, self.message = pointer, message


def _ptr(base, key):
    return f"{base}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _show(value):
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_ok(kind, value):
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    python = {"string": str, "boolean": bool, "array": list, "object": dict}.get(kind)
    if python is None:
        raise SpecError("spec", "", f"unknown type {kind!r}")
    return isinstance(value, python)


def _same(a, b):
    # JSON equality: true is not 1.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


class Spec:
    def __init__(self, doc):
        self.doc = doc
        self.paths = doc.get("paths") or {}
        self._regex = {}
        code_schema = doc.get("components", {}).get("schemas", {}).get("ErrorCode", {})
        self.error_status = code_schema.get("x-dsec-http-status", {})

    @classmethod
    def load(cls, path=DEFAULT_PATH):
        with open(path, encoding="utf-8") as f:
            return cls(yaml.safe_load(f))

    # ---- references and routes ------------------------------------------------------------

    def resolve(self, ref):
        """Returns the object a local `#/...` reference points to."""
        if not ref.startswith("#/"):
            raise SpecError("spec", ref, "only local references are supported")
        node = self.doc
        for part in ref[2:].split("/"):
            part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SpecError("spec", ref, "reference does not resolve")
            node = node[part]
        return node

    def deref(self, obj):
        seen = set()
        while isinstance(obj, dict) and "$ref" in obj:
            if obj["$ref"] in seen:
                raise SpecError("spec", obj["$ref"], "reference cycle")
            seen.add(obj["$ref"])
            obj = self.resolve(obj["$ref"])
        return obj

    def operations(self):
        """Yields (METHOD, template, operation) for every operation in the spec."""
        for template, item in self.paths.items():
            for method in METHODS:
                if method in item:
                    yield method.upper(), template, item[method]

    def _route(self, method, concrete_path):
        path = urllib.parse.urlsplit(concrete_path).path
        segs = path.split("/")[1:]  # a trailing or doubled slash matches nothing
        best = None
        for template, item in self.paths.items():
            if method.lower() not in item:
                continue
            tsegs = template.split("/")[1:]
            if len(tsegs) != len(segs):
                continue
            rank, params = [], {}
            for t, s in zip(tsegs, segs):
                if t.startswith("{") and t.endswith("}") and s:
                    rank.append(0)
                    params[t[1:-1]] = urllib.parse.unquote(s)
                elif t == s:
                    rank.append(1)  # a literal segment beats a parameter at the same position
                else:
                    break
            else:
                if best is None or rank > best[0]:
                    best = (rank, template, params)
        if best is None:
            return None
        return best[1], self.paths[best[1]][method.lower()], best[2]

    def match(self, method, concrete_path):
        """Returns (path template, operation) for a concrete path (query ignored), or None."""
        route = self._route(method, concrete_path)
        return route[:2] if route else None

    def _require_route(self, method, concrete_path):
        route = self._route(method, concrete_path)
        if route is None:
            raise SpecError(f"{method} {concrete_path}", "", "no such operation in the spec")
        return route

    def parameters(self, template, operation, location):
        """The path-level and operation-level parameters `in` location, by name."""
        found = {}
        for p in self.paths[template].get("parameters", []) + operation.get("parameters", []):
            p = self.deref(p)
            if p["in"] == location:
                found[p["name"]] = p
        return found

    # ---- requests and responses -----------------------------------------------------------

    def validate_request(self, method, concrete_path, body=None, *, query=None, headers=None,
                         content_type=None):
        """Checks path parameters, the query (from the path and/or `query`, a dict of str or
        list of str), `headers` if given, and the body (decoded JSON, or bytes for raw bodies)."""
        template, op, path_params = self._require_route(method, concrete_path)
        where = f"{method} {template} request"
        for name, p in self.parameters(template, op, "path").items():
            self._check_param(where, "{%s}" % name, p, [path_params[name]])
        given = urllib.parse.parse_qs(urllib.parse.urlsplit(concrete_path).query,
                                      keep_blank_values=True)
        for name, value in (query or {}).items():
            given.setdefault(name, []).extend(value if isinstance(value, list) else [value])
        self._check_params(where, "?", self.parameters(template, op, "query"), given, strict=True)
        if headers is not None:
            given = {k.lower(): [v] for k, v in headers.items()}
            declared = {k.lower(): p for k, p in self.parameters(template, op, "header").items()}
            self._check_params(where, "header ", declared, given, strict=False)
        request_body = self.deref(op.get("requestBody"))
        if request_body is None:
            if body not in (None, b"", ""):
                raise SpecError(where, "", "this operation takes no request body")
            return
        if body is None:
            if request_body.get("required"):
                raise SpecError(where, "", "a request body is required")
            return
        self._check_content(where, request_body["content"], content_type, body)

    def validate_response(self, method, concrete_path, status, body=None, *, content_type=None,
                          headers=None):
        """Checks a response: the status is declared, the body (decoded JSON; for NDJSON a list
        of decoded lines or the raw text; bytes for raw bodies) matches, an error's code fits
        the status, and declared required headers are present if `headers` is given."""
        template, op, _ = self._require_route(method, concrete_path)
        where = f"{method} {template} -> {status}"
        responses = op["responses"]
        response = responses.get(str(status)) or responses.get(f"{str(status)[0]}XX")
        if response is None and status >= 400:
            response = responses.get("default")  # `default` stands for the errors only
        if response is None:
            raise SpecError(where, "", f"status {status} is not declared "
                                       f"(declared: {', '.join(map(str, responses))})")
        response = self.deref(response)
        if headers is not None:
            lower = {k.lower(): v for k, v in headers.items()}
            for name, h in (response.get("headers") or {}).items():
                h = self.deref(h)
                if name.lower() in lower:
                    self._check_param(where, f"header {name}", h, [lower[name.lower()]])
                elif h.get("required"):
                    raise SpecError(where, f"header {name}", "required header is missing")
        content = response.get("content")
        if not content:
            if body not in (None, b"", ""):
                raise SpecError(where, "", f"expected no body, got {_show(body)}")
            return
        self._check_content(where, content, content_type, body)
        if status >= 400 and isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = body["error"].get("code")
            if code in self.error_status and self.error_status[code] != status:
                raise SpecError(where, "/error/code", f"code {code!r} belongs to HTTP "
                                                      f"{self.error_status[code]}, not {status}")

    def validate(self, schema, value, where="value"):
        """Checks `value` against a schema object or a component schema's name."""
        if isinstance(schema, str):
            schema = {"$ref": f"#/components/schemas/{schema}"}
        try:
            self._check(schema, value, "")
        except _Mismatch as e:
            raise SpecError(where, e.pointer, e.message) from None

    # ---- internals ------------------------------------------------------------------------

    def _check_content(self, where, content, content_type, body):
        if content_type:
            base = content_type.split(";")[0].strip().lower()
            media = next((m for m in content if m.split(";")[0].strip().lower() == base), None)
            if media is None:
                raise SpecError(where, "", f"content type {base!r} is not declared "
                                           f"(declared: {', '.join(content)})")
        elif len(content) == 1:
            media = next(iter(content))
        elif "application/json" in content:
            media = "application/json"
        else:
            raise SpecError(where, "", "several content types: pass content_type")
        schema = content[media].get("schema", {})
        if media == "application/x-ndjson":
            if isinstance(body, (bytes, str)):
                text = body.decode() if isinstance(body, bytes) else body
                try:
                    body = [json.loads(line) for line in text.splitlines() if line.strip()]
                except ValueError as e:
                    raise SpecError(where, "", f"NDJSON line is not JSON: {e}") from None
            if not isinstance(body, list):
                raise SpecError(where, "", "NDJSON body must be a list of decoded lines or text")
            for i, line in enumerate(body):
                self.validate(schema, line, f"{where} (NDJSON line {i})")
        elif media in JSON_TYPES:
            self.validate(schema, body, f"{where} body")
        elif not isinstance(body, (bytes, bytearray, str)):
            raise SpecError(where, "", f"{media} body must be bytes or str, got "
                                       f"{type(body).__name__}")

    def _check_params(self, where, prefix, declared, given, strict):
        if strict:
            for name in given:
                if name not in declared:
                    raise SpecError(where, prefix + name, "unknown parameter")
        for name, p in declared.items():
            if name in given:
                self._check_param(where, prefix + name, p, given[name])
            elif p.get("required"):
                raise SpecError(where, prefix + name, "required parameter is missing")

    def _check_param(self, where, label, param, values):
        """Converts parameter strings as the schema's type says, then validates."""
        schema = self.deref(param.get("schema", {}))
        try:
            if schema.get("type") == "array":
                value = [self._from_string(self.deref(schema.get("items", {})), v) for v in values]
            elif len(values) != 1:
                raise ValueError(f"given {len(values)} times")
            else:
                value = self._from_string(schema, values[0])
        except ValueError as e:
            raise SpecError(where, label, str(e)) from None
        try:
            self._check(schema, value, "")
        except _Mismatch as e:
            raise SpecError(where, label + e.pointer, e.message) from None

    @staticmethod
    def _from_string(schema, text):
        kind = schema.get("type")
        if kind == "integer":
            if not re.fullmatch(r"-?[0-9]+", text):
                raise ValueError(f"expected an integer, got {text!r}")
            return int(text)
        if kind == "number":
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"expected a number, got {text!r}") from None
        if kind == "boolean":
            if text not in ("true", "false"):
                raise ValueError(f"expected true or false, got {text!r}")
            return text == "true"
        return text

    def _pattern(self, pattern):
        if pattern not in self._regex:
            self._regex[pattern] = re.compile(pattern)
        return self._regex[pattern]

    def _check(self, schema, value, ptr):
        schema = self.deref(schema)
        if schema is True or schema == {}:
            return
        if not isinstance(schema, dict):
            raise SpecError("spec", ptr, f"schema must be an object, got {schema!r}")
        for key in schema:
            if key not in KEYWORDS and key not in ANNOTATIONS and not key.startswith("x-"):
                raise SpecError("spec", ptr, f"unsupported schema keyword {key!r}")
        if value is None and schema.get("nullable"):
            return
        kind = schema.get("type")
        if kind is not None and not _type_ok(kind, value):
            if value is None:
                raise _Mismatch(ptr, f"null where {kind} is required (not nullable)")
            got = {bool: "boolean", int: "integer", float: "number", str: "string",
                   list: "array", dict: "object"}.get(type(value), type(value).__name__)
            raise _Mismatch(ptr, f"expected {kind}, got {got} {_show(value)}")
        if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
            raise _Mismatch(ptr, f"{_show(value)} is not one of {schema['enum']}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self._check_number(schema, value, ptr)
        elif isinstance(value, str):
            if len(value) < schema.get("minLength", 0):
                raise _Mismatch(ptr, f"shorter than minLength {schema['minLength']}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                raise _Mismatch(ptr, f"longer than maxLength {schema['maxLength']}")
            if "pattern" in schema and not self._pattern(schema["pattern"]).search(value):
                raise _Mismatch(ptr, f"{_show(value)} does not match {schema['pattern']!r}")
        elif isinstance(value, list):
            if len(value) < schema.get("minItems", 0):
                raise _Mismatch(ptr, f"fewer than minItems {schema['minItems']} items")
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                raise _Mismatch(ptr, f"more than maxItems {schema['maxItems']} items")
            if "items" in schema:
                for i, item in enumerate(value):
                    self._check(schema["items"], item, _ptr(ptr, i))
        elif isinstance(value, dict):
            self._check_object(schema, value, ptr)
        self._check_combinators(schema, value, ptr)

    def _check_number(self, schema, value, ptr):
        if "minimum" in schema:
            low, excl = schema["minimum"], schema.get("exclusiveMinimum", False)
            if value < low or (excl and value == low):
                raise _Mismatch(ptr, f"{value} is {'<=' if excl else '<'} minimum {low}")
        if "maximum" in schema:
            high, excl = schema["maximum"], schema.get("exclusiveMaximum", False)
            if value > high or (excl and value == high):
                raise _Mismatch(ptr, f"{value} is {'>=' if excl else '>'} maximum {high}")
        bounds = INT_RANGES.get(schema.get("format"))
        if bounds and not bounds[0] <= value <= bounds[1]:
            raise _Mismatch(ptr, f"{value} does not fit {schema['format']}")

    def _check_object(self, schema, value, ptr):
        for name in schema.get("required", []):
            if name not in value:
                raise _Mismatch(_ptr(ptr, name), "required field is missing")
        if len(value) < schema.get("minProperties", 0):
            raise _Mismatch(ptr, f"fewer than minProperties {schema['minProperties']} fields")
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            raise _Mismatch(ptr, f"more than maxProperties {schema['maxProperties']} fields")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                self._check(properties[name], item, _ptr(ptr, name))
            elif extra is False:
                raise _Mismatch(_ptr(ptr, name), "unknown field (additionalProperties is false)")
            elif extra is not True:
                self._check(extra, item, _ptr(ptr, name))

    def _check_combinators(self, schema, value, ptr):
        for sub in schema.get("allOf", []):
            self._check(sub, value, ptr)
        for key in ("anyOf", "oneOf"):
            if key not in schema:
                continue
            failures = []
            for sub in schema[key]:
                try:
                    self._check(sub, value, ptr)
                except _Mismatch as e:
                    failures.append(e)
            passed = len(schema[key]) - len(failures)
            if passed == 0:
                # The branch that got deepest is most likely the one meant: report its pointer.
                depths = sorted((f.pointer.count("/") for f in failures), reverse=True)
                deepest = max(failures, key=lambda f: f.pointer.count("/"))
                where = deepest.pointer if len(depths) == 1 or depths[0] > depths[1] else ptr
                raise _Mismatch(where, f"matches no {key} branch (" + "; ".join(
                    f"[{i}] {f.pointer or '/'}: {f.message}" for i, f in enumerate(failures)) + ")")
            if key == "oneOf" and passed > 1:
                raise _Mismatch(ptr, f"matches {passed} oneOf branches, exactly one allowed")
        if "not" in schema:
            try:
                self._check(schema["not"], value, ptr)
            except _Mismatch:
                return
            raise _Mismatch(ptr, "matches a schema it must not match")
