"""The sbatch and srun option grammar: one table of options, read from argv and #SBATCH lines.

Options are parsed as Slurm's getopt does: long options as ``--opt=value`` or
``--opt value`` (any unambiguous prefix works), short options as ``-N2``, ``-N 2`` or
clustered flags (``-Hl``); the first argument that is not an option ends the options.
For sbatch, a value set on the command line wins over an ``SBATCH_*`` input variable,
which wins over an ``#SBATCH`` directive in the script.

Each option converts its value into keys of the job-submission body (docs/API.md), so
the server receives numbers and normalised strings and never re-parses user syntax.
"""

from __future__ import annotations

import os
from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs sbatch and srun start-up time
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

from shoal.model import arrays, dependency, hostlist, timefmt
from shoal.model.job import MAX_SCRIPT_BYTES, script_sha256, script_too_large

NONE, REQUIRED, OPTIONAL = "none", "required", "optional"
SBATCH, SRUN = "sbatch", "srun"
BOTH = frozenset({SBATCH, SRUN})

NOT_A_BATCH_SCRIPT = (
    "This does not look like a batch script.  The first line must start with #! followed "
    "by the path to an interpreter.\nFor instance: #!/bin/sh"
)
DOS_LINE_BREAKS = ("Batch script contains DOS line breaks (\\r\\n) instead of expected UNIX line "
                   "breaks (\\n).")
WRAP_HEADER = "#!/bin/sh\n# This script was created by sbatch --wrap.\n\n"

# Keys set by the same source that exclude each other; a later source's key replaces an
# earlier source's other key (a --mem on the command line overrides #SBATCH --mem-per-cpu).
EXCLUSIVE_KEYS = (("mem_per_node_mb", "mem_per_cpu_mb"),)
_EXCLUSIVE_FLAGS = {"mem_per_node_mb": "--mem", "mem_per_cpu_mb": "--mem-per-cpu"}


class OptionError(ValueError):
    """An option or #SBATCH directive that sbatch or srun cannot accept; says where and why.

    ``exit_code``: what the command exits with; sbatch, srun and salloc exit 255 for a command-line
    option they cannot parse (Slurm's ``exit(-1)`` in its option processing), 1 for everything else.
    """

    exit_code = 1


class CommandLineError(OptionError):
    """An option on the command line that sbatch, srun or salloc cannot parse (unknown, or a bad value)."""

    exit_code = 255


# Immutable records as namedtuples, not dataclasses: dataclasses imports inspect (and
# with it ast, dis, tokenize), about 30 ms of sbatch's start-up.
class _Context(namedtuple("_Context", "cwd environ now")):
    """``cwd: str``, ``environ: Mapping[str, str]``, ``now: float`` (the epoch for --begin)."""

    __slots__ = ()


if TYPE_CHECKING:
    Converter = Callable[[str, _Context], dict[str, Any]]


class Option(namedtuple("Option", "long short arg convert commands env", defaults=(BOTH, None))):
    """One option: its names, how it takes a value, and what it sets in the request.

    ``long: str``; ``short: str | None``; ``arg``: NONE, REQUIRED or OPTIONAL (optional
    values only as --long=value); ``convert: Converter``; ``commands: frozenset[str]``;
    ``env: str | None``, the sbatch input environment variable, e.g. SBATCH_PARTITION.
    """

    __slots__ = ()


class SbatchRequest(namedtuple("SbatchRequest", "body parsable test_only wait", defaults=(False, False, False))):
    """What sbatch submits (``body``, the POST /shoal/v1/jobs JSON) and how it reports back."""

    __slots__ = ()


class SrunRequest(namedtuple("SrunRequest", "options command")):
    """A job step (or an allocation and a step): resource and launch options (``options``,
    a dict), and the command (``command``, a list of words; a new empty list by default)."""

    __slots__ = ()

    def __new__(cls, options: dict[str, Any], command: list[str] | None = None) -> SrunRequest:
        return super().__new__(cls, options, [] if command is None else command)


# Value converters. Each raises ValueError whose text says what was expected; the caller
# adds the option name and, for directives, the script line.


def _positive(text: str, minimum: int = 1) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 12 or int(value) < minimum:
        raise ValueError(f"expected a whole number of at least {minimum}")
    return int(value)


def _count(key: str, minimum: int = 1) -> Converter:
    return lambda v, ctx: {key: _positive(v, minimum)}


def _text(key: str) -> Converter:
    def convert(value: str, ctx: _Context) -> dict[str, Any]:
        if not value.strip():
            raise ValueError("expected a non-empty value")
        return {key: value.strip()}

    return convert


def _flag(**keys: Any) -> Converter:
    def convert(value: str, ctx: _Context) -> dict[str, Any]:
        if value:
            raise ValueError("this option takes no value")
        return dict(keys)

    return convert


def _ignored(value: str, ctx: _Context) -> dict[str, Any]:
    return {}


