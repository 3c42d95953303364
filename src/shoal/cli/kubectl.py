"""`shoal apply|get|describe|delete|scale|rollout|logs|taint|label`: kubectl's commands
against Shoal's object API (docs/SERVING.md, ``/shoal/v1/kube``), same flags and output.

This module does the I/O: arguments, manifests, requests, polling. What is printed comes
from ``shoal.kube.fmt`` (pure). A user's mistake is one ``error: ...`` line and exit
status 1, as kubectl reports it; a refusal from the server is ``Error from server
(Reason): ...``; an unreachable server is reported as the other shoal commands do.
"""

from __future__ import annotations

import json
import os
import sys
import time

from shoal.cli import kubedescribe as kd
from shoal.kube import fmt as kf
from shoal.api_client import Client, ClientError, fail

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from collections.abc import Callable, Iterable
    from typing import Any, TextIO

API = "/shoal/v1/kube"
DEFAULT_NAMESPACE = "default"
CLUSTER_SCOPED = frozenset({"Namespace", "PriorityClass", "Node"})
MANIFEST_EXTENSIONS = (".json", ".yaml", ".yml")
HTTP_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    409: "Conflict", 410: "Gone", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
    503: "ServiceUnavailable", 504: "Timeout",
}  # fmt: skip


class CommandError(Exception):
    """A mistake in what the user asked; printed as ``error: <message>``."""


# ---------------------------------------------------------------- server access


class Kube:
    """The object API as the commands use it: Kubernetes-shaped dicts in and out."""

    def __init__(self, client: Client):
        self.client = client

    @staticmethod
    def _ns(r: kf.Resource, namespace: str | None) -> str:
        return (namespace or DEFAULT_NAMESPACE) if r.namespaced else "_"

    def list(self, r: kf.Resource, namespace: str | None, selector: str | None = None) -> list[dict]:
        """Objects of a kind; ``namespace`` None means every namespace."""
        if r.plural == "nodes":
            items = self.nodes()
            if selector:
                items = [n for n in items if selector_text_matches(selector, kf.meta(n).get("labels") or {})]
            return items
        params = {"namespace": namespace if r.namespaced and namespace else "all", "selector": selector or None}
        return list(self.client.get(f"{API}/objects/{r.plural}", params).get("items") or [])

    def get(self, r: kf.Resource, namespace: str | None, name: str) -> dict:
        if r.plural == "nodes":
            return self.node(name)
        try:
            return self.client.get(f"{API}/objects/{r.plural}/{self._ns(r, namespace)}/{name}")
        except ClientError as e:
            if e.status == 404:
                raise ClientError(f'{r.qualified_plural} "{name}" not found', 404, e.body) from None
            raise

    def delete(self, r: kf.Resource, namespace: str | None, name: str, grace_period: int | None = None) -> None:
        path = f"{API}/objects/{r.plural}/{self._ns(r, namespace)}/{name}"
        if grace_period is not None and grace_period >= 0:
            path += f"?grace_period={grace_period}"
        try:
            self.client.delete(path)
        except ClientError as e:
            if e.status == 404:
                raise ClientError(f'{r.qualified_plural} "{name}" not found', 404, e.body) from None
            raise

    def nodes(self) -> list[dict]:
        from shoal import __version__

        return [kf.node_object(n, f"v{__version__}") for n in self.client.get("/shoal/v1/nodes").get("nodes") or []]

    def raw_node(self, name: str) -> dict:
        try:
            return self.client.get(f"/shoal/v1/nodes/{name}")
        except ClientError as e:
            if e.status == 404:
                raise ClientError(f'nodes "{name}" not found', 404, e.body) from None
            raise

    def node(self, name: str) -> dict:
        from shoal import __version__

        return kf.node_object(self.raw_node(name), f"v{__version__}")

    def events(self, namespace: str | None) -> list[dict] | None:
        """Events for describe; None (no Events section) when the server will not list them."""
        try:
            return self.list(kf.BY_PLURAL["events"], namespace)
        except ClientError as e:
            if e.status is None:
                raise
            return None


def selector_text_matches(text: str, labels: dict) -> bool:
    """A label selector in kubectl's text form (``a=b,c!=d,e,!f,g in (x,y)``) against labels."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for part in (p.strip() for p in parts):
        if not part:
            continue
        for op in (" notin ", " in "):
            if op in part:
                key, _, values = part.partition(op)
                vals = {v.strip() for v in values.strip().strip("()").split(",")}
                inside = labels.get(key.strip()) in vals
                if (op == " in " and not inside) or (op == " notin " and inside):
                    return False
                break
        else:
            if "!=" in part:
                key, _, value = part.partition("!=")
                if labels.get(key.strip()) == value.strip():
                    return False
            elif "=" in part:
                key, _, value = part.partition("==" if "==" in part else "=")
                if labels.get(key.strip()) != value.strip():
                    return False
            elif part.startswith("!"):
                if part[1:].strip() in labels:
                    return False
            elif part not in labels:
                return False
    return True


# ---------------------------------------------------------------- errors and output


def _server_error(e: ClientError) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    reason = body.get("reason") if isinstance(body.get("reason"), str) else None
    return f"Error from server ({reason or HTTP_REASONS.get(e.status or 0, 'InternalError')}): {e}"


def _guard(run: Callable[[Any], int]) -> Callable[[Any], int]:
    """Run a command, turning every expected failure into kubectl's one-line message."""

    def wrapper(args) -> int:
        try:
            return run(args)
        except CommandError as e:
            print(f"error: {e}", file=sys.stderr)
        except (kf.KindError, kf.TaintError, kf.RolloutError) as e:
            print(f"error: {e}", file=sys.stderr)
        except ClientError as e:
            if e.status is None:
                fail(str(e))
            print(_server_error(e), file=sys.stderr)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

    wrapper.__name__ = run.__name__
    wrapper.__doc__ = run.__doc__
    return wrapper


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _client() -> Kube:
    return Kube(Client.from_config())


