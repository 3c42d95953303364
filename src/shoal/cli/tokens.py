"""`shoal token create | list | revoke`: API tokens, as an administrator (or a user, for their own).

A token's value is printed once, by ``create``; ``list`` names tokens by their public id (the
first hex digits of the token's SHA-256, so a holder can work out their own: ``printf %s
"$TOKEN" | sha256sum | cut -c1-8``) and ``revoke ID`` ends one at once, on every server.
``revoke-node NODE`` does the same to a node's agent credential, which its agent holds until
it joins again with a join token.
"""

from __future__ import annotations

import sys

from shoal.api_client import Client, ClientError, fail, print_error, program_name, quote, write_config
from shoal.kube.fmt import table
from shoal.model.timefmt import TimeFormatError, format_timestamp, parse_duration

ROLE_HELP = ("admin: everything; operator: nodes, reservations, anyone's jobs; user: own jobs and "
             "bound namespaces; read-only: sees, changes nothing (default %(default)s)")
COLUMNS = ("ID", "USER", "ROLE", "GROUPS", "CREATED", "EXPIRES", "CREATED BY")


def add_parser(sub) -> None:
    """``shoal token`` and its actions; each sets ``args.token_command``."""
    t = sub.add_parser("token", help="create, list and revoke API tokens")
    actions = t.add_subparsers(dest="action", metavar="ACTION", required=True)

    c = actions.add_parser("create", help="create a token for a user and print it (admin; shown only this once)")
    c.add_argument("--user", required=True)
    c.add_argument("--role", default="user", choices=["admin", "operator", "user", "read-only"], help=ROLE_HELP)
    c.add_argument("--group", action="append", default=[], metavar="GROUP",
                   help="a group the user belongs to, for RoleBindings that name groups (repeatable)")
    c.add_argument("--expires", metavar="DURATION",
                   help="lifetime: seconds, 30m, 12h, 90d or D-HH:MM:SS (default: never expires)")
    c.add_argument("--description", metavar="TEXT", help="what the token is for (kept with it; the API lists it)")
    c.add_argument("--write-config", metavar="FILE",
                   help="also write a client configuration for the user (server, token, cluster CA) to FILE")
    c.set_defaults(token_command=run_create)

    ls = actions.add_parser("list", help="list tokens by id (admin: every token; others: their own)")
    ls.add_argument("--no-headers", action="store_true", help="no header line")
    ls.set_defaults(token_command=run_list)

    r = actions.add_parser("revoke", help="revoke tokens by id (admin: any; others: their own): refused from the next request on")
    r.add_argument("ids", nargs="+", metavar="ID", help="a token's id, as shoal token list shows it")
    r.set_defaults(token_command=run_revoke)

    n = actions.add_parser("revoke-node", help="revoke nodes' agent credentials (admin): each agent is refused "
                                               "from its next request on, until it joins again with a join token")
    n.add_argument("nodes", nargs="+", metavar="NODE")
    n.set_defaults(token_command=run_revoke_node)


def run_create(args) -> int:
    body = {"user": args.user, "role": args.role, "groups": args.group}
    if args.description:
        body["description"] = args.description
    if args.expires:
        try:
            body["expires_in_s"] = max(1, round(parse_duration(args.expires)))
        except TimeFormatError as e:
            fail(f"--expires: {e}")
    try:
        client = Client.from_config()
        out = client.post("/shoal/v1/tokens", body)
        if args.write_config:
            write_config(args.write_config, ",".join(client.servers), out["token"], client.ca_pem())
    except ClientError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {args.write_config}: {e.strerror}")
    print(out["token"])
    return 0


def run_list(args) -> int:
    try:
        doc = Client.from_config().get("/shoal/v1/tokens")
    except ClientError as e:
        fail(str(e))
    sys.stdout.write(table(([] if args.no_headers else [COLUMNS]) + [row(t, doc["now"]) for t in doc["tokens"]]))
    return 0


def row(t: dict, now: float) -> list[str]:
    """One token's cells: times as Slurm prints them; an expired token says so."""
    expires = t.get("expires")
    if expires is None:
        until = "never"
    else:
        until = format_timestamp(expires) + (" (expired)" if expires <= now else "")
    return [t["id"], t["user"], t["role"], ",".join(t.get("groups") or ()) or "-", format_timestamp(t["created"]),
            until, t.get("created_by") or "(server)"]


def run_revoke(args) -> int:
    return _each(args.ids, lambda client, tid: client.delete(f"/shoal/v1/tokens/{quote(tid)}"),
                 lambda out: f"token {out['id']} revoked (user {out['user']}, role {out['role']})")


def run_revoke_node(args) -> int:
    return _each(args.nodes, lambda client, node: client.post(f"/shoal/v1/tokens/nodes/{quote(node)}/revoke"),
                 lambda out: f"node {out['node']}: agent credential revoked; "
                             "start its agent again (with a join token) to rejoin")


def _each(names: list[str], call, said) -> int:
    """One request per name; an error is printed and the rest still tried (exit 1 if any failed)."""
    try:
        client = Client.from_config()
    except ClientError as e:
        fail(str(e))
    failed = 0
    for name in names:
        try:
            out = call(client, name)
        except ClientError as e:
            failed = print_error(sys.stderr, program_name(), str(e))
            continue
        print(said(out))
    return failed