RECORDED = "_recorded:"  # key prefix of an option Shoal keeps with the job but does not act on


def _recorded(name: str) -> Converter:
    """An option Slurm takes and Shoal has no use for (--wckey, --mail-type, ...): accepted and
    kept with the job as written, so tools such as submitit that always send one still submit."""
    return lambda v, ctx: {RECORDED + name: v.strip()}


MAX_NODES = 100000  # the most nodes a job may ask for (the API refuses more)


class WholeMessage(ValueError):
    """A converter's error in Slurm's own words, printed as it is on the command line and in
    directives (no 'invalid -N value' lead-in); ``reason`` serves the SBATCH_* variables' message."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def _node_count(text: str) -> int:
    """``4``, or with Slurm's k/m suffixes (x1024, x1048576): ``2k``."""
    scale = {"k": 1024, "m": 1024 * 1024}.get(text[-1:].lower(), 1)
    return _positive(text[:-1] if scale > 1 else text) * scale


def _nodes(value: str, ctx: _Context) -> dict[str, Any]:
    lo, dash, hi = value.strip().partition("-")
    try:
        low = _node_count(lo)
        high = _node_count(hi) if dash else None
    except ValueError:
        raise WholeMessage(f'"{value}" is not a valid node count') from None
    if high is not None and high < low:
        raise ValueError("expected min-max with min no larger than max")
    if max(low, high or 0) > MAX_NODES:  # Slurm queues it for ever (Reason=PartitionConfig); Shoal says so now
        raise WholeMessage("Batch job submission failed: Requested node configuration is not available")
    return {"nodes": low} if high is None else {"nodes": low, "nodes_max": high}


_MEM_UNITS = {"k": 0, "m": 1, "g": 1024, "t": 1024 * 1024}  # K rounds up to whole MiB