def _namespace(args) -> str:
    return getattr(args, "namespace", None) or os.environ.get("SHOAL_NAMESPACE") or DEFAULT_NAMESPACE


def parse_targets(words: list[str], command: str = "get") -> list[tuple[kf.Resource, list[str]]]:
    """kubectl's resource arguments: ``pods a b``, ``deploy,svc``, ``all``, ``pod/a deploy/b``."""
    if not words:
        if command == "get":
            raise CommandError("You must specify the type of resource to get. Shoal has: "
                               + ", ".join(f"{r.plural} ({', '.join(r.short)})" for r in kf.RESOURCES))
        raise CommandError("you must provide one or more resources by argument or filename")
    if any("/" in w for w in words):
        out: list[tuple[kf.Resource, list[str]]] = []
        for w in words:
            kind, slash, name = w.partition("/")
            if not slash or not name:
                raise CommandError("there is no need to specify a resource type as a separate argument when "
                                   "passing arguments in resource/name form (e.g. 'shoal get resource/<resource_name>'"
                                   " instead of 'shoal get resource resource/<resource_name>'")
            r = kf.resolve_kind(kind)
            if out and out[-1][0] == r:
                out[-1][1].append(name)
            else:
                out.append((r, [name]))
        return out
    kinds = kf.resolve_kinds(words[0])
    return [(r, list(words[1:])) for r in kinds]


def _one_target(words: list[str], command: str) -> tuple[kf.Resource, str]:
    """``deployment/NAME`` or ``deployment NAME`` for the commands about one object."""
    targets = parse_targets(words, command)
    if len(targets) != 1 or len(targets[0][1]) != 1:
        raise CommandError(f"{command} needs exactly one resource, e.g. deployment/NAME")
    return targets[0][0], targets[0][1][0]


# ---------------------------------------------------------------- apply (and manifests)


def parse_manifest(source: str, text: str) -> list[dict]:
    """The objects in one file's text: YAML (multi-document) or JSON; ``kind: List`` expanded."""
    stripped = text.lstrip()
    if source.endswith(".json") or stripped.startswith(("{", "[")):
        import json

        try:
            loaded = [json.loads(text)]
        except ValueError as e:
            if source.endswith(".json"):
                raise CommandError(f"error parsing {source}: {e}") from None
            loaded = None
    else:
        loaded = None
    if loaded is None:
        import yaml  # only for manifests: it costs start-up time

        try:
            loaded = list(yaml.safe_load_all(text))
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = f"line {mark.line + 1}: " if mark is not None else ""
            raise CommandError(f"error parsing {source}: error converting YAML to JSON: yaml: {line}"
                               f"{e.problem or e.context or 'invalid YAML'}") from None
        except yaml.YAMLError as e:
            raise CommandError(f"error parsing {source}: error converting YAML to JSON: yaml: {e}") from None
    docs: list[dict] = []
    for doc in loaded:
        if doc is None:
            continue
        if isinstance(doc, list):
            items = doc
        elif isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items") or []
        else:
            items = [doc]
        for item in items:
            if not isinstance(item, dict):
                raise CommandError(f'error validating "{source}": error validating data: the document is not an '
                                   f"object (a mapping with apiVersion, kind and metadata)")
            missing = [f"{k} not set" for k in ("apiVersion", "kind") if not item.get(k)]
            if missing:
                raise CommandError(f'error validating "{source}": error validating data: [{", ".join(missing)}]')
            docs.append(item)
    return docs


def _manifest_files(path: str, recursive: bool) -> list[str]:
    if not os.path.isdir(path):
        return [path]
    found = []
    if recursive:
        for root, dirs, files in os.walk(path):
            dirs.sort()
            found.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(MANIFEST_EXTENSIONS))
    else:
        found = [os.path.join(path, f) for f in sorted(os.listdir(path))
                 if f.endswith(MANIFEST_EXTENSIONS) and os.path.isfile(os.path.join(path, f))]
    return found


