"""`shoal kubeconfig`: a kubeconfig for kubectl and the Kubernetes client libraries, pointing
at this cluster's Kubernetes API (server, cluster CA, bearer token; docs/KUBERNETES-API.md).

kubectl sends a bearer token only over HTTPS, so the server must serve TLS (``shoal up --tls
on``, or any server on a non-loopback address): for a plain-HTTP server this says so.
"""

from __future__ import annotations

import base64
import json

from shoal.api_client import Client, ClientError, fail, write_private_json


def add_parser(sub) -> None:
    k = sub.add_parser("kubeconfig", help="write a kubeconfig for kubectl (server, cluster CA, token)")
    k.add_argument("--user", help="make a new token for this user (admin) instead of using your own")
    k.add_argument("--role", default="user", choices=["admin", "operator", "user", "read-only"],
                   help="the new token's role, with --user (default %(default)s)")
    k.add_argument("--group", action="append", default=[], metavar="GROUP", help="the new token's groups")
    k.add_argument("--namespace", default="default", help="the context's namespace (default %(default)s)")
    k.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (0600) instead of printing it")


def kubeconfig(server: str, token: str, ca_pem: str | None, user: str, namespace: str = "default",
               cluster: str = "shoal") -> dict:
    """The kubeconfig document (JSON is YAML: kubectl reads it as is)."""
    entry: dict = {"server": server}
    if ca_pem:
        entry["certificate-authority-data"] = base64.b64encode(ca_pem.encode()).decode()
    context = f"{user}@{cluster}"
    return {"apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": cluster, "cluster": entry}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": context, "context": {"cluster": cluster, "user": user, "namespace": namespace}}],
            "current-context": context}


def run(args) -> int:
    try:
        client = Client.from_config()
        server = client.servers[0]
        if not server.startswith("https://"):
            fail(f"{server} serves plain HTTP, and kubectl sends its token only over HTTPS: "
                 "start the cluster with 'shoal up --tls on' (a server on a non-loopback address serves HTTPS)")
        token, user = client.token, args.user
        if args.user:
            token = client.post("/shoal/v1/tokens", {"user": args.user, "role": args.role,
                                                     "groups": args.group})["token"]
        else:
            user = client.get("/shoal/v1/whoami").get("user") or "shoal"
        doc = kubeconfig(server, token, client.ca_pem(), user, args.namespace)
    except ClientError as e:
        fail(str(e))
    if args.output:
        try:
            write_private_json(args.output, doc)
        except OSError as e:
            fail(f"cannot write {args.output}: {e.strerror}")
        return 0
    print(json.dumps(doc, indent=2))
    return 0
