"""Which pods and nodes go together, with Kubernetes' matching rules: label selectors
(``matchLabels``/``matchExpressions`` and kubectl's ``-l`` text), node affinity terms, and
taints with the tolerations that let a pod onto a tainted node.

Pure and stdlib-only: the scheduler, the server and ``shoal get -l`` share these rules.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NODE_SELECTOR_OPERATORS = SELECTOR_OPERATORS + ("Gt", "Lt")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_OPERATORS = ("Equal", "Exists")

_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INTEGER = re.compile(r"[+-]?\d+")


class SelectorError(ValueError):
    """A selector, requirement, taint or toleration Kubernetes would refuse. ``field`` names
    the part at fault relative to the object checked (``values``, ``matchExpressions[0].key``),
    so a manifest validator can prefix its own path."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def label_key_error(key: str) -> str | None:
    """Why ``key`` is not a label key (``[prefix/]name``, name <= 63, prefix a DNS subdomain
    <= 253), or None when it is one. The wording is the API server's."""
    if not isinstance(key, str):
        return "must be a string"
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "prefix part must be non-empty"
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    if not _NAME.fullmatch(name):
        return ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
                "and end with an alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc')")
    if prefix:
        if len(prefix) > 253:
            return "prefix part must be no more than 253 characters"
        if not _DNS_SUBDOMAIN.fullmatch(prefix):
            return ("prefix part must be a lowercase RFC 1123 subdomain: lower case alphanumeric "
                    "characters, '-' or '.', starting and ending with an alphanumeric character "
                    "(e.g. 'example.com')")
    return None


def label_value_error(value: str) -> str | None:
    """Why ``value`` is not a label value (empty, or <= 63 of ``[-A-Za-z0-9_.]`` starting and
    ending alphanumeric), or None when it is one."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > 63:
        return "must be no more than 63 characters"
    if value and not _NAME.fullmatch(value):
        return ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
                "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue', or "
                "'my_value', or '12345')")
    return None


def check_labels(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(``[key]``, message) for every bad key or value of a label map."""
    problems = []
    for key, value in labels.items():
        why = label_key_error(key)
        if why is None:
            why = label_value_error(value)
        if why is not None:
            problems.append((f"[{key}]", why))
    return problems