def read_manifests(paths: Iterable[str], recursive: bool = False, stdin: TextIO | None = None
                   ) -> list[tuple[str, dict]]:
    """(source, object) for every object in the -f arguments: files, directories, ``-``."""
    out: list[tuple[str, dict]] = []
    for path in paths:
        if path == "-":
            text = (stdin or sys.stdin).read()
            out.extend(("STDIN", d) for d in parse_manifest("STDIN", text))
            continue
        if not os.path.exists(path):
            raise CommandError(f'the path "{path}" does not exist')
        for name in _manifest_files(path, recursive):
            try:
                with open(name, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise CommandError(f'error reading "{name}": {e.strerror}') from None
            except UnicodeDecodeError:
                raise CommandError(f'error reading "{name}": not UTF-8 text') from None
            out.extend((name, d) for d in parse_manifest(name, text))
    return out


def set_namespace(docs: Iterable[dict], namespace: str) -> None:
    """``-n``: the namespace of namespaced objects that name none; a different one is an error."""
    for doc in docs:
        if doc.get("kind") in CLUSTER_SCOPED:
            continue
        md = doc.setdefault("metadata", {})
        if not isinstance(md, dict):
            continue
        have = md.get("namespace")
        if have and have != namespace:
            raise CommandError(f'the namespace from the provided object "{have}" does not match the namespace '
                               f'"{namespace}". You must pass \'--namespace={have}\' to perform this operation.')
        md["namespace"] = namespace


def apply_error_lines(errors: Iterable[dict], sources: list[str]) -> list[str]:
    """The server's 422 errors (each naming its document's index) as kubectl's lines, one per
    bad document, naming the file the document came from."""
    by_doc: dict[int, list[str]] = {}
    for e in errors:
        i = e.get("document")
        i = int(i) if isinstance(i, int) or (isinstance(i, str) and i.isdigit()) else -1
        text = f"{e['path']}: {e.get('message', '')}" if e.get("path") else str(e.get("message", ""))
        by_doc.setdefault(i, []).append(text)
    lines = []
    for i, items in by_doc.items():
        source = sources[i] if 0 <= i < len(sources) else (sources[0] if len(set(sources)) == 1 else "STDIN")
        lines.append(f'error: error validating "{source}": error validating data: [{", ".join(items)}]')
    return lines


def apply_result_lines(results: Iterable[dict], dry_run: str) -> list[str]:
    suffix = {"client": " (dry run)", "server": " (server dry run)"}.get(dry_run, "")
    lines = []
    for res in results:
        r = kf.BY_KIND.get(res.get("kind") or "")
        kind = r.qualified if r else str(res.get("kind") or "").lower()
        lines.append(f"{kind}/{res.get('name', '')} {res.get('action', 'configured')}{suffix}")
    return lines


@_guard
def run_apply(args) -> int:
    """kubectl apply -f."""
    if not args.filename:
        raise CommandError("must specify -f FILE (a manifest, a directory of them, or - for stdin)")
    sourced = read_manifests(args.filename, args.recursive)
    if not sourced:
        raise CommandError("no objects passed to apply")
    docs = [d for _, d in sourced]
    if args.namespace:
        set_namespace(docs, args.namespace)
    api = _client()
    try:
        out = api.client.post(f"{API}/apply", {"documents": docs, "dry_run": args.dry_run != "none"})
    except ClientError as e:
        detail = e.body.get("detail") if isinstance(e.body, dict) else None
        if e.status == 422 and isinstance(detail, dict) and isinstance(detail.get("errors"), list):
            for line in apply_error_lines(detail["errors"], [s for s, _ in sourced]):
                print(line, file=sys.stderr)
            return 1
        raise
    for w in out.get("warnings") or ():
        print(f"Warning: {w}", file=sys.stderr)
    order = {(d.get("kind"), (d.get("metadata") or {}).get("name")): i for i, d in reversed(list(enumerate(docs)))}
    results = sorted(out.get("results") or [], key=lambda r: order.get((r.get("kind"), r.get("name")), len(docs)))
    _out("".join(line + "\n" for line in apply_result_lines(results, args.dry_run)))
    return 0


# ---------------------------------------------------------------- get


def _no_resources(namespace: str | None, cluster_only: bool) -> str:
    if namespace is None or cluster_only:
        return "No resources found"
    return f"No resources found in {namespace} namespace."


def _fetch(api: Kube, r: kf.Resource, names: list[str], namespace: str | None, selector: str | None,
           errors: list[str]) -> list[dict]:
    if not names:
        return api.list(r, namespace, selector)
    items = []
    for name in names:
        try:
            items.append(api.get(r, namespace, name))
        except ClientError as e:
            if e.status is None:
                raise
            errors.append(_server_error(e))
    return items


@_guard
def run_get(args) -> int:
    """kubectl get."""
    targets = parse_targets(args.resources)
    output = args.output or ""
    if output not in ("", "wide", "yaml", "json", "name"):
        raise CommandError(f'unable to match a printer suitable for the output format "{output}", allowed formats '
                           "are: json,name,wide,yaml")
    namespace = None if args.all_namespaces else _namespace(args)
    api = _client()
    if args.watch:
        if len(targets) != 1:
            raise CommandError("you may only specify a single resource type")
        return _watch(api, targets[0][0], targets[0][1], namespace, args)
    errors: list[str] = []
    fetched = [(r, _fetch(api, r, names, namespace, args.selector, errors)) for r, names in targets]
    now = time.time()
    if output in ("yaml", "json"):
        objs = [o for _, items in fetched for o in items]
        single = len(targets) == 1 and len(targets[0][1]) == 1 and len(objs) == 1
        if objs or not errors:
            doc = objs[0] if single else kf.as_list(objs)
            _out(kf.render_yaml(doc) if output == "yaml" else kf.render_json(doc))
    elif output == "name":
        _out("".join(kf.qualified_name({**o, "kind": r.kind}) + "\n" for r, items in fetched for o in items))
    else:
        with_kind = len(targets) > 1 or any(w.lower() == "all" for w in args.resources[0].split(","))
        tables = [kf.render_table(r, items, now, wide=output == "wide", with_namespace=namespace is None,
                                  with_kind=with_kind, show_labels=args.show_labels, headers=not args.no_headers)
                  for r, items in fetched if items]
        _out("\n".join(tables))
    for line in errors:
        print(line, file=sys.stderr)
    if not any(items for _, items in fetched) and not errors and output not in ("yaml", "json"):
        print(_no_resources(namespace, all(not r.namespaced for r, _ in targets)), file=sys.stderr)
    return 1 if errors else 0


def _version_of(obj: dict) -> str:
    rv = kf.meta(obj).get("resourceVersion")
    if rv:
        return str(rv)
    import json

    return json.dumps(obj, sort_keys=True)


def _watch(api: Kube, r: kf.Resource, names: list[str], namespace: str | None, args,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """``get -w``: the table, then a row for each object that changes, polled every second."""
    wide = args.output == "wide"
    ns_col = namespace is None
    widths: list[int] = []
    seen: dict[tuple[str, str], tuple[str, dict]] = {}
    header_done = args.no_headers
    first = True
    while True:
        errors: list[str] = []
        items = _fetch(api, r, names, namespace, args.selector, errors)
        now = time.time()
        changed = []
        current = {}
        for o in items:
            key = (kf.meta(o).get("namespace") or "", kf.meta(o).get("name") or "")
            current[key] = (_version_of(o), o)
            if seen.get(key, ("",))[0] != current[key][0]:
                changed.append(o)
        gone = [o for key, (_, o) in seen.items() if key not in current]
        seen = current
        rows = changed + gone
        if first and errors:
            for line in errors:
                print(line, file=sys.stderr)
            if not items:
                return 1
        if rows:
            table_rows = [] if header_done else [kf.table_header(r, wide, ns_col and r.namespaced, args.show_labels)]
            header_done = True
            table_rows += [kf.table_row(r, o, now, wide, ns_col and r.namespaced, False, args.show_labels)
                           for o in rows]
            _out(kf.table(table_rows, widths))
        first = False
        sleep(1.0)


# ---------------------------------------------------------------- describe


def describe_text(api: Kube, r: kf.Resource, obj: dict, now: float) -> str:
    """One object's ``kubectl describe`` text, with what it needs fetched alongside."""
    md = kf.meta(obj)
    ns = md.get("namespace") or None
    name = md.get("name", "")
    if r.plural == "pods":
        return kd.describe_pod(obj, _events(api, "Pod", name, ns), now)
    if r.plural == "deployments":
        rs = api.list(kf.BY_PLURAL["replicasets"], ns)
        return kd.describe_deployment(obj, rs, _events(api, "Deployment", name, ns), now)
    if r.plural == "replicasets":
        pods = [p for p in api.list(kf.BY_PLURAL["pods"], ns)
                if any(ref.get("uid") == md.get("uid") for ref in kf.meta(p).get("ownerReferences") or ())]
        return kd.describe_replicaset(obj, pods, _events(api, "ReplicaSet", name, ns), now)
    if r.plural == "services":
        pods = api.list(kf.BY_PLURAL["pods"], ns)
        return kd.describe_service(obj, pods, _events(api, "Service", name, ns), now)
    if r.plural == "horizontalpodautoscalers":
        return kd.describe_hpa(obj, _events(api, "HorizontalPodAutoscaler", name, ns), now)
    if r.plural == "nodes":
        pods = [p for p in api.list(kf.BY_PLURAL["pods"], None) if (p.get("spec") or {}).get("nodeName") == name]
        return kd.describe_node(obj, pods, _events(api, "Node", name, None), now)
    if r.plural == "namespaces":
        return kd.describe_namespace(obj)
    if r.plural == "priorityclasses":
        return kd.describe_priorityclass(obj, _events(api, "PriorityClass", name, None), now)
    raise CommandError(f"describe is not supported for {r.plural}; use 'shoal get {r.plural} -o yaml'")


def _events(api: Kube, kind: str, name: str, namespace: str | None) -> list[dict] | None:
    events = api.events(namespace)
    return None if events is None else kd.events_about(events, kind, name, namespace)


@_guard
def run_describe(args) -> int:
    """kubectl describe."""
    targets = parse_targets(args.resources, "describe")
    namespace = None if args.all_namespaces else _namespace(args)
    api = _client()
    texts: list[str] = []
    errors: list[str] = []
    for r, names in targets:
        if r.plural == "events":
            raise CommandError("describe is not supported for events; use 'shoal get events'")
        if names:
            objs = _fetch(api, r, names, namespace, None, errors)
        else:
            objs = api.list(r, namespace, args.selector)
        now = time.time()
        texts.extend(describe_text(api, r, o, now) for o in objs)
    _out("\n\n".join(texts))
    for line in errors:
        print(line, file=sys.stderr)
    if not texts and not errors:
        print(_no_resources(namespace, all(not r.namespaced for r, _ in targets)), file=sys.stderr)
    return 1 if errors else 0


# ---------------------------------------------------------------- delete, scale


@_guard
def run_delete(args) -> int:
    """kubectl delete."""
    api = _client()
    todo: list[tuple[kf.Resource, str | None, str]] = []
    if args.filename:
        for _, doc in read_manifests(args.filename, args.recursive):
            r = kf.resolve_kind(str(doc.get("kind")))
            md = doc.get("metadata") or {}
            todo.append((r, md.get("namespace") or _namespace(args), md.get("name") or ""))
    else:
        for r, names in parse_targets(args.resources, "delete"):
            if r.plural == "nodes":
                raise CommandError("nodes cannot be deleted here: drain one with 'scontrol update nodename=NAME "
                                   "state=drain reason=...'")
            if names:
                todo.extend((r, _namespace(args), n) for n in names)
            elif args.all or args.selector:
                todo.extend((r, kf.meta(o).get("namespace") or None, kf.meta(o).get("name", ""))
                            for o in api.list(r, _namespace(args), args.selector))
            else:
                raise CommandError("resource(s) were provided, but no name was specified")
    grace = 1 if args.now else args.grace_period
    rc = 0
    for r, ns, name in todo:
        try:
            api.delete(r, ns, name, grace)
        except ClientError as e:
            if e.status is None:
                raise
            if not (args.ignore_not_found and e.status == 404):
                print(_server_error(e), file=sys.stderr)
                rc = 1
            continue
        _out(f'{r.qualified} "{name}" deleted\n')
    if not todo and not args.filename:
        print("No resources found", file=sys.stderr)
    return rc


@_guard
def run_scale(args) -> int:
    """kubectl scale --replicas."""
    if args.replicas is None or args.replicas < 0:
        raise CommandError("The --replicas=COUNT flag is required, and COUNT must be greater than or equal to 0")
    api = _client()
    for r, names in parse_targets(args.resources, "scale"):
        if r.plural != "deployments":
            raise CommandError(f'no scaler has been implemented for {{"" "{r.kind}"}}: Shoal scales Deployments')
        if not names:
            raise CommandError("resource(s) were provided, but no name was specified")
        for name in names:
            ns = _namespace(args)
            try:
                api.client.post(f"{API}/objects/deployments/{ns}/{name}/scale", {"replicas": args.replicas})
            except ClientError as e:
                if e.status == 404:
                    raise ClientError(f'{r.qualified_plural} "{name}" not found', 404, e.body) from None
                raise
            _out(f"{r.qualified}/{name} scaled\n")
    return 0


# ---------------------------------------------------------------- rollout


def watch_rollout(fetch: Callable[[], dict], out: Callable[[str], None], *, timeout_s: float = 0.0,
                  watch: bool = True, revision: int = 0, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep, interval: float = 1.0) -> int:
    """``rollout status``: poll the Deployment, print each new progress line, until it is
    rolled out (0), fails (RolloutError) or ``timeout_s`` passes (0 waits for ever)."""
    deadline = clock() + timeout_s if timeout_s > 0 else None
    last = None
    while True:
        line, done = kf.rollout_status(fetch(), revision)
        if line != last:
            out(line + "\n")
            last = line
        if done or not watch:
            return 0
        if deadline is not None and clock() >= deadline:
            raise kf.RolloutError("timed out waiting for the condition")
        sleep(interval if deadline is None else max(0.0, min(interval, deadline - clock())))


def _deployment_target(args, command: str) -> tuple[kf.Resource, str]:
    r, name = _one_target(args.resources, command)
    if r.plural != "deployments":
        raise CommandError(f'no {command} has been implemented for {r.plural}: Shoal rolls out Deployments')
    return r, name


@_guard
def run_rollout(args) -> int:
    """kubectl rollout status|history|undo|restart."""
    r, name = _deployment_target(args, f"rollout {args.action}")
    ns = _namespace(args)
    api = _client()
    base = f"{API}/objects/deployments/{ns}/{name}"
    if args.action == "status":
        try:
            timeout = kf.parse_go_duration(args.timeout)
        except ValueError as e:
            raise CommandError(f'invalid argument "{args.timeout}" for "--timeout" flag: {e}') from None
        return watch_rollout(lambda: api.get(r, ns, name), _out, timeout_s=timeout, watch=args.watch,
                             revision=args.revision or 0)
    if args.action == "history":
        api.get(r, ns, name)  # NotFound as kubectl words it
        revisions = api.client.get(f"{base}/history").get("revisions") or []
        if args.revision:
            match = [rv for rv in revisions if int(rv.get("revision") or 0) == args.revision]
            if not match:
                raise CommandError("unable to find the specified revision")
            _out(f"{r.qualified}/{name} with revision #{args.revision}\n"
                 f"{kd.pod_template_text(match[0].get('template'))}\n")
        else:
            _out(kf.history_table(f"{r.qualified}/{name}", revisions))
        return 0
    if args.action == "undo":
        api.get(r, ns, name)
        api.client.post(f"{base}/undo", {"to_revision": args.to_revision or 0})
        _out(f"{r.qualified}/{name} rolled back\n")
        return 0
    # restart: the template annotation kubectl sets, applied like any other change
    obj = api.get(r, ns, name)
    doc = restart_document(obj, kf.rfc3339_local(time.time()))
    api.client.post(f"{API}/apply", {"documents": [doc], "dry_run": False})
    _out(f"{r.qualified}/{name} restarted\n")
    return 0


SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                 "deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences")


def restart_document(obj: dict, stamp: str) -> dict:
    """The Deployment as the user would apply it, with kubectl.kubernetes.io/restartedAt set."""
    import json

    doc = json.loads(json.dumps(obj))
    doc.pop("status", None)
    md = doc.setdefault("metadata", {})
    for k in SERVER_FIELDS:
        md.pop(k, None)
    template = doc.setdefault("spec", {}).setdefault("template", {})
    tmd = template.setdefault("metadata", {})
    tmd.setdefault("annotations", {})["kubectl.kubernetes.io/restartedAt"] = stamp
    return doc


# ---------------------------------------------------------------- logs


def _logging_order(pod: dict, now: float) -> tuple:
    """kubectl's ByLogging: assigned, running, ready (longest first), most restarts, oldest."""
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    ready = kf.pod_is_ready(pod)
    ready_since = next((kf.parse_time(c.get("lastTransitionTime")) for c in st.get("conditions") or ()
                        if c.get("type") == "Ready"), None)
    restarts = max([int(c.get("restartCount") or 0) for c in st.get("containerStatuses") or ()] or [0])
    created = kf.parse_time(kf.meta(pod).get("creationTimestamp"))
    return (not spec.get("nodeName"), {"Running": 0, "Unknown": 1, "Pending": 2}.get(st.get("phase"), 3),
            not ready, ready_since if ready and ready_since is not None else now * 2, -restarts,
            created if created is not None else now * 2)


def pick_pod(pods: list[dict], now: float) -> dict | None:
    return min(pods, key=lambda p: _logging_order(p, now)) if pods else None


def _pod_of(api: Kube, r: kf.Resource, ns: str, name: str, verb: str, having: str) -> dict:
    """The pod a command naming a pod, Deployment or ReplicaSet means: for an owner, the pod
    kubectl would pick (ByLogging order), saying so when it had several."""
    if r.plural == "pods":
        return api.get(r, ns, name)
    if r.plural not in ("deployments", "replicasets"):
        raise CommandError(f"cannot {verb} {r.plural}: pods, deployments and replicasets {having}")
    owner = api.get(r, ns, name)
    selector = (owner.get("spec") or {}).get("selector") or {}
    match = ",".join(f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())) or None
    pods = [p for p in api.list(kf.BY_PLURAL["pods"], ns, match)
            if kf.selector_matches(selector, kf.meta(p).get("labels") or {})]
    pod = pick_pod(pods, time.time())
    if pod is None:
        raise CommandError(f"no pods found for {r.qualified}/{name}")
    if len(pods) > 1:
        print(f"Found {len(pods)} pods, using pod/{kf.meta(pod).get('name')}", file=sys.stderr)
    return pod


