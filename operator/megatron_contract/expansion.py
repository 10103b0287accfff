"""`$(VAR)` in a command and its arguments, expanded as Kubernetes expands a container's (stdlib).

The same rules as Kubernetes' `third_party/forked/golang/expansion`: `$(NAME)` becomes the
variable's value when it is set, and stays `$(NAME)` as written when it is not; `$$` is a literal
`$` (so `$$(NAME)` is the text `$(NAME)`); a `$` before anything else, or an unclosed `$(`, is
kept. Nothing else is interpreted: no shell, no `${NAME}`, no defaults. The launcher expands
spec.trainer.command and args with each rank's own env (RANK, LOCAL_RANK, … beside the pod's),
which Kubernetes cannot do: it only knows the container's env.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 == n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":  # an escaped operator
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:  # an unclosed reference is kept as written
                out.append("$(")
                i += 2
                continue
            name = text[i + 2 : close]
            out.append(env.get(name, f"$({name})"))
            i = close + 1
        else:  # `$` before anything else is kept, with that character
            out.append(ch + nxt)
            i += 2
    return "".join(out)


def expand_all(items: tuple[str, ...] | list[str], env: Mapping[str, str]) -> list[str]:
    return [expand(item, env) for item in items]
