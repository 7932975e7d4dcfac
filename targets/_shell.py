"""Shell command text: `exec` of a command, then one line per flag and its values, so that a
launch script reads like the flag list it is. Tokens in `expressions` (variable references,
arithmetic) are double-quoted so the shell expands them; all others are quoted literally."""

import shlex
from collections.abc import Collection


def _quote(token: str, expressions: Collection[str]) -> str:
    return f'"{token}"' if token in expressions else shlex.quote(token)


def exec_command(command: list[str], flags: list[str],
                 expressions: Collection[str] = ()) -> str:
    lines = [" ".join(_quote(t, expressions) for t in command)]
    for token in flags:
        if token.startswith("-"):
            lines.append(_quote(token, expressions))
        else:
            lines[-1] += " " + _quote(token, expressions)
    return "exec " + " \\\n  ".join(lines)