def default_container(pod: dict) -> tuple[str | None, list[str]]:
    """The container ``logs`` reads without -c: kubectl.kubernetes.io/default-container, else the first."""
    names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or ()]
    chosen = (kf.meta(pod).get("annotations") or {}).get("kubectl.kubernetes.io/default-container")
    if chosen not in names:
        chosen = names[0] if names else None
    return chosen, names


@_guard
def run_logs(args) -> int:
    """kubectl logs."""
    if "/" in args.target:
        r, name = _one_target([args.target], "logs")
    else:
        r, name = kf.BY_PLURAL["pods"], args.target
    ns = _namespace(args)
    api = _client()
    pod = _pod_of(api, r, ns, name, "get logs from", "have logs")
    pod_name = kf.meta(pod).get("name", "")
    container = args.container or args.container_arg  # `logs POD CONTAINER`, as kubectl allows
    if not container:
        container, names = default_container(pod)
        if len(names) > 1:
            print(f'Defaulted container "{container}" out of: {", ".join(names)}', file=sys.stderr)
    params = {"container": container, "previous": "true" if args.previous else None,
              "follow": "true" if args.follow else None, "tail": args.tail if args.tail >= 0 else None}
    out = sys.stdout.buffer
    for chunk in api.client.stream(f"{API}/pods/{ns}/{pod_name}/log", params,
                                   read_timeout=None if args.follow else api.client.timeout):
        out.write(chunk)
        out.flush()
    return 0