@dataclass(frozen=True)
class Requirement:
    """One ``key operator values`` test. Values are kept sorted and unique, as Kubernetes
    keeps them, so equal requirements compare equal however they were written."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        why = label_key_error(self.key)
        if why is not None:
            raise SelectorError("key", f"Invalid value: {_q(self.key)}: {why}")
        if self.operator not in NODE_SELECTOR_OPERATORS:
            raise SelectorError("operator", _unsupported(self.operator, NODE_SELECTOR_OPERATORS))
        values = tuple(sorted(set(self.values)))
        object.__setattr__(self, "values", values)
        if self.operator in ("In", "NotIn") and not values:
            raise SelectorError("values", "Required value: must be specified when `operator` is 'In' or 'NotIn'")
        if self.operator in ("Exists", "DoesNotExist") and values:
            raise SelectorError("values", "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
        if self.operator in ("Gt", "Lt"):
            if len(values) != 1:
                raise SelectorError("values", "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'")
            if not _INTEGER.fullmatch(values[0]):
                raise SelectorError("values[0]", f"Invalid value: {_q(values[0])}: must be an integer")

    @classmethod
    def from_dict(cls, expression: Mapping) -> Requirement:
        """A ``{key, operator, values}`` entry of ``matchExpressions``."""
        return cls(expression.get("key", ""), expression.get("operator", ""),
                   tuple(expression.get("values") or ()))

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        op = self.operator
        if op == "In":
            return present and labels[self.key] in self.values
        if op == "NotIn":
            return not present or labels[self.key] not in self.values
        if op == "Exists":
            return present
        if op == "DoesNotExist":
            return not present
        if not present or not _INTEGER.fullmatch(labels[self.key]):
            return False  # Gt/Lt: a label that is not an integer never matches
        have, limit = int(labels[self.key]), int(self.values[0])
        return have > limit if op == "Gt" else have < limit

    def __str__(self) -> str:
        op, values = self.operator, self.values
        if op == "Exists":
            return self.key
        if op == "DoesNotExist":
            return f"!{self.key}"
        if op in ("Gt", "Lt"):
            return f"{self.key}{'>' if op == 'Gt' else '<'}{values[0]}"
        if len(values) == 1:
            return f"{self.key}{'=' if op == 'In' else '!='}{values[0]}"
        return f"{self.key} {op.lower()} ({','.join(values)})"


@dataclass(frozen=True)
class LabelSelector:
    """All requirements must hold; an empty selector matches everything (as ``{}`` does in
    Kubernetes: whether a missing selector selects nothing is the caller's call)."""

    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def from_dict(cls, selector: Mapping) -> LabelSelector:
        """A Kubernetes ``LabelSelector`` (``matchLabels`` and ``matchExpressions``)."""
        if not isinstance(selector, Mapping):
            raise SelectorError("", "must be a mapping with matchLabels and/or matchExpressions")
        reqs = []
        for key, value in (selector.get("matchLabels") or {}).items():
            why = label_key_error(key) or label_value_error(value)
            if why is not None:
                raise SelectorError(f"matchLabels[{key}]", why)
            reqs.append(Requirement(key, "In", (value,)))
        for i, expr in enumerate(selector.get("matchExpressions") or ()):
            try:
                req = Requirement.from_dict(expr)
            except SelectorError as e:
                raise SelectorError(f"matchExpressions[{i}].{e.field}", e.message) from None
            if req.operator not in SELECTOR_OPERATORS:
                raise SelectorError(f"matchExpressions[{i}].operator", _unsupported(req.operator, SELECTOR_OPERATORS))
            reqs.append(req)
        return cls(tuple(reqs))

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> LabelSelector:
        """Equality on every pair: a Service's ``selector`` or a pod's ``nodeSelector``."""
        return cls(tuple(Requirement(k, "In", (v,)) for k, v in labels.items()))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


# -- kubectl's -l text: app=vllm,tier!=x,env in (a,b),!foo,bar,gen>3 ------------------------

_TOKEN = re.compile(r"\s*(?:(?P<op>==|!=|=|!|>|<|\(|\)|,)|(?P<word>[^\s,()=!<>]+))")


def parse_selector_text(text: str) -> LabelSelector:
    """A selector as ``kubectl get -l`` takes it; ``""`` selects everything."""
    tokens = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def take() -> tuple[str, str]:
        nonlocal i
        if i >= len(tokens):
            raise _text_error(text, "unexpected end")
        i += 1
        return tokens[i - 1]

    def peek() -> tuple[str, str] | None:
        return tokens[i] if i < len(tokens) else None

    while tokens:
        kind, tok = take()
        if (kind, tok) == ("op", "!"):
            kind, key = take()
            if kind != "word":
                raise _text_error(text, f"expected a label key after '!', found {key!r}")
            reqs.append(_requirement(text, key, "DoesNotExist", ()))
        elif kind != "word":
            raise _text_error(text, f"expected a label key, found {tok!r}")
        else:
            key, nxt = tok, peek()
            if nxt is None or nxt == ("op", ","):
                reqs.append(_requirement(text, key, "Exists", ()))
            elif nxt[0] == "word" and nxt[1] in ("in", "notin"):
                take()
                if take() != ("op", "("):
                    raise _text_error(text, f"expected '(' after {nxt[1]!r}")
                values: list[str] = []
                while True:
                    kind, tok = take()
                    if (kind, tok) == ("op", ")") and not values:
                        break
                    if kind != "word":
                        raise _text_error(text, f"expected a value, found {tok!r}")
                    values.append(tok)
                    kind, tok = take()
                    if (kind, tok) == ("op", ")"):
                        break
                    if (kind, tok) != ("op", ","):
                        raise _text_error(text, f"expected ',' or ')', found {tok!r}")
                if not values:
                    raise _text_error(text, f"for '{nxt[1]}', the set of values can't be empty")
                reqs.append(_requirement(text, key, "In" if nxt[1] == "in" else "NotIn", tuple(values)))
            elif nxt[0] == "op" and nxt[1] in ("=", "==", "!=", ">", "<"):
                take()
                after = peek()
                value = ""
                if after is not None and after[0] == "word":
                    value = take()[1]
                elif nxt[1] in (">", "<"):
                    raise _text_error(text, f"expected an integer after {nxt[1]!r}")
                op = {"=": "In", "==": "In", "!=": "NotIn", ">": "Gt", "<": "Lt"}[nxt[1]]
                reqs.append(_requirement(text, key, op, (value,)))
            else:
                raise _text_error(text, f"expected an operator after {key!r}, found {nxt[1]!r}")
        nxt = peek()
        if nxt is None:
            break
        if take() != ("op", ","):
            raise _text_error(text, f"expected ',' between requirements, found {nxt[1]!r}")
        if peek() is None:
            raise _text_error(text, "a requirement must follow ','")
    return LabelSelector(tuple(reqs))


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:  # pragma: no cover - every character is an operator, a word char or space
            raise _text_error(text, f"unexpected character {text[pos]!r}")
        out.append(("op", m.group("op")) if m.group("op") else ("word", m.group("word")))
        pos = m.end()
    return out


def _requirement(text: str, key: str, op: str, values: tuple[str, ...]) -> Requirement:
    why = label_key_error(key)
    if why is not None:
        raise _text_error(text, f"invalid label key {key!r}: {why}")
    for v in values if op not in ("Gt", "Lt") else ():  # Gt/Lt take an integer, checked by Requirement
        why = label_value_error(v)
        if why is not None:
            raise _text_error(text, f"invalid label value {v!r}: {why}")
    try:
        return Requirement(key, op, values)
    except SelectorError as e:
        raise _text_error(text, e.message) from None


def _text_error(text: str, why: str) -> SelectorError:
    return SelectorError("", f"invalid selector {text!r}: {why} (expected e.g. app=vllm,tier!=x,env in (a,b),!foo)")


# -- node affinity ---------------------------------------------------------------------------

def node_selector_term_matches(term: Mapping, labels: Mapping[str, str], node_name: str | None = None) -> bool:
    """A ``NodeSelectorTerm``: its ``matchExpressions`` (on labels) and ``matchFields`` (on
    ``metadata.name``) all hold. An empty term matches no node, as in Kubernetes."""
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False
    field_values = {"metadata.name": node_name} if node_name is not None else {}
    try:
        return (all(Requirement.from_dict(e).matches(labels) for e in exprs)
                and all(Requirement.from_dict(f).matches(field_values) for f in fields))
    except SelectorError:
        return False  # a term that does not parse matches nothing (the API server refuses it anyway)


def node_affinity_matches(affinity: Mapping | None, labels: Mapping[str, str], node_name: str | None = None) -> bool:
    """Whether a node meets a pod's ``affinity.nodeAffinity.requiredDuringScheduling…``: terms
    are ORed, the expressions inside a term ANDed. No required affinity: every node does."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return any(node_selector_term_matches(t, labels, node_name) for t in required.get("nodeSelectorTerms") or ())


def preferred_score(affinity: Mapping | None, labels: Mapping[str, str], node_name: str | None = None) -> int:
    """The sum of the weights of the pod's ``preferredDuringScheduling…`` node terms this node
    matches (kube-scheduler's NodeAffinity score before normalising)."""
    preferred = ((affinity or {}).get("nodeAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution")
    return sum(int(p.get("weight", 0)) for p in preferred or ()
               if node_selector_term_matches(p.get("preference") or {}, labels, node_name))


# -- taints and tolerations ------------------------------------------------------------------

@dataclass(frozen=True)
class Taint:
    """``key[=value]:effect`` on a node: pods that do not tolerate it are kept off
    (NoSchedule), avoided (PreferNoSchedule) or also evicted (NoExecute)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __post_init__(self) -> None:
        why = label_key_error(self.key)
        if why is not None:
            raise SelectorError("key", f"Invalid value: {_q(self.key)}: {why}")
        why = label_value_error(self.value)
        if why is not None:
            raise SelectorError("value", f"Invalid value: {_q(self.value)}: {why}")
        if self.effect not in TAINT_EFFECTS:
            raise SelectorError("effect", _unsupported(self.effect, TAINT_EFFECTS))

    @classmethod
    def from_dict(cls, taint: Mapping) -> Taint:
        return cls(taint.get("key", ""), taint.get("value") or "", taint.get("effect", ""))

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, **({"value": self.value} if self.value else {}), "effect": self.effect}

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    """A pod's leave to ignore matching taints. An empty key with ``Exists`` tolerates every
    taint; an empty effect matches every effect. ``toleration_seconds`` bounds how long a
    NoExecute taint is tolerated before the pod is evicted (None: for ever)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    def __post_init__(self) -> None:
        if self.operator not in TOLERATION_OPERATORS:
            raise SelectorError("operator", _unsupported(self.operator, TOLERATION_OPERATORS))
        if self.key:
            why = label_key_error(self.key)
            if why is not None:
                raise SelectorError("key", f"Invalid value: {_q(self.key)}: {why}")
        elif self.operator != "Exists":
            raise SelectorError("operator", f"Invalid value: {_q(self.operator)}: operator must be Exists when "
                                            "`key` is empty, which means \"match all values and all keys\"")
        if self.operator == "Exists" and self.value:
            raise SelectorError("operator", f"Invalid value: {_q(self.operator)}: value must be empty when "
                                            "`operator` is 'Exists'")
        why = label_value_error(self.value)
        if why is not None:
            raise SelectorError("value", f"Invalid value: {_q(self.value)}: {why}")
        if self.effect and self.effect not in TAINT_EFFECTS:
            raise SelectorError("effect", _unsupported(self.effect, TAINT_EFFECTS))
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise SelectorError("effect", f"Invalid value: {_q(self.effect)}: effect must be 'NoExecute' when "
                                          "`tolerationSeconds` is set")

    @classmethod
    def from_dict(cls, toleration: Mapping) -> Toleration:
        """A pod spec's ``tolerations`` entry (``operator`` defaults to Equal)."""
        return cls(toleration.get("key") or "", toleration.get("operator") or "Equal",
                   toleration.get("value") or "", toleration.get("effect") or "",
                   toleration.get("tolerationSeconds"))

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


TaintLike = Taint | Mapping | tuple
TolerationLike = Toleration | Mapping


def as_taint(taint: TaintLike) -> Taint:
    """A Taint from a Taint, a ``{key, value, effect}`` dict or a ``(key, value, effect)`` tuple."""
    if isinstance(taint, Taint):
        return taint
    if isinstance(taint, Mapping):
        return Taint.from_dict(taint)
    return Taint(*taint)


def as_toleration(toleration: TolerationLike) -> Toleration:
    return toleration if isinstance(toleration, Toleration) else Toleration.from_dict(toleration)


def tolerates(tolerations: Iterable[TolerationLike], taint: TaintLike) -> bool:
    """Whether any of a pod's tolerations tolerates ``taint``."""
    t = as_taint(taint)
    return any(as_toleration(tol).tolerates(t) for tol in tolerations)


def untolerated(taints: Iterable[TaintLike], tolerations: Iterable[TolerationLike],
                effects: Iterable[str] = ("NoSchedule", "NoExecute")) -> list[Taint]:
    """The taints with one of ``effects`` that no toleration tolerates: a node with any of
    the default two is no place for the pod (kube-scheduler's TaintToleration filter)."""
    tols = [as_toleration(t) for t in tolerations]
    wanted = set(effects)
    out = []
    for taint in taints:
        t = as_taint(taint)
        if t.effect in wanted and not any(tol.tolerates(t) for tol in tols):
            out.append(t)
    return out


def eviction_delay(taints: Iterable[TaintLike], tolerations: Iterable[TolerationLike]) -> int | None:
    """How long a pod may stay on a node with these taints, as the NoExecute taint manager
    reckons it: 0 when a NoExecute taint is not tolerated, the least ``tolerationSeconds`` of
    the tolerations used otherwise, None when they are tolerated for ever (or there are none)."""
    tols = [as_toleration(t) for t in tolerations]
    delay: int | None = None
    for taint in taints:
        t = as_taint(taint)
        if t.effect != "NoExecute":
            continue
        used = [tol for tol in tols if tol.tolerates(t)]
        if not used:
            return 0
        for tol in used:
            if tol.toleration_seconds is not None:
                secs = max(0, tol.toleration_seconds)
                delay = secs if delay is None else min(delay, secs)
    return delay


@dataclass(frozen=True)
class TaintChange:
    """One ``shoal taint node`` argument: add ``key=value:effect``, or (``remove``) drop the
    key's taints, of ``effect`` only when one is given."""

    key: str
    value: str = ""
    effect: str = ""  # empty only in a removal: every effect
    remove: bool = False

    @property
    def taint(self) -> Taint:
        return Taint(self.key, self.value, self.effect)


def parse_taint(text: str) -> TaintChange:
    """``key=value:NoSchedule`` and ``key:NoExecute`` add a taint; ``key:NoSchedule-``
    removes the key's NoSchedule taint, ``key-`` all of the key's taints (kubectl's forms)."""
    spec = text.strip()
    remove = spec.endswith("-")
    if remove:
        spec = spec[:-1]
    key_value, colon, effect = spec.partition(":")
    key, _, value = key_value.partition("=")
    if not colon and not remove:
        raise SelectorError("", f"invalid taint spec {text!r}: expected key[=value]:effect with effect one of "
                                f"{', '.join(TAINT_EFFECTS)}, or key[:effect]- to remove")
    if colon and effect not in TAINT_EFFECTS:
        raise SelectorError("", f"invalid taint spec {text!r}: unsupported effect {effect!r} "
                                f"(expected {', '.join(TAINT_EFFECTS)})")
    try:
        Taint(key, value, effect or "NoSchedule")
    except SelectorError as e:
        raise SelectorError("", f"invalid taint spec {text!r}: taint {e}") from None
    return TaintChange(key, value, effect, remove)


def update_taints(current: Iterable[TaintLike], changes: Iterable[TaintChange],
                  overwrite: bool = False) -> list[Taint]:
    """A node's taints after ``kubectl taint``-style changes. An added taint replaces one
    with its key and effect only when ``overwrite`` (adding it again as it is is a no-op); a
    removal that matches nothing is an error, as in kubectl."""
    taints = [as_taint(t) for t in current]
    for change in changes:
        same = [t for t in taints if t.key == change.key and (not change.effect or t.effect == change.effect)]
        if change.remove:
            if not same:
                shown = f"{change.key}:{change.effect}" if change.effect else change.key
                raise SelectorError("", f"taint {shown!r} not found")
            taints = [t for t in taints if t not in same]
            continue
        taint = change.taint
        if same and not overwrite and any(t != taint for t in same):
            raise SelectorError("", f"the node already has a {taint.key!r} taint with effect {taint.effect}, "
                                    "and --overwrite is false")
        if same:
            at = taints.index(same[0])
            taints = [t for t in taints[:at] if t not in same] + [taint] + [t for t in taints[at:] if t not in same]
        else:
            taints.append(taint)
    return taints


def _q(value: object) -> str:
    """A value as the API server quotes it in messages: strings in double quotes."""
    return json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else repr(value)


def _unsupported(value: object, supported: Iterable[str]) -> str:
    return f"Unsupported value: {_q(value)}: supported values: " + ", ".join(f'"{s}"' for s in supported)
