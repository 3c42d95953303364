"""sacctmgr: show and change accounts, users, associations and QOS, as Slurm's sacctmgr does.

Shows read GET /shoal/v1/accounting; add, modify and delete go to POST /shoal/v1/accounting
(operators and admins), first as a dry run whose lines are printed, then, once confirmed
(``-i``, or ``y`` within 30 s), for real. The grammar and tables are shoal.slurm.sacctmgr's.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from shoal.api_client import Client, ClientError, fail
    from shoal.slurm.fmt import emit
    from shoal.slurm.sacctmgr import USAGE, SacctmgrError, parse, render, rows

    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-V", "--version") for a in argv):
        from shoal.slurm import version_line

        print(version_line())
        return 0
    if any(a in ("-h", "--help", "--usage") for a in argv) or not argv:
        print(USAGE)
        print("  commands: add|create, modify|update, delete|remove, show|list\n"
              "  entities: account, user, association, qos, cluster\n"
              "  options: -i (commit without asking), -n (no header), -P/-p (parsable), -Q (quiet)")
        return 0
    try:
        cmd = parse(argv)
    except SacctmgrError as e:
        print(f"sacctmgr: error: {e}" if "\n" not in str(e) else str(e), file=sys.stderr)
        return 1
    try:
        client = Client.from_config()
        if cmd.op == "show":
            doc = client.get("/shoal/v1/accounting")
            emit(render(cmd, rows(cmd, doc)))
            return 0
        if cmd.entity not in ("account", "user", "qos"):
            fail(f"{cmd.op} of {cmd.entity} is not supported: Shoal has one cluster, and associations "
                 "are added and removed with the users (sacctmgr add user NAME account=ACCOUNT)")
        body = {"op": cmd.op, "kind": cmd.entity, "names": cmd.names, "where": cmd.where, "set": cmd.set}
        lines = client.post("/shoal/v1/accounting", {**body, "dry_run": True})["lines"]
        if not cmd.quiet:
            print("\n".join(lines))
        if not cmd.immediate and not _commit_asked():
            print(" Changes Discarded")
            return 0
        client.post("/shoal/v1/accounting", body)
    except SacctmgrError as e:
        fail(str(e))
    except ClientError as e:
        print(str(e) if str(e).startswith(" ") else f" {e}", file=sys.stderr)
        return 1
    return 0


def _commit_asked() -> bool:
    """sacctmgr's question; no answer within 30 s (or none at all) keeps nothing."""
    import select

    print("Would you like to commit changes? (You have 30 seconds to decide)\n(N/y): ", end="", flush=True)
    try:
        ready, _, _ = select.select([sys.stdin], [], [], 30)
    except (OSError, ValueError):
        return False
    answer = sys.stdin.readline() if ready else ""
    if not ready:
        print("\nYou didn't respond within 30 seconds, the changes are discarded.")
    return answer.strip().lower() in ("y", "yes")


if __name__ == "__main__":
    sys.exit(main())