# ---------------------------------------------------------------- taint, label, exec


def _node_target(words: list[str], command: str) -> tuple[str, list[str]]:
    if not words:
        raise CommandError(f"at least one resource name must be specified, e.g. 'shoal {command} node NAME ...'")
    if "/" in words[0]:
        kind, _, name = words[0].partition("/")
        rest = words[1:]
    else:
        if len(words) < 2:
            raise CommandError(f"at least one resource name must be specified, e.g. 'shoal {command} node NAME ...'")
        kind, name, rest = words[0], words[1], words[2:]
    r = kf.resolve_kind(kind)
    if r.plural != "nodes":
        raise CommandError(f"invalid resource type {kind}, only node types are supported")
    return name, rest


@_guard
def run_taint(args) -> int:
    """kubectl taint node NAME key=value:Effect key:Effect-."""
    name, specs = _node_target(args.args, "taint")
    add, remove = kf.parse_taints(specs)
    api = _client()
    node = api.raw_node(name)
    if "taints" not in node:  # the whole list is replaced: never from a guess of the old one
        raise CommandError(f"the server does not report node {name}'s taints; it is too old for shoal taint")
    operation, taints = kf.apply_taints(name, node["taints"] or [], add, remove, args.overwrite)
    api.client.patch(f"/shoal/v1/nodes/{name}", {"taints": taints})
    _out(f"node/{name} {operation}\n")
    return 0