def _megabytes(text: str) -> int:
    value = text.strip()
    unit = value[-1:].lower()
    number = value[:-1] if unit in _MEM_UNITS else value
    if not (number.isascii() and number.isdigit()) or len(number) > 15:
        raise ValueError("expected a size like 4096, 500M, 16G or 1T (K, M, G, T; M if no unit)")
    if unit == "k":
        return -(-int(number) // 1024)
    return int(number) * _MEM_UNITS.get(unit, 1)


def _mem(key: str) -> Converter:
    return lambda v, ctx: {key: _megabytes(v)}


def _gpu_count(value: str, count_key: str) -> dict[str, Any]:
    """``[type:]N`` as --gpus, --gpus-per-node and --gpus-per-task take it."""
    gpu_type, colon, number = value.strip().rpartition(":")
    try:
        count = _positive(number, 0)
    except ValueError:
        raise ValueError("expected [type:]count, like 4 or a100:4") from None
    if colon and not gpu_type:
        raise ValueError("expected [type:]count, like 4 or a100:4")
    out: dict[str, Any] = {count_key: count}
    if gpu_type:
        out["gpu_type"] = gpu_type
    return out


def _gpus(key: str) -> Converter:
    return lambda v, ctx: _gpu_count(v, key)


def _gres(value: str, ctx: _Context) -> dict[str, Any]:
    """``gpu``, ``gpu:4``, ``gpu:a100:4``; several comma-separated, but only gpu is known."""
    out: dict[str, Any] = {}
    for item in value.split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            raise ValueError(
                f"gres '{parts[0]}' is not available: Shoal schedules only gpu gres "
                "(gpu, gpu:N or gpu:type:N)"
            )
        if len(parts) > 3 or any(not p for p in parts):
            raise ValueError("expected gpu, gpu:N or gpu:type:N")
        count = 1
        gpu_type = None
        if len(parts) == 3:
            gpu_type, count = parts[1], _positive(parts[2], 0)
        elif len(parts) == 2:
            if parts[1].isascii() and parts[1].isdigit():
                count = _positive(parts[1], 0)
            else:
                gpu_type = parts[1]
        if "gpus_per_node" in out:
            raise ValueError("gpu is given more than once")
        out["gpus_per_node"] = count
        if gpu_type:
            out["gpu_type"] = gpu_type
    return out


UNLIMITED = -1  # the API's word for "no limit" (the partition's MaxTime still applies)


def _time(key: str) -> Converter:
    flag = "--" + key.removesuffix("_s").replace("_limit", "").replace("_", "-")  # --time, --time-min

    def convert(value: str, ctx: _Context) -> dict[str, Any]:
        try:
            seconds = timefmt.parse_time_limit(value)
        except ValueError as e:  # Slurm's words first, then what Shoal would have taken
            raise WholeMessage(f"Invalid {flag} specification '{value}': {_reason(e)}", _reason(e)) from None
        return {key: UNLIMITED if seconds is None else seconds}

    return convert


def _begin(value: str, ctx: _Context) -> dict[str, Any]:
    return {"begin_time": timefmt.parse_begin_time(value, ctx.now)}


def _array(value: str, ctx: _Context) -> dict[str, Any]:
    ids, throttle = arrays.parse_array(value)
    return {"array": arrays.format_array(ids, throttle)}


def _dependency(value: str, ctx: _Context) -> dict[str, Any]:
    clauses, any_of = dependency.parse_dependency(value)
    return {"dependency": dependency.format_dependency(clauses, any_of)}


def _hosts(key: str) -> Converter:
    def convert(value: str, ctx: _Context) -> dict[str, Any]:
        names = hostlist.expand(value)
        if not names:
            raise ValueError("expected host names like node[01-04],node07")
        return {key: hostlist.compress(names)}

    return convert


def _chdir(value: str, ctx: _Context) -> dict[str, Any]:
    if not value.strip():
        raise ValueError("expected a directory")
    return {"workdir": os.path.normpath(os.path.join(ctx.cwd, value.strip()))}


def _export(value: str, ctx: _Context) -> dict[str, Any]:
    """ALL, NONE, or [ALL,]NAME[=value],...; SLURM_* variables always travel, as in Slurm."""
    items = [i for i in value.split(",") if i.strip()] if value.strip() else []
    if not items:
        raise ValueError("expected ALL, NONE, or [ALL,]NAME[=value],...")
    head = items[0].strip().upper()
    if len(items) == 1 and head in ("ALL", "NONE", "NIL"):
        if head == "ALL":
            return {"environment": dict(ctx.environ)}
        return {"environment": {k: v for k, v in ctx.environ.items() if k.startswith("SLURM_")}}
    if head == "ALL":
        env = dict(ctx.environ)
    else:
        env = {k: v for k, v in ctx.environ.items() if k.startswith("SLURM_")}
    if head in ("ALL", "NONE", "NIL"):
        items = items[1:]
    for item in items:
        name, eq, val = item.partition("=")
        name = name.strip()
        if not _is_env_name(name):
            raise ValueError(f"'{name}' is not an environment variable name")
        if eq:
            env[name] = val
        elif name in ctx.environ:
            env[name] = ctx.environ[name]
    return {"environment": env}


def _is_env_name(name: str) -> bool:
    return bool(name) and name.isascii() and not name[0].isdigit() and name.replace("_", "a").isalnum()


_SIGNALS = {
    "HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8,
    "KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
    "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23,
    "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30,
    "SYS": 31,
}  # fmt: skip


def _signal(value: str, ctx: _Context) -> dict[str, Any]:
    """``[{R|B}:]SIG[@seconds]``, normalised to ``B:USR1@60`` (60 s is Slurm's default)."""
    expected = "expected [{R|B}:]<signal>[@seconds], like B:USR1@60"
    text = value.strip().upper()
    flags, colon, rest = text.rpartition(":")
    if colon and (not flags or set(flags) - {"R", "B"} or len(flags) > 2):
        raise ValueError(expected)
    sig, at, secs = rest.partition("@")
    sig = sig.removeprefix("SIG")
    if sig.isascii() and sig.isdigit():
        if not 1 <= int(sig) <= 64:
            raise ValueError("signal numbers run from 1 to 64")
    elif sig not in _SIGNALS:
        raise ValueError(expected)
    seconds = 60
    if at:
        if not (secs.isascii() and secs.isdigit()) or int(secs[:6]) > 65535:
            raise ValueError("expected a warning time of 0 to 65535 seconds after '@'")
        seconds = int(secs)
    prefix = f"{''.join(sorted(set(flags)))}:" if colon else ""
    return {"signal": f"{prefix}{sig}@{seconds}"}


def _open_mode(value: str, ctx: _Context) -> dict[str, Any]:
    mode = value.strip().lower()
    # Slurm reads only the first letter: --open-mode=t and =a work as in its scripts.
    for word in ("append", "truncate"):
        if mode and word.startswith(mode[0]):
            return {"open_mode": word}
    raise ValueError("expected append or truncate")


def _yes_no(key: str) -> Converter:
    def convert(value: str, ctx: _Context) -> dict[str, Any]:
        word = value.strip().lower()
        if word not in ("yes", "no"):
            raise ValueError("expected yes or no")
        return {key: word == "yes"}

    return convert


def _kill_on_bad_exit(value: str, ctx: _Context) -> dict[str, Any]:
    if value not in ("", "0", "1"):
        raise ValueError("expected 0 or 1")
    return {"kill_on_bad_exit": value != "0"}


def _wrap(value: str, ctx: _Context) -> dict[str, Any]:
    if not value.strip():
        raise ValueError("expected a command line")
    return {"_wrap": value}


def _container_image(value: str, ctx: _Context) -> dict[str, Any]:
    from shoal.model.container import image_ref

    value = value.strip().replace("\\#", "#")  # a directive's '#' is escaped, as Pyxis' README says
    image_ref(value)  # ContainerOptionError is a ValueError: the caller names the option
    return {"container_image": value}


def _container_mounts(value: str, ctx: _Context) -> dict[str, Any]:
    from shoal.model.container import parse_mounts

    return {"container_mounts": [m.to_json() for m in parse_mounts(value)]}


def _container_env(value: str, ctx: _Context) -> dict[str, Any]:
    names = [n for n in value.split(",") if n]
    if not names or any("=" in n for n in names):
        raise ValueError("expected variable names separated by commas")
    return {"container_env": names}


def container_request(values: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Fold the ``container_*`` keys into one ``container`` request (model.container),
    over the PYXIS_CONTAINER_* variables as Pyxis reads them; none: no key."""
    given = {k[len("container_"):]: values.pop(k) for k in list(values) if k.startswith("container_")}
    if not given and not any(k.startswith("PYXIS_CONTAINER_") for k in environ):
        return values  # the common case: no import of model.container (dataclasses) on sbatch's path
    from shoal.model.container import ContainerOptionError, check_request, request_from_env

    try:
        request = {**request_from_env(dict(environ)), **given}
    except ContainerOptionError as e:
        raise OptionError(f"invalid PYXIS_CONTAINER_* variable: {e}") from None
    if not request:
        return values
    if not request.get("image") and not request.get("name"):
        raise OptionError("--container-image is required with the other --container-* options")
    try:
        request = check_request(request)
    except ContainerOptionError as e:
        raise OptionError(str(e)) from None
    values["container"] = request
    return values


O = Option
OPTIONS: tuple[Option, ...] = (
    # resources
    O("nodes", "N", REQUIRED, _nodes, env="SBATCH_NODES"),
    O("ntasks", "n", REQUIRED, _count("ntasks"), env="SBATCH_NTASKS"),
    O("ntasks-per-node", None, REQUIRED, _count("ntasks_per_node"), env="SBATCH_NTASKS_PER_NODE"),
    O("cpus-per-task", "c", REQUIRED, _count("cpus_per_task"), env="SBATCH_CPUS_PER_TASK"),
    O("mem", None, REQUIRED, _mem("mem_per_node_mb"), env="SBATCH_MEM_PER_NODE"),
    O("mem-per-cpu", None, REQUIRED, _mem("mem_per_cpu_mb"), env="SBATCH_MEM_PER_CPU"),
    O("gpus", "G", REQUIRED, _gpus("gpus"), env="SBATCH_GPUS"),
    O("gpus-per-node", None, REQUIRED, _gpus("gpus_per_node"), env="SBATCH_GPUS_PER_NODE"),
    O("gpus-per-task", None, REQUIRED, _gpus("gpus_per_task"), env="SBATCH_GPUS_PER_TASK"),
    O("gres", None, REQUIRED, _gres, env="SBATCH_GRES"),
    O("exclusive", None, NONE, _flag(exclusive=True), env="SBATCH_EXCLUSIVE"),
    O("constraint", "C", REQUIRED, _text("constraint"), env="SBATCH_CONSTRAINT"),
    O("nodelist", "w", REQUIRED, _hosts("nodelist")),
    O("exclude", "x", REQUIRED, _hosts("exclude")),
    O("time", "t", REQUIRED, _time("time_limit_s"), env="SBATCH_TIMELIMIT"),
    O("time-min", None, REQUIRED, _time("time_min_s")),
    O("partition", "p", REQUIRED, _text("partition"), env="SBATCH_PARTITION"),
    O("account", "A", REQUIRED, _text("account"), env="SBATCH_ACCOUNT"),
    O("qos", "q", REQUIRED, _text("qos"), env="SBATCH_QOS"),
    O("reservation", None, REQUIRED, _text("reservation"), env="SBATCH_RESERVATION"),
    # the job
    O("job-name", "J", REQUIRED, _text("name"), env="SBATCH_JOB_NAME"),
    O("output", "o", REQUIRED, _text("stdout"), env="SBATCH_OUTPUT"),
    O("error", "e", REQUIRED, _text("stderr"), env="SBATCH_ERROR"),
    O("input", "i", REQUIRED, _text("stdin"), env="SBATCH_INPUT"),
    O("open-mode", None, REQUIRED, _open_mode, env="SBATCH_OPEN_MODE"),
    O("chdir", "D", REQUIRED, _chdir),
    O("export", None, REQUIRED, _export, env="SBATCH_EXPORT"),
    O("comment", None, REQUIRED, _text("comment")),
    O("hold", "H", NONE, _flag(hold=True)),
    O("begin", "b", REQUIRED, _begin, frozenset({SBATCH})),
    O("dependency", "d", REQUIRED, _dependency),
    O("kill-on-invalid-dep", None, REQUIRED, _yes_no("kill_on_invalid_dep")),
    O("signal", None, REQUIRED, _signal, env="SBATCH_SIGNAL"),
    O("mail-type", None, REQUIRED, _recorded("mail-type"), env="SBATCH_MAIL_TYPE"),
    O("mail-user", None, REQUIRED, _recorded("mail-user"), env="SBATCH_MAIL_USER"),
    O("wckey", None, REQUIRED, _recorded("wckey"), env="SBATCH_WCKEY"),
    O("profile", None, REQUIRED, _recorded("profile"), env="SBATCH_PROFILE"),
    O("mincpus", None, REQUIRED, _recorded("mincpus")),
    O("tmp", None, REQUIRED, _recorded("tmp")),
    O("overcommit", "O", NONE, _recorded("overcommit"), env="SBATCH_OVERCOMMIT"),
    # sbatch only
    O("array", "a", REQUIRED, _array, frozenset({SBATCH}), env="SBATCH_ARRAY_INX"),
    O("requeue", None, NONE, _flag(requeue=True), frozenset({SBATCH}), env="SBATCH_REQUEUE"),
    O("no-requeue", None, NONE, _flag(requeue=False), frozenset({SBATCH}), env="SBATCH_NO_REQUEUE"),
    O("wrap", None, REQUIRED, _wrap, frozenset({SBATCH})),
    O("parsable", None, NONE, _flag(_parsable=True), frozenset({SBATCH})),
    O("test-only", None, NONE, _flag(_test_only=True), frozenset({SBATCH})),
    O("wait", "W", NONE, _flag(_wait=True), frozenset({SBATCH}), env="SBATCH_WAIT"),
    O("version", "V", NONE, _flag(_version=True), frozenset({SBATCH, SRUN})),
    O("verbose", "v", NONE, _flag(_verbose=True), frozenset({SBATCH, SRUN})),  # Shoal has no debug log to show
    O("help", None, NONE, _flag(_help=True), frozenset({SBATCH, SRUN})),
    O("usage", None, NONE, _flag(_help=True), frozenset({SBATCH, SRUN})),
    # srun only
    O("label", "l", NONE, _flag(label=True), frozenset({SRUN})),
    O("unbuffered", "u", NONE, _flag(unbuffered=True), frozenset({SRUN})),
    O("mpi", None, REQUIRED, _text("mpi"), frozenset({SRUN})),
    O("kill-on-bad-exit", "K", OPTIONAL, _kill_on_bad_exit, frozenset({SRUN})),
    O("overlap", None, NONE, _flag(overlap=True), frozenset({SRUN})),
    O("exact", None, NONE, _flag(exact=True), frozenset({SRUN})),
    O("gpu-bind", None, REQUIRED, _text("gpu_bind"), frozenset({SRUN})),
    O("cpu-bind", None, REQUIRED, _text("cpu_bind"), frozenset({SRUN})),
    O("pty", None, NONE, _flag(pty=True), frozenset({SRUN})),
    # Pyxis' container options (docs/CONTAINERS.md), on sbatch and srun alike
    O("container-image", None, REQUIRED, _container_image),
    O("container-mounts", None, REQUIRED, _container_mounts),
    O("container-workdir", None, REQUIRED, _text("container_workdir")),
    O("container-name", None, REQUIRED, _text("container_name")),
    O("container-save", None, REQUIRED, _text("container_save")),
    O("container-mount-home", None, NONE, _flag(container_mount_home=True)),
    O("no-container-mount-home", None, NONE, _flag(container_mount_home=False)),
    O("container-remap-root", None, NONE, _flag(container_remap_root=True)),
    O("no-container-remap-root", None, NONE, _flag(container_remap_root=False)),
    O("container-entrypoint", None, NONE, _flag(container_entrypoint=True)),
    O("no-container-entrypoint", None, NONE, _flag(container_entrypoint=False)),
    O("container-writable", None, NONE, _flag(container_writable=True)),
    O("container-readonly", None, NONE, _flag(container_writable=False)),
    O("container-env", None, REQUIRED, _container_env),
)  # fmt: skip
del O


def _table(command: str) -> tuple[dict[str, Option], dict[str, Option]]:
    options = [o for o in OPTIONS if command in o.commands]
    return {o.long: o for o in options}, {o.short: o for o in options if o.short}


_TABLES = {SBATCH: _table(SBATCH), SRUN: _table(SRUN)}

# One option occurrence: the option, how the user spelled it, and its value ("" for flags).
if TYPE_CHECKING:
    _Found = tuple[Option, str, str]


def _error(where: str, message: str) -> OptionError:
    """An option that cannot be parsed: on the command line (``where`` empty) or in a directive."""
    return OptionError(message) if where else CommandLineError(message)


def _scan(argv: list[str], command: str, where: str = "") -> tuple[list[_Found], list[str]]:
    """Split argv into option occurrences and the positional arguments after them.

    ``where`` (like ``line 4: ``) prefixes errors; in a directive the wording also says
    so, since users read those as script errors.
    """
    longs, shorts = _TABLES[command]
    found: list[_Found] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            return found, argv[i:]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            opt = _lookup_long(name, longs, command, where, arg)
            flag = f"--{opt.long}"
            if opt.arg == REQUIRED and not eq:
                if i >= len(argv):
                    raise _error(where, f"{where}option '{flag}' needs a value")
                value = argv[i]
                i += 1
            elif opt.arg == NONE and eq:
                raise _error(where, f"{where}option '{flag}' takes no value")
            found.append((opt, flag, value))
        elif arg.startswith("-") and len(arg) > 1:
            j = 1
            while j < len(arg):
                opt = shorts.get(arg[j])
                if opt is None:
                    raise _error(where, _unrecognized(f"-{arg[j]}", command, where))
                flag = f"-{arg[j]}"
                j += 1
                if opt.arg == REQUIRED:
                    value = arg[j:]
                    if not value:
                        if i >= len(argv):
                            raise _error(where, f"{where}option '{flag}' needs a value")
                        value = argv[i]
                        i += 1
                    found.append((opt, flag, value))
                    break
                found.append((opt, flag, ""))
        else:
            return found, argv[i - 1:]
    return found, []


def _lookup_long(name: str, longs: dict[str, Option], command: str, where: str, arg: str) -> Option:
    """An exact name, or an unambiguous prefix of one, as getopt_long allows."""
    if name in longs:
        return longs[name]
    matches = [o for n, o in longs.items() if name and n.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        names = ", ".join(f"--{o.long}" for o in matches)
        raise _error(where, f"{where}option '--{name}' is ambiguous: it could be {names}")
    raise _error(where, _unrecognized(arg.partition("=")[0], command, where))


def _unrecognized(flag: str, command: str, where: str) -> str:
    import difflib  # only on this error path: it costs start-up time

    longs, _ = _TABLES[command]
    context = " in #SBATCH directive" if where else ""
    message = f"{where}unrecognized option '{flag}'{context}"
    if flag.startswith("--"):
        close = difflib.get_close_matches(flag[2:], list(longs), n=1)
        if close:
            message += f" (did you mean '--{close[0]}'?)"
    return message


def _convert(found: list[_Found], ctx: _Context, where: str = "") -> dict[str, Any]:
    """Apply one source's options in order; later ones win within the source."""
    out: dict[str, Any] = {}
    for opt, flag, value in found:
        try:
            values = opt.convert(value, ctx)
        except WholeMessage as e:  # in a directive, also which option, as the line may hold several
            raise _error(where, f"{where}{flag}: {e}" if where and flag not in str(e) else f"{where}{e}") from None
        except ValueError as e:
            raise _error(where, f"{where}invalid {flag} value '{value}': {_reason(e)}") from None
        out.update(values)
    _check_exclusive(out, where)
    return out


def _check_exclusive(keys: Iterable[str], where: str) -> None:
    present = set(keys)
    for group in EXCLUSIVE_KEYS:
        given = [k for k in group if k in present]
        if len(given) > 1:
            names = " and ".join(_EXCLUSIVE_FLAGS.get(k, k) for k in given)
            raise _error(where, f"{where}{names} are mutually exclusive")


def _reason(error: ValueError) -> str:
    """The part of a parser's message after its own 'invalid X 'v': ' lead-in, if any."""
    text = str(error)
    if text.startswith("invalid ") and "': " in text:
        return text.split("': ", 1)[1]
    return text


def _layer(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, where a key of an exclusive group clears its partners."""
    merged = dict(base)
    for keys in EXCLUSIVE_KEYS:
        if any(k in top for k in keys):
            for k in keys:
                merged.pop(k, None)
    merged.update(top)
    return merged


def script_source(argv: list[str]) -> str | None:
    """Where sbatch's script comes from: its path, ``-`` for standard input, None for --wrap.

    The CLI calls this to know what to read before calling parse_sbatch.
    """
    found, positional = _scan(argv, SBATCH)
    if any(opt.long == "wrap" for opt, _, _ in found):
        return None
    return positional[0] if positional else "-"


def asks_help(argv: list[str], command: str = SBATCH) -> bool:
    """Whether --help or --usage is among the options: the command prints help_text and exits."""
    found, _ = _scan(argv, command)
    return any(opt.long in ("help", "usage") for opt, _, _ in found)


def help_text(command: str, usage: bool = False) -> str:
    """``--help`` (or the shorter ``--usage``): Slurm's usage line, then every option of this table."""
    what = "script(0) [args(0)...]" if command == SBATCH else \
        "[OPTIONS(0)... [executable(0) [args(0)...]]] [ : [OPTIONS(N)...]] executable(N) [args(N)...]"
    if usage:
        first = f"Usage: {command} [-N nnodes] [-n ntasks]" + (" [-i in] [-o out] [-e err]" if command == SRUN else "")
    elif command == SBATCH:
        first = f"Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] {what}"
    else:
        first = f"Usage: srun {what}"
    lines = [first, "", "Options:"]
    for opt in OPTIONS:
        if command in opt.commands:
            names = (f"-{opt.short}, " if opt.short else "    ") + f"--{opt.long}"
            value = {REQUIRED: "=value", OPTIONAL: "[=value]"}.get(opt.arg, "")
            lines.append(f"  {names}{value}")
    return "\n".join(lines) + "\n"


def asks_version(argv: list[str], command: str = SBATCH) -> bool:
    """Whether -V/--version is among the options (before the script or command): the
    command then prints its version and exits, as Slurm's do, whatever else is given."""
    found, _ = _scan(argv, command)
    return any(opt.long == "version" for opt, _, _ in found)


def script_index(argv: list[str]) -> int | None:
    """Where script_source's path is in argv; None with --wrap or standard input. The
    server uses it to find the script among the files the compiled front end sent."""
    found, positional = _scan(argv, SBATCH)
    if any(opt.long == "wrap" for opt, _, _ in found) or not positional or positional[0] == "-":
        return None
    return len(argv) - len(positional)


def directives(script: str) -> list[tuple[int, list[str]]]:
    """The ``#SBATCH`` lines' words with their line numbers, read as Slurm does.

    Directives come after the shebang line and stop at the first line that is neither
    blank nor a comment; ``##SBATCH`` is a comment. Words split at whitespace, quotes
    group, and an unquoted ``#`` at the start of a word begins a comment.
    """
    out: list[tuple[int, list[str]]] = []
    for number, line in enumerate(script.split("\n")[1:], start=2):
        stripped = line.strip()
        if line.startswith("#SBATCH") and (len(line) == 7 or line[7].isspace()):
            out.append((number, _words(line[7:], f"line {number}: ")))
        elif stripped and not stripped.startswith("#"):
            break
    return out


def _words(text: str, where: str) -> list[str]:
    words: list[str] = []
    current: list[str] = []
    in_word = False
    quote = ""
    for c in text:
        if quote:
            if c == quote:
                quote = ""
            else:
                current.append(c)
        elif c in "\"'":
            quote = c
            in_word = True
        elif c.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
        elif c == "#" and not in_word:
            break
        else:
            current.append(c)
            in_word = True
    if quote:
        raise OptionError(f"{where}unclosed {quote} quote in #SBATCH directive")
    if in_word:
        words.append("".join(current))
    return words


def check_batch_script(script: str) -> None:
    """Refuse what Slurm's sbatch refuses, in its words: empty scripts, no #! line, NUL bytes,
    DOS line breaks (a lone CR is kept: it may belong to a string), scripts over max_script_size."""
    if not script:
        raise OptionError("Batch script is empty!")
    if not script.strip():
        raise OptionError("Batch script contains only whitespace!")
    if not script.startswith("#!"):
        raise OptionError(NOT_A_BATCH_SCRIPT)
    if "\0" in script:
        raise OptionError("The Shoal server does not allow scripts that contain a NULL character '\\0'.")
    if "\r\n" in script:
        raise OptionError(DOS_LINE_BREAKS)
    size = len(script.encode("utf-8", "surrogateescape")) if len(script) * 4 > MAX_SCRIPT_BYTES else 0
    if size > MAX_SCRIPT_BYTES:
        raise OptionError(f"Batch job submission failed: {script_too_large(size)}")  # as the server would say


def parse_sbatch(
    argv: list[str], script: str | None, *, cwd: str, environ: Mapping[str, str], now: float
) -> SbatchRequest:
    """sbatch's arguments and script text as the submission body and the output flags.

    ``argv`` excludes the program name; ``script`` is the text of the file named in argv
    (or of standard input), and is ignored with --wrap. Options on the command line win
    over SBATCH_* variables, which win over #SBATCH directives.
    """
    ctx = _Context(cwd=os.path.normpath(cwd), environ=environ, now=now)
    found, positional = _scan(argv, SBATCH)
    command_line = _convert(found, ctx)
    from_env = _convert_env(ctx)
    wrap = command_line.get("_wrap")
    if wrap is not None:
        if positional:
            raise OptionError(
                f"script arguments are not permitted with --wrap (got '{positional[0]}')"
            )
        text = WRAP_HEADER + wrap + "\n"
        default_name = "wrap"
        from_script: dict[str, Any] = {}
    else:
        if script is None:
            raise OptionError(
                "no batch script: name a script file, pipe one on standard input, or use --wrap"
            )
        check_batch_script(script)
        text = script
        default_name = os.path.basename(positional[0]) if positional and positional[0] != "-" else "sbatch"
        from_script = {}
        script_keys: set[str] = set()
        for number, words in directives(script):
            where = f"line {number}: "
            line_found, extra = _scan(words, SBATCH, where)
            if extra:
                raise OptionError(f"{where}unexpected argument '{extra[0]}' in #SBATCH directive")
            line_values = _convert(line_found, ctx, where)
            for key, flag in (("_wrap", "--wrap"), ("_version", "--version")):
                if key in line_values:
                    raise OptionError(f"{where}{flag} is only valid on the command line")
            script_keys.update(line_values)
            from_script.update(line_values)
        _check_exclusive(script_keys, "#SBATCH directives: ")
    values = container_request(_layer(_layer(from_script, from_env), command_line), ctx.environ)
    for key in ("_wrap", "_version", "_verbose", "_help"):
        values.pop(key, None)
    _gather_recorded(values)
    flags = {k: bool(values.pop(k, False)) for k in ("_parsable", "_test_only", "_wait")}
    body: dict[str, Any] = {
        "name": default_name,
        "script": text,
        # What was read, byte for byte (surrogateescape undoes the decoding exactly): the
        # server and the agent check the script against it.
        "script_sha256": script_sha256(text.encode("utf-8", "surrogateescape")),
        "argv": positional[1:] if wrap is None else [],
        "workdir": ctx.cwd,
        "environment": dict(environ),
    }
    body.update(values)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, which JSON strings cannot carry
            import binascii

            del body["script"]
            body["script_base64"] = binascii.b2a_base64(text.encode("utf-8", "surrogateescape"),
                                                        newline=False).decode("ascii")
    return SbatchRequest(
        body=body, parsable=flags["_parsable"], test_only=flags["_test_only"], wait=flags["_wait"]
    )


def _gather_recorded(values: dict[str, Any]) -> None:
    """Move the recorded options' keys into one ``recorded_options`` mapping of the body."""
    recorded = {k[len(RECORDED):]: values.pop(k) for k in [k for k in values if k.startswith(RECORDED)]}
    if recorded:
        values["recorded_options"] = recorded


def _convert_env(ctx: _Context) -> dict[str, Any]:
    """The SBATCH_* input variables, as one source below the command line."""
    out: dict[str, Any] = {}
    for opt in OPTIONS:
        if opt.env is None or opt.env not in ctx.environ:
            continue
        value = "" if opt.arg == NONE else ctx.environ[opt.env]
        try:
            out = _layer(out, opt.convert(value, ctx))
        except ValueError as e:
            reason = e.reason if isinstance(e, WholeMessage) else _reason(e)
            raise OptionError(f"invalid {opt.env} value '{ctx.environ[opt.env]}': {reason}") from None
    return out


# srun's input variables (Slurm's srun(1)), the option each stands for. Read outside an
# allocation only: inside one they hold the allocation's own values, which steps get anyway.
SRUN_INPUT = (("SLURM_NPROCS", "ntasks"), ("SLURM_NTASKS", "ntasks"), ("SLURM_NNODES", "nodes"),
              ("SLURM_CPUS_PER_TASK", "cpus-per-task"), ("SLURM_NTASKS_PER_NODE", "ntasks-per-node"),
              ("SLURM_PARTITION", "partition"), ("SLURM_ACCOUNT", "account"), ("SLURM_TIMELIMIT", "time"),
              ("SLURM_GPUS_PER_NODE", "gpus-per-node"), ("SLURM_JOB_NAME", "job-name"))


def parse_srun(argv: list[str], *, cwd: str, environ: Mapping[str, str]) -> SrunRequest:
    """srun's options (the resource options plus srun's own) and the command to run; outside an
    allocation, SRUN_INPUT's variables sit below the command line."""
    req = parse_salloc(argv, cwd=cwd, environ=environ)
    if not req.command:
        raise OptionError("no command given: usage is srun [options] command [args...]")
    if "SLURM_JOB_ID" not in environ:
        longs, _ = _TABLES[SRUN]
        ctx = _Context(cwd=os.path.normpath(cwd), environ=environ, now=0.0)
        given: dict[str, Any] = {}
        for name, option in SRUN_INPUT:
            if environ.get(name):
                try:
                    given.update(longs[option].convert(environ[name], ctx))
                except ValueError as e:
                    reason = e.reason if isinstance(e, WholeMessage) else _reason(e)
                    raise OptionError(f"invalid {name} value '{environ[name]}': {reason}") from None
        if given:
            command_line = parse_salloc(argv, cwd=cwd, environ={})  # what argv itself set
            req.options.update({k: v for k, v in given.items() if k not in command_line.options})
    return req


def parse_salloc(argv: list[str], *, cwd: str, environ: Mapping[str, str]) -> SrunRequest:
    """salloc's options (srun's table: the same resource options) and its command, which may
    be empty (salloc then runs the user's shell)."""
    ctx = _Context(cwd=os.path.normpath(cwd), environ=environ, now=0.0)
    options: dict[str, Any] = {"workdir": ctx.cwd, "environment": dict(environ)}
    found, command = _scan(argv, SRUN)
    options.update(_convert(found, ctx))
    container_request(options, environ)
    options.pop("_verbose", None)
    _gather_recorded(options)
    return SrunRequest(options=options, command=command)