@_guard
def run_label(args) -> int:
    """kubectl label node NAME key=value key-."""
    name, specs = _node_target(args.args, "label")
    if not specs:
        raise CommandError("at least one label update is required")
    add, remove = kf.parse_label_changes(specs)
    api = _client()
    labels = dict(api.raw_node(name).get("labels") or {})
    if not args.overwrite:
        for k, v in add.items():
            if k in labels and labels[k] != v:
                raise CommandError(f"'{k}' already has a value ({labels[k]}), and --overwrite is false")
    change: dict[str, str | None] = {}
    for key in remove:
        if key not in labels:
            print(f'label "{key}" not found.')
        else:
            change[key] = None
    change.update({k: v for k, v in add.items() if labels.get(k) != v})
    if change:
        api.client.patch(f"/shoal/v1/nodes/{name}", {"labels": change})
    added = any(v is not None for v in change.values())
    message = "not labeled" if not change else "labeled" if added or args.overwrite else "unlabeled"
    _out(f"node/{name} {message}\n")
    return 0


@_guard
def run_exec(args) -> int:
    """kubectl exec POD|deployment/NAME [-c C] [-i] -- COMMAND ...: the command's output, and its
    exit code as ours. Without a terminal: -t is refused, -i sends our stdin (read to its end)."""
    _exec_words(args)
    words = args.args
    if args.tty:
        raise CommandError("exec: -t (a terminal) is not supported: run a command without -t, e.g. "
                           "'shoal exec POD -- ls /'; for an interactive shell on a node use 'srun --pty bash'")
    if not words:
        raise CommandError("exec: a pod name and a command are required: 'shoal exec POD -- COMMAND [ARGS...]'")
    target, command = words[0], words[1:]
    if args.container is not None and not args.container:
        raise CommandError("exec: -c needs a container name")
    if not command:
        raise CommandError(f"exec: you must specify at least one command for the container: "
                           f"'shoal exec {target} -- COMMAND [ARGS...]'")
    ns = _namespace(args)
    api = _client()
    if "/" in target:
        r, name = _one_target([target], "exec")
        target = kf.meta(_pod_of(api, r, ns, name, "exec into", "have containers")).get("name", "")
    body = {"command": command, "container": args.container,
            "stdin": sys.stdin.read() if args.stdin else ""}
    exit_code = 0
    buf = b""
    for chunk in api.client.stream(f"{API}/pods/{ns}/{target}/exec", read_timeout=None, method="POST", body=body):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if not line:
                continue
            doc = json.loads(line)
            if "exit" in doc:
                rc, sig = next(iter(doc["exit"].values()), (1, 0))
                exit_code = rc or (128 + sig if sig else 0)
            else:
                out = sys.stdout if "o" in doc else sys.stderr
                out.write(doc.get("o", doc.get("e", "")))
                out.flush()
    if exit_code:
        print(f"command terminated with exit code {exit_code}", file=sys.stderr)
    return exit_code


def _exec_words(args) -> None:
    """kubectl takes exec's flags anywhere before ``--``: parse those that came after the pod
    name into ``args``, and leave ``args.args`` = [POD, COMMAND...]."""
    import argparse

    words = list(args.args)
    if "--" in words:
        cut = words.index("--")
        head, command = words[:cut], words[cut + 1:]
    else:  # kubectl's deprecated form: exec POD COMMAND
        head, command = words[:1], words[1:]
        if command:
            print("shoal exec POD COMMAND is deprecated, as in kubectl: use shoal exec POD -- COMMAND",
                  file=sys.stderr)
    p = argparse.ArgumentParser(prog="shoal exec", add_help=False)
    p.add_argument("pod", nargs="?")
    p.add_argument("-c", "--container")
    p.add_argument("-n", "--namespace")
    p.add_argument("-i", "--stdin", action="store_true")
    p.add_argument("-t", "--tty", action="store_true")
    more, unknown = p.parse_known_args(head)
    if unknown:
        raise CommandError(f"exec: unknown flag or extra word before '--': {' '.join(unknown)}")
    for k in ("container", "namespace"):
        if getattr(more, k) is not None:
            setattr(args, k, getattr(more, k))
    args.stdin = args.stdin or more.stdin
    args.tty = args.tty or more.tty
    args.args = ([more.pod] if more.pod else []) + command


# ---------------------------------------------------------------- argument parsing


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "t"):
        return True
    if text.lower() in ("false", "0", "no", "f"):
        return False
    import argparse

    raise argparse.ArgumentTypeError(f'invalid boolean "{text}" (true or false)')


def _namespace_flags(p, all_namespaces: bool = False) -> None:
    p.add_argument("-n", "--namespace", help="the namespace (default: default, or $SHOAL_NAMESPACE)")
    if all_namespaces:
        p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")


def _file_flags(p) -> None:
    p.add_argument("-f", "--filename", action="append", default=[], metavar="FILE",
                   help="a manifest file, a directory of them, or - for stdin (repeatable)")
    p.add_argument("-R", "--recursive", action="store_true", help="look into directories' subdirectories")


def add_parsers(sub) -> None:
    """Add the kubectl-style commands to ``shoal``'s subparsers; each sets ``args.kubectl``."""
    import argparse  # already loaded by shoal.cli.main, which calls this
    p = sub.add_parser("apply", help="create or update objects from manifests (kubectl apply)")
    _file_flags(p)
    _namespace_flags(p)
    p.add_argument("--dry-run", nargs="?", const="client", default="none", choices=["none", "client", "server"],
                   help="validate and report, change nothing")
    p.set_defaults(kubectl=run_apply)

    p = sub.add_parser("get", help="list objects: pods, deployments, services, hpa, nodes, ... (kubectl get)")
    p.add_argument("resources", nargs="*", metavar="KIND [NAME ...]")
    _namespace_flags(p, all_namespaces=True)
    p.add_argument("-o", "--output", help="wide, yaml, json or name")
    p.add_argument("-l", "--selector", help="label selector, e.g. app=vllm,tier!=cache")
    p.add_argument("-w", "--watch", action="store_true", help="after listing, print changes (every second)")
    p.add_argument("--show-labels", action="store_true", help="add a LABELS column")
    p.add_argument("--no-headers", action="store_true", help="no header line")
    p.set_defaults(kubectl=run_get)

    p = sub.add_parser("describe", help="show an object in detail, with its events (kubectl describe)")
    p.add_argument("resources", nargs="+", metavar="KIND [NAME ...]")
    _namespace_flags(p, all_namespaces=True)
    p.add_argument("-l", "--selector", help="label selector")
    p.set_defaults(kubectl=run_describe)

    p = sub.add_parser("delete", help="delete objects by name or manifest (kubectl delete)")
    p.add_argument("resources", nargs="*", metavar="KIND NAME ...")
    _file_flags(p)
    _namespace_flags(p)
    p.add_argument("-l", "--selector", help="delete the objects this label selector picks")
    p.add_argument("--all", action="store_true", help="every object of the kind in the namespace")
    p.add_argument("--grace-period", type=int, default=None, metavar="SECONDS",
                   help="seconds the pods get to stop (default: their terminationGracePeriodSeconds)")
    p.add_argument("--now", action="store_true", help="same as --grace-period=1")
    p.add_argument("--ignore-not-found", action="store_true", help="a missing object is not an error")
    p.set_defaults(kubectl=run_delete)

    p = sub.add_parser("scale", help="set a Deployment's replicas (kubectl scale)")
    p.add_argument("resources", nargs="+", metavar="deployment/NAME")
    p.add_argument("--replicas", type=int, required=True)
    _namespace_flags(p)
    p.set_defaults(kubectl=run_scale)

    p = sub.add_parser("rollout", help="watch, list, undo or restart a Deployment's rollouts (kubectl rollout)")
    p.add_argument("action", choices=["status", "history", "undo", "restart"])
    p.add_argument("resources", nargs="+", metavar="deployment/NAME")
    _namespace_flags(p)
    p.add_argument("--timeout", default="0s", help="status: give up after this long, e.g. 5m (0s: never)")
    p.add_argument("-w", "--watch", type=_bool, nargs="?", const=True, default=True,
                   help="status: keep watching until done (default true)")
    p.add_argument("--revision", type=int, default=0, help="status: the revision to wait for; history: show one")
    p.add_argument("--to-revision", type=int, default=0, help="undo: the revision to go back to (0: previous)")
    p.set_defaults(kubectl=run_rollout)

    p = sub.add_parser("logs", help="print a pod's container logs (kubectl logs)")
    p.add_argument("target", metavar="POD|deployment/NAME")
    p.add_argument("container_arg", nargs="?", metavar="CONTAINER", help=argparse.SUPPRESS)
    p.add_argument("-c", "--container")
    _namespace_flags(p)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming new output")
    p.add_argument("-p", "--previous", action="store_true", help="the previous (restarted) container's log")
    p.add_argument("--tail", type=int, default=-1, help="only the last N lines (-1: all)")
    p.set_defaults(kubectl=run_logs)

    p = sub.add_parser("taint", help="add or remove node taints (kubectl taint)")
    p.add_argument("args", nargs="+", metavar="node NAME KEY[=VALUE]:EFFECT[-]")
    p.add_argument("--overwrite", action="store_true", help="replace a taint with the same key and effect")
    p.set_defaults(kubectl=run_taint)

    p = sub.add_parser("label", help="set or remove node labels (kubectl label)")
    p.add_argument("args", nargs="+", metavar="node NAME KEY=VALUE|KEY-")
    p.add_argument("--overwrite", action="store_true", help="replace a label's value")
    p.set_defaults(kubectl=run_label)

    p = sub.add_parser("exec", help="run a command in a pod's container (kubectl exec)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="POD|deployment/NAME -- COMMAND [ARGS...]")
    p.add_argument("-i", "--stdin", action="store_true", help="send this command's stdin (read to its end)")
    p.add_argument("-t", "--tty", action="store_true", help="(not supported: no terminals)")
    p.add_argument("-c", "--container", help="the container (default: the pod's default container)")
    _namespace_flags(p)
    p.set_defaults(kubectl=run_exec)
